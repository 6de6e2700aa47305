"""Streaming progress records (`progress`, `result.progress()`)."""

from __future__ import annotations

import glob
import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing import test_stream
from apache_beam.transforms import environments, window
from apache_beam.utils.timestamp import Timestamp

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.driver.progress import (
    PROGRESS_KEPT,
    EpochProgress,
    find_endpoints,
    summary,
)
from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.worker.epoch_info import PartitionReport
from tests.conftest import WriteLines

pytestmark = pytest.mark.timeout(600)

KEYS = {'epoch', 'timestamp', 'duration_ms', 'read_ms', 'read_budget_ms', 'sources', 'sinks',
        'watermark', 'keyed_states', 'timers', 'state_bytes_written', 'state_loads',
        'state_load_ms', 'hosts'}


class _Tee(beam.PTransform):
    """A composite that writes its input aside and passes it on: not a sink itself."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self._directory = directory

    def expand(self, pcoll):
        _ = pcoll | 'Aside' >> beam.ParDo(WriteLines(self._directory))
        return pcoll | 'Pass' >> beam.Map(lambda x: x)


def test_sources_and_sinks_are_the_outermost_ends_of_the_pipeline(tmp_path):
    p = beam.Pipeline()
    words = p | 'Words' >> beam.Create(['a', 'b'])
    sizes = p | 'Sizes' >> beam.Create([1])
    teed = (words | 'Pair' >> beam.Map(lambda w, n: (w, n), beam.pvalue.AsSingleton(sizes))
            | 'Tee' >> _Tee(str(tmp_path)))
    _ = teed | 'Print' >> beam.Map(print)
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    endpoints = find_endpoints(proto)
    assert set(endpoints.sources) == {'Words', 'Sizes'}
    # 'Pair' reads 'Sizes' only as a side input; the composite 'Tee' passes its input
    # on, so the sink inside it counts, not 'Tee'.
    assert set(endpoints.sinks) == {'Tee/Aside', 'Print'}
    outputs = {t.unique_name: list(t.outputs.values())
               for t in proto.components.transforms.values()}
    assert list(endpoints.sources['Words']) == outputs['Words']
    assert list(endpoints.sinks['Print']) == outputs['Tee/Pass']


def _report(elements: dict[str, int], sizes=None, input_watermark=MAX_WATERMARK):
    return PartitionReport(MAX_WATERMARK, [], None, sizes or {}, 0.25, input_watermark,
                           elements, 10)


class _Stage:
    def __init__(self, name: str) -> None:
        self.name = name
        self.display_name = f'Beam stage: {name}'
        self.descriptor = None


def test_records_sum_the_partitions_and_only_the_last_are_kept():
    from beam_streams_runner.driver.progress import Endpoints
    progress = EpochProgress([_Stage('s0'), _Stage('s1')],
                             Endpoints({'Read': ('pc-in',)}, {'Write': ('pc-out',)}))
    watermark = Timestamp.of(1_000).micros
    for epoch in range(PROGRESS_KEPT + 30):
        reports = {
            ('s0', 0): _report({'pc-in': 3}, {('Count', 'keyed_states'): 2,
                                              ('Count', 'timers'): 1}),
            ('s0', 1): _report({'pc-in': 4}, {('Count', 'keyed_states'): 5}),
            ('s1', 0): _report({'pc-out': 2}, input_watermark=watermark),
        }
        record = progress.add(epoch, 1_000.0 + epoch, 0.5, reports, read_budget_ms=250)
    records = progress.records()
    assert len(records) == PROGRESS_KEPT
    assert [r['epoch'] for r in records] == list(range(30, PROGRESS_KEPT + 30))
    assert records[-1] == record and set(record) == KEYS
    assert record['sources'] == {'Read': {'elements': 7, 'input_rate_per_s': 7.0,
                                          'processed_rate_per_s': 14.0}}
    assert record['sinks'] == {'Write': {'elements': 2}}
    assert (record['keyed_states'], record['timers'], record['state_bytes_written']) == (7, 1, 30)
    assert record['duration_ms'] == 500 and record['read_ms'] == 250
    assert record['watermark']['stage'] == 'Beam stage: s1'
    assert record['watermark']['input_watermark'] == '1970-01-01T00:16:40Z'
    records[-1]['epoch'] = -1  # a copy: the kept record does not change
    assert progress.records()[-1]['epoch'] == PROGRESS_KEPT + 29
    line = summary(record)
    assert line.startswith(f'epoch {PROGRESS_KEPT + 29}: 500 ms (read 250 ms); read Read 7 ')
    assert progress.job_description(PROGRESS_KEPT + 30) == (
        f'Beam streaming epoch {PROGRESS_KEPT + 30} | after {line}')


def test_state_loads_from_the_store_and_hosts_are_reported():
    """Tasks away from their partition's live state load it from the store: the line
    says how many, and which hosts an epoch's tasks ran on when there were several."""
    progress = EpochProgress([_Stage('s0')], None)
    reports = {('s0', 0): _report({})._replace(host='127.0.0.2', state_loads={'hit': 2}),
               ('s0', 1): _report({})._replace(host='127.0.0.3',
                                               state_loads={'catch-up': 1, 'snapshot': 1})}
    record = progress.add(3, 1_000.0, 0.5, reports, read_budget_ms=250)
    assert record['state_loads'] == {'hit': 2, 'catch-up': 1, 'snapshot': 1}
    assert record['hosts'] == ['127.0.0.2', '127.0.0.3']
    assert summary(record).endswith(
        '; 2 of 4 state loads from the store (1 whole); on hosts 127.0.0.2, 127.0.0.3')
    one_host = {k: r._replace(host='vm', state_loads={'hit': 1}) for k, r in reports.items()}
    line = summary(progress.add(4, 1_001.0, 0.5, one_host, read_budget_ms=250))
    assert 'state loads' not in line and 'on hosts' not in line


def test_progress_of_a_streaming_run(tmp_path, spark_session):
    """Every epoch of a real run leaves a record; the source's counts add up to what
    it emitted, the sink's to what it wrote. (A TestStream plays one event an epoch,
    so the run has an epoch per event however fast the machine is.)"""
    out = tmp_path / 'out'
    out.mkdir()
    stream = test_stream.TestStream()
    for second in range(4):
        stream = stream.add_elements([
            window.TimestampedValue((f'k{i % 3}', 1), second + i / 10) for i in range(10)
        ]).advance_watermark_to(second + 1)
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions([
        '--spark_master=local[2]', '--streaming']))
    _ = (p | 'Events' >> stream.advance_watermark_to_infinity()
         | beam.WindowInto(window.FixedWindows(1))
         | 'Count' >> beam.CombinePerKey(sum)
         | 'Write' >> beam.ParDo(WriteLines(str(out))))
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    records = result.progress()
    written = [line for path in glob.glob(os.path.join(out, '*'))
               for line in open(path, encoding='utf-8').read().splitlines()]
    assert written
    assert 8 <= len(records) <= PROGRESS_KEPT  # an epoch per event
    assert [r['epoch'] for r in records] == list(range(len(records)))
    for record in records:
        assert set(record) == KEYS
        assert set(record['sources']) == {'Events'} and set(record['sinks']) == {'Write'}
        assert set(record['watermark']) == {'stage', 'input_watermark', 'lag_ms'}
        assert record['duration_ms'] >= record['read_ms'] >= 0
    assert [r['sources']['Events']['elements'] for r in records[:8]] == [10, 0] * 4
    assert sum(r['sources']['Events']['elements'] for r in records) == 40
    assert sum(r['sinks']['Write']['elements'] for r in records) == len(written)
    assert any(r['state_bytes_written'] > 0 for r in records)
    assert any(r['watermark']['input_watermark'] is not None for r in records)
    # The epochs' Spark jobs carry the summary of the epoch before them.
    jobs = spark_session.sparkContext._jsc.sc().statusStore().jobsList(None)  # a Scala Seq
    descriptions = [jobs.apply(i).description().get() for i in range(jobs.size())
                    if jobs.apply(i).description().isDefined()]
    assert f'Beam streaming epoch 1 | after {summary(records[0])}' in descriptions


def test_a_batch_run_has_no_progress_records(spark_session):
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]']))
    _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.progress() == []


class _SplitSmall(beam.DoFn):
    def process(self, n):
        if n < 3:
            yield beam.pvalue.TaggedOutput('small', n)
        else:
            yield n


def test_sinks_reading_the_outputs_of_one_multi_output_step(tmp_path, spark_session):
    """Each tagged output of a step is counted on its own receiver."""
    stream = (test_stream.TestStream()
              .add_elements([window.TimestampedValue(n, n) for n in range(7)])
              .add_elements([window.TimestampedValue(n, n) for n in range(7, 10)])
              .advance_watermark_to_infinity())
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions([
        '--spark_master=local[2]', '--streaming']))
    split = p | 'Numbers' >> stream | 'Split' >> beam.ParDo(_SplitSmall()).with_outputs(
        'small', main='large')
    _ = split.small | 'Smalls' >> beam.ParDo(WriteLines(str(tmp_path)))
    _ = split.large | 'Doubles' >> beam.Map(lambda n: 2 * n)
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    records = result.progress()
    assert set(records[0]['sinks']) == {'Smalls', 'Doubles'}
    assert [r['sources']['Numbers']['elements'] for r in records[:2]] == [7, 3]
    assert sum(r['sinks']['Smalls']['elements'] for r in records) == 3
    assert sum(r['sinks']['Doubles']['elements'] for r in records) == 7
