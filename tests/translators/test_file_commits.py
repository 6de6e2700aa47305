"""A batch file sink committed by the driver (`translators.file_commits`).

Checked here:

* the plan: a batch `WriteToText` becomes its WriteBundles step and one runner step
  that commits, without InitializeWrite, PreFinalize or FinalizeWrite; a sink with a
  shard count or per-shard limits, one with a finalize of its own, and any streaming
  pipeline keep Beam's steps;
* on Spark, against the DirectRunner: the same records in every form of text sink
  (header and footer, no trailing newlines, gzip, a shard-name template), Beam's one
  empty shard for an empty input (none with `skip_if_empty`), files named
  `-SSSSS-of-NNNNN` over as many files as were written, no temporary directory left,
  and the sink's output (the final files' names) read by the next steps.
"""

from __future__ import annotations

import collections
import glob
import os
import re

import apache_beam as beam
import pytest
from apache_beam.io import filesystem
from apache_beam.io.textio import WriteToText, _TextSink
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_stream

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.runner import plan_pipeline

pytestmark = pytest.mark.timeout(300)


# 1. The plan -------------------------------------------------------------------------
def _planned(build, args: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(stage kinds, step names) of the plan of `build(p)`, planned as the runner plans."""
    p = beam.Pipeline(options=PipelineOptions(list(args)))
    build(p)
    _, plan, _ = plan_pipeline(p, p.options)
    try:
        return ([s.kind for s in plan.stages],
                [name for s in plan.stages for name in s.step_names])
    finally:
        plan.close()


def _beams_steps(steps: list[str]) -> bool:
    return any(re.search('InitializeWrite|PreFinalize|FinalizeWrite', s) for s in steps)


class _OwnFinalizeSink(_TextSink):
    def finalize_write(self, *args, **kwargs):
        return super().finalize_write(*args, **kwargs)


def test_a_batch_text_sink_is_committed_by_the_driver(tmp_path):
    kinds, steps = _planned(
        lambda p: p | beam.Create(['a']) | WriteToText(str(tmp_path / 'out')))
    assert kinds.count('commit_files') == 1
    assert not _beams_steps(steps), steps


@pytest.mark.parametrize('case', ['shards', 'records-per-shard', 'own-finalize',
                                  'streaming', 'test-stream'])
def test_other_sinks_and_streaming_keep_beams_steps(tmp_path, case):
    prefix = str(tmp_path / 'out')
    args: tuple[str, ...] = ('--streaming',) if case == 'streaming' else ()
    writes = {
        'shards': lambda pcoll: pcoll | WriteToText(prefix, num_shards=3),
        'records-per-shard': lambda pcoll: pcoll | WriteToText(
            prefix, max_records_per_shard=10),
        'own-finalize': lambda pcoll: pcoll | beam.io.Write(_OwnFinalizeSink(prefix)),
    }

    def build(p):
        if case == 'test-stream':  # a bounded branch next to one the streaming driver runs
            _ = (p | test_stream.TestStream().add_elements(['a'])
                 .advance_watermark_to_infinity() | beam.Map(str.upper))
        source = p | beam.Create(['a'])
        return writes.get(case, lambda pcoll: pcoll | WriteToText(prefix))(source)

    kinds, steps = _planned(build, args)
    assert 'commit_files' not in kinds
    assert _beams_steps(steps), steps


# 2. On Spark ---------------------------------------------------------------------------
def _run(runner, build) -> None:
    args = ['--spark_master=local[2]', '--spark_conf=spark.ui.showConsoleProgress=false']
    if runner == 'DirectRunner':
        args = []
    with beam.Pipeline(runner=StreamsSparkRunner() if runner == 'spark' else runner,
                       options=PipelineOptions(args)) as p:
        build(p)


def _files(prefix: str) -> list[str]:
    return sorted(f for f in glob.glob(prefix + '*') if os.path.isfile(f))


def _lines(path: str) -> list[bytes]:
    with open(path, 'rb') as f:
        data = filesystem.CompressedFile(f).read() if path.endswith('.gz') else f.read()
    return data.splitlines()


def _records(path: str, sink: str) -> list[bytes]:
    """A file's records (each ends with ';'): without newlines a file is one line."""
    data = b'\n'.join(_lines(path))
    if sink == 'header-footer':
        assert data.startswith(b'H') and data.endswith(b'F')
        data = data[1:-1]
    return [r for r in re.split(rb'[;\n]', data) if r]


_RECORDS = [f'r{i} {"x" * (i % 5)};' for i in range(3000)]
_SINKS = {
    'text': dict(),
    'header-footer': dict(header='H', footer='F', append_trailing_newlines=False),
    'gzip': dict(file_name_suffix='.gz'),
    'template': dict(shard_name_template='-SS-of-NN', file_name_suffix='.txt'),
}


@pytest.mark.parametrize('sink', sorted(_SINKS))
def test_the_same_records_as_the_direct_runner(tmp_path, spark_session, sink):
    found = {}
    for runner in ('DirectRunner', 'spark'):
        prefix = str(tmp_path / runner / 'out')
        _run(runner, lambda p, prefix=prefix: (
            p | beam.Create(_RECORDS) | beam.Map(str.upper)
            | WriteToText(prefix, **_SINKS[sink])))
        files = _files(prefix)
        assert files and not glob.glob(str(tmp_path / runner / 'beam-temp*'))
        found[runner] = collections.Counter(r for f in files for r in _records(f, sink))
        if sink == 'text':
            count = len(files)
            assert [os.path.basename(f) for f in files] == [
                f'out-{i:05d}-of-{count:05d}' for i in range(count)]
    assert found['spark'] == found['DirectRunner']
    assert sum(found['spark'].values()) == len(_RECORDS)


@pytest.mark.parametrize('skip_if_empty', [False, True])
def test_an_empty_input_as_the_direct_runner(tmp_path, spark_session, skip_if_empty):
    found = {}
    for runner in ('DirectRunner', 'spark'):
        prefix = str(tmp_path / runner / 'out')
        _run(runner, lambda p, prefix=prefix: (
            p | beam.Create([], reshuffle=False).with_output_types(str)
            | WriteToText(prefix, skip_if_empty=skip_if_empty)))
        found[runner] = [(os.path.basename(f), _lines(f)) for f in _files(prefix)]
    assert found['spark'] == found['DirectRunner']
    assert found['spark'] == ([] if skip_if_empty else [('out-00000-of-00001', [])])


def test_the_final_file_names_are_the_sinks_output(tmp_path, spark_session):
    prefix, names = str(tmp_path / 'out'), str(tmp_path / 'names')

    def build(p):
        written = p | beam.Create(_RECORDS) | 'Data' >> WriteToText(prefix)
        _ = written | beam.Map(os.path.basename) | 'Names' >> WriteToText(names)

    _run('spark', build)
    listed = sorted(line.decode() for f in _files(names) for line in _lines(f))
    assert listed == [os.path.basename(f) for f in _files(prefix + '-')]
    assert sorted(line.decode() for f in _files(prefix + '-') for line in _lines(f)) == \
        sorted(_RECORDS)
