"""The streaming bundle-size sweep (`benchmarks.sweep`) runs and writes its report.

Timings are never asserted: only that every planned run has its row, that latencies were
measured, and that the report files exist.
"""

from __future__ import annotations

import csv
import itertools
import os
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from benchmarks import micro, sweep
from benchmarks.nexmark.config import NexmarkConfig

GBK = list(micro.CASES)[2]


def test_stamped_source_emits_every_element_once_in_event_time_order():
    n, splits = 300, 3

    def check(elements):
        assert sorted(i for i, _, _ in elements) == list(range(n))
        for part in range(splits):
            first, stop = sweep.part_bounds(n, splits, part)
            stamps = [ts for i, _, ts in sorted(elements) if first <= i < stop]
            assert stamps == sorted(stamps)
        # Timestamped with the creation time (to the microsecond).
        assert all(abs(created * 1e6 - ts) <= 1 for _, created, ts in elements)

    for rate in (None, 20_000.0):
        with beam.Pipeline('DirectRunner', options=PipelineOptions(sweep.DIRECT_ARGS)) as p:
            stamped = sweep.stamped_stream(p, n, rate, splits)
            assert_that(stamped | beam.Map(lambda kv: kv[0]) | beam.Distinct(),
                        equal_to(list(range(micro.KEYS))), label='keys')
            assert_that(stamped | beam.Map(lambda kv, ts=beam.DoFn.TimestampParam:
                                           (*kv[1], ts.micros)),
                        check, label='elements')


def test_part_bounds_cover_all_elements():
    for n, parts in ((10, 3), (3, 4), (1000, 7)):
        bounds = [sweep.part_bounds(n, parts, k) for k in range(parts)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


def test_parse_rates():
    assert sweep.parse_rates('max,5000') == [None, 5000.0]


def test_summary_ratio_of_bundle_10_to_1000():
    def row(size, eps, runner=sweep.SPARK):
        r = sweep._row('c', runner, None, size, 100, 1000)
        r['elements_per_s'] = eps
        return r

    rows = [row(10, 600), row(1000, 1000), row(None, 2000, sweep.DIRECT)]
    rows[-1].update(bundle_time_ms='', target_latency_ms='')
    (summary,) = sweep.summary_rows(rows)
    assert summary['throughput at bundle 10 / at bundle 1000'] == 0.6
    assert summary['goal (>= 0.5)'] == 'yes'
    assert summary['DirectRunner elements_per_s'] == 2000


def test_nexmark_latency_is_sink_time_minus_the_output_timestamp():
    now = time.time()
    ts = Timestamp.of(now - 2.0)
    latency, after_end, created, end = sweep.nexmark_latency_lines(
        'x', ts, window.GlobalWindow())[0].split('\t')
    assert 2.0 <= float(latency) < 3.0 and after_end == latency and end == ''
    assert float(created) == ts.micros / 1e6
    # A windowed output: after its window's end (the later of the end and its time).
    ended = window.IntervalWindow(Timestamp.of(now - 5.0), Timestamp.of(now - 1.0))
    latency, after_end, _, end = sweep.nexmark_latency_lines('x', ts, ended)[0].split('\t')
    assert 1.0 <= float(after_end) < 2.0 <= float(latency)
    assert float(end) == pytest.approx(now - 1.0, abs=1e-5)
    # Stamped at the global window's end: no event time, no line.
    glob = window.GlobalWindow()
    assert sweep.nexmark_latency_lines('x', glob.max_timestamp(), glob) == []
    in_millis = Timestamp(micros=glob.max_timestamp().micros // 1000 * 1000)  # as decoded
    assert sweep.nexmark_latency_lines('x', in_millis, glob) == []


def test_nexmark_latency_config_paces_events_at_their_event_times():
    before = time.time()
    config = sweep.nexmark_latency_config(NexmarkConfig(num_events=100), 2000)
    assert config.use_wallclock_event_time
    assert config.first_event_rate == config.next_event_rate == 2000
    assert before + sweep.NEXMARK_START_S - 0.001 <= config.base_time / 1000 <= time.time() + 5
    assert (config.window_size_sec, config.window_period_sec) == (2, 1)


def test_tiny_streaming_sweep_writes_report(tmp_path, spark_session, spark_args):
    # 2000 elements at 1000/s: a 2 s stream, so some sliding windows end (and are fired by
    # the watermark) before the stream does, and the GroupByKey case has latency samples.
    rows = micro.main(['--streaming', '--elements=2000', '--nexmark_events=500',
                       '--bundle_sizes=100,1000', '--bundle_times_ms=100', '--rates=1000',
                       f'--cases=1 ParDo,{GBK}', '--queries=0',
                       '--runners=StreamsSparkRunner,DirectRunner', f'--out={tmp_path}',
                       *spark_args])
    spark = [(r['case'], r['bundle_size']) for r in rows if r['runner'] == sweep.SPARK]
    assert spark == [('1 ParDo', 100), ('1 ParDo', 1000), (GBK, 100), (GBK, 1000),
                     ('NEXMark Q0', 100), ('NEXMark Q0', 1000)]
    assert [r['case'] for r in rows if r['runner'] == sweep.DIRECT] == [
        '1 ParDo', GBK, 'NEXMark Q0']
    assert all(r['status'] == 'ok' and r['elements_per_s'] != '' for r in rows)
    for r in rows:
        # NEXMark at a fixed rate too: each output's sink time minus its event time.
        assert r['latency_p50_s'] > 0 and r['latency_p99_s'] >= r['latency_p50_s']
        assert r['after_window_end_p99_s'] != ''
    assert all(r['epochs'] for r in rows if r['runner'] == sweep.SPARK)
    for name in ('sweep.md', 'sweep.csv', 'sweep_summary.csv', 'sweep_throughput.png',
                 'sweep_latency.png', 'sweep_latency_vs_epoch.png'):
        assert os.path.getsize(tmp_path / name) > 0
    with open(tmp_path / 'sweep.csv', encoding='utf-8') as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    with open(tmp_path / 'sweep_summary.csv', encoding='utf-8') as f:
        assert [r['case'] for r in csv.DictReader(f)] == ['1 ParDo', GBK, 'NEXMark Q0']
