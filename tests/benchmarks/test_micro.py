"""The micro benchmark runs, checks its sink and writes its report (timings are never
asserted); the shared sink check (`benchmarks.sink_check`) it and the other benchmarks
use."""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from benchmarks import micro, sink_check

GBK = list(micro.CASES)[2]


def test_micro_benchmark_writes_table_and_plot(tmp_path, spark_session, spark_args):
    rows = micro.main(['--elements=300', '--runners=StreamsSparkRunner',
                       '--bundle_sizes=50', f'--cases=1 ParDo,{GBK}',
                       f'--out={tmp_path}', *spark_args])
    assert [(r['case'], r['bundle_size']) for r in rows] == [('1 ParDo', 50), (GBK, 50)]
    assert all(r['output_ok'] == 'yes' and r['elements_per_s'] != '' for r in rows)
    assert all(r['latency_p50_s'] != '' for r in rows)
    for name in ('micro.md', 'micro.csv', 'micro.png'):
        assert os.path.getsize(tmp_path / name) > 0
    assert '| output_ok |' in (tmp_path / 'micro.md').read_text()


@pytest.mark.parametrize('runner', list(micro.DIRECT_RUNNERS))
def test_both_direct_runner_configurations_run_and_get_the_whole_output(runner):
    # The multi_processing one starts SDK worker processes over gRPC: its output must be
    # the same (every element twice, through the sliding windows).
    row = micro.run_case(GBK, runner, 200, None, [])
    assert row['runner'] == runner
    assert row['output_ok'] == 'yes', row
    assert row['elements_per_s'] != '' and row['latency_p50_s'] != ''


def test_direct_runner_stands_for_both_configurations():
    assert micro.runner_labels('StreamsSparkRunner,DirectRunner') == [
        'StreamsSparkRunner', 'DirectRunner', 'DirectRunner (2 processes)']
    assert micro.DIRECT_RUNNERS[micro.DIRECT_2][1:] == [
        '--direct_num_workers=2', '--direct_running_mode=multi_processing']
    plan = micro.plan_runs(['1 ParDo'], micro.runner_labels('StreamsSparkRunner,DirectRunner'),
                           [10, 1000])
    assert plan == [('1 ParDo', 'StreamsSparkRunner', 10), ('1 ParDo', 'StreamsSparkRunner', 1000),
                    ('1 ParDo', 'DirectRunner', None),
                    ('1 ParDo', 'DirectRunner (2 processes)', None)]
    assert micro.runner_and_args('DirectRunner (2 processes)', ['--spark_master=x']) == (
        'DirectRunner', micro.DIRECT_RUNNERS[micro.DIRECT_2])


def test_expected_tally_counts_every_window_of_every_element():
    assert micro.expected_tally('1 ParDo', 10) == sink_check.Tally(10, 45)
    assert micro.expected_tally(GBK, 10) == sink_check.Tally(20, 90)


def test_latency_line_at_a_given_time():
    w = window.IntervalWindow(Timestamp(10), Timestamp(12))
    assert micro.latency_line((0, 9.5), w, 12.25) == '2.750000\t0.250000\t9.500000\t12.000000'
    assert micro.latency_line((0, 9.5), window.GlobalWindow(), 12.0) == (
        '2.500000\t2.500000\t9.500000\t')
    assert micro.sample_lines((1, 9.5), w) == []  # not a sampled index


def test_verdict_fails_a_short_a_duplicated_and_an_empty_output():
    expected = sink_check.Tally(10, 45)
    assert sink_check.verdict(expected, sink_check.Tally(10, 45)) == 'yes'
    short = sink_check.verdict(expected, sink_check.Tally(9, 36))
    assert short == 'failed: expected 10, got 9'
    # Same count, one element lost and another duplicated: the checksum tells.
    assert sink_check.verdict(expected, sink_check.Tally(10, 46)).startswith(
        'failed: expected 10 with checksum 45, got 10 with checksum 46')
    empty = sink_check.verdict(sink_check.Tally(0, 0), sink_check.Tally())
    assert empty == 'failed: expected 0, got 0 (empty output)'
    for result in (short, empty):
        assert not sink_check.is_ok(result)
        assert sink_check.throughput(result, 10, 1.0) == ''
    assert sink_check.throughput('yes', 10, 4.0) == 2
    assert sink_check.is_ok('yes (arrival order)')


def test_lines_verdict_compares_multisets():
    assert sink_check.lines_verdict(['a', 'b'], ['b', 'a']) == 'yes'
    assert sink_check.lines_verdict(['a', 'a'], ['a', 'b']) == (
        "failed: expected 2, got 2 (1 missing, 1 unexpected; first missing ['b'], "
        "first unexpected ['a'])")
    assert sink_check.lines_verdict([], []) == 'failed: expected 0, got 0 (empty output)'


def test_counting_sink_counts_what_it_wrote(tmp_path):
    # A pipeline that loses elements before the sink: the files tell, and it fails.
    with beam.Pipeline('DirectRunner', options=PipelineOptions(['--allow_unsafe_triggers'])) as p:
        _ = (p
             | beam.Create([(i, float(i)) for i in range(200)])
             | beam.Filter(lambda e: e[0] % 50 != 7)
             | beam.ParDo(micro.sink(str(tmp_path / 'sink'))))
    written = sink_check.read_sink(str(tmp_path))
    assert written.tally == sink_check.Tally(196, sum(range(200)) - (7 + 57 + 107 + 157))
    assert len(written.lines) == len(range(0, 200, micro.SAMPLE_EVERY))
    assert sink_check.verdict(micro.expected_tally('1 ParDo', 200), written.tally) == (
        'failed: expected 200, got 196')


def test_read_sink_leaves_out_a_cut_last_line(tmp_path):
    (tmp_path / 'sink-a').write_text('x\n#tally\t2\t5\ny\n#tally\t1\t')
    written = sink_check.read_sink(str(tmp_path))
    assert written.tally == sink_check.Tally(2, 5) and written.lines == ['x', 'y']


def test_streaming_is_the_sweeps_command_not_an_option_of_micro(tmp_path, capsys):
    # micro no longer delegates to benchmarks.sweep (which imports micro): no import
    # circle, and the old spelling gets an error naming the command to use instead.
    with pytest.raises(SystemExit) as exited:
        micro.main(['--streaming', '--elements=10', f'--out={tmp_path}'])
    assert exited.value.code == 2
    assert 'python -m benchmarks.sweep' in capsys.readouterr().err
    assert not os.listdir(tmp_path)
