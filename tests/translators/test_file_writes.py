"""File sinks written a batch at a time (`translators.file_writes`).

Checked here:

* `write_records` writes the bytes Beam's writer writes record by record (hypothesis:
  random text records, with and without trailing newlines, header and footer,
  compressed or not, and a sink of another format);
* the plan: `WriteToText`'s bundle writer is swapped, not one with per-shard limits,
  nor any with `--no_stateless_chains`;
* pipelines on Spark with and without the swap write the same records (text in several
  forms, a format of the user's), and a sink whose writing fails names its step.
"""

from __future__ import annotations

import collections
import glob
import os
import uuid

import apache_beam as beam
import pytest
from apache_beam.io import filebasedsink, filesystem
from apache_beam.io.textio import WriteToText, _TextSink
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.transforms import environments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.driver.plan import build_plan
from beam_streams_runner.translators.file_writes import is_batch_file_write, write_records

pytestmark = pytest.mark.timeout(300)


# 1. The records' bytes -------------------------------------------------------------------
def _written(sink, records: list, batched: bool, directory: str) -> bytes:
    writer = sink.open_writer(directory, str(uuid.uuid4()))
    if batched:
        half = len(records) // 2  # two batches, as a chain hands them on
        write_records(writer, records[:half])
        write_records(writer, records[half:])
    else:
        for record in records:
            writer.write(record)
    path = writer.close()
    with filesystem.CompressedFile(open(path, 'rb'), sink.compression_type) if (
            sink.compression_type == filesystem.CompressionTypes.GZIP) else open(path, 'rb') as f:
        return f.read()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.text(max_size=8), max_size=40),
       newlines=st.booleans(), header=st.sampled_from([None, 'h1\nh2']),
       footer=st.sampled_from([None, 'f']),
       compression=st.sampled_from([filesystem.CompressionTypes.UNCOMPRESSED,
                                    filesystem.CompressionTypes.GZIP]))
def test_a_text_sinks_batches_write_beams_bytes(tmp_path, records, newlines, header, footer,
                                                compression):
    sink = _TextSink(str(tmp_path / 'out'), append_trailing_newlines=newlines, header=header,
                     footer=footer, compression_type=compression)
    directory = str(tmp_path)
    assert _written(sink, records, True, directory) == _written(sink, records, False, directory)


class _LengthPrefixedSink(filebasedsink.FileBasedSink):
    """A file format of the user's: each record its length, a colon and its bytes."""

    def __init__(self, path: str) -> None:
        super().__init__(path, coder=beam.coders.BytesCoder(), file_name_suffix='.lp')

    def write_encoded_record(self, file_handle, encoded_value: bytes) -> None:
        file_handle.write(b'%d:' % len(encoded_value) + encoded_value)


def _length_prefixed(path: str) -> list[bytes]:
    with open(path, 'rb') as f:
        data = f.read()
    records = []
    while data:
        size, _, data = data.partition(b':')
        records.append(data[:int(size)])
        data = data[int(size):]
    return records


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.binary(max_size=8), max_size=30))
def test_another_formats_batches_write_beams_bytes(tmp_path, records):
    sink = _LengthPrefixedSink(str(tmp_path / 'out'))
    directory = str(tmp_path)
    assert _written(sink, records, True, directory) == _written(sink, records, False, directory)


# 2. The plan -----------------------------------------------------------------------------
def _write_steps(build, chains: bool = True) -> list[bool]:
    """Per "WriteBundles" step of the plan of `Create | build`: whether it is swapped."""
    p = beam.Pipeline()
    build(p | beam.Create(['a', 'b']))
    p.visit(group_by_key_input_visitor(False))
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    plan = build_plan(proto, stateless_chains=chains)
    try:
        return [is_batch_file_write(t) for s in plan.stages if s.descriptor is not None
                for t in beam_fn_api_pb2.ProcessBundleDescriptor.FromString(
                    s.descriptor).transforms.values()
                if t.unique_name.endswith('WriteBundles')]
    finally:
        plan.close()


def test_write_to_texts_bundle_writer_is_swapped(tmp_path):
    prefix = str(tmp_path / 'out')
    assert _write_steps(lambda pcoll: pcoll | WriteToText(prefix)) == [True]
    assert _write_steps(lambda pcoll: pcoll | WriteToText(prefix), chains=False) == [False]
    assert _write_steps(lambda pcoll: pcoll | WriteToText(
        prefix, max_records_per_shard=10)) == [False]


# 3. On Spark --------------------------------------------------------------------------------
_SINKS = {
    'text': (lambda prefix: WriteToText(prefix), None),
    'no-newlines': (lambda prefix: WriteToText(prefix, append_trailing_newlines=False,
                                               header='H', footer='F'), None),
    'gzip': (lambda prefix: WriteToText(prefix, file_name_suffix='.gz'), None),
    'length-prefixed': (lambda prefix: beam.Map(str.encode)
                        | beam.io.Write(_LengthPrefixedSink(prefix)), _length_prefixed),
}


@pytest.mark.parametrize('sink', sorted(_SINKS))
def test_pipelines_write_the_same_records_either_way(tmp_path, spark_session, spark_args, sink):
    make, read = _SINKS[sink]
    records = [f'r{i} {"x" * (i % 7)};' for i in range(5000)]  # one ';' each
    found = {}
    for label, extra in (('batched', []), ('records', ['--no_stateless_chains'])):
        prefix = str(tmp_path / label / 'out')
        with beam.Pipeline(runner=StreamsSparkRunner(),
                           options=PipelineOptions([*spark_args, *extra])) as p:
            _ = p | beam.Create(records) | beam.Map(lambda r: r.upper()) | make(prefix)
        files = sorted(glob.glob(prefix + '*'))
        assert files and not any(os.path.basename(f).startswith('beam-temp') for f in files)
        if read is not None:
            found[label] = collections.Counter(r for f in files for r in read(f))
        else:
            found[label] = collections.Counter(
                line for f in files
                for line in (filesystem.CompressedFile(open(f, 'rb')).read()
                             if f.endswith('.gz') else open(f, 'rb').read()).splitlines())
    assert found['batched'] == found['records']
    # Every record once (without newlines a file's records are one line).
    assert sum(line.count(b';') * n for line, n in found['batched'].items()) == len(records)


class _FailingSink(_TextSink):
    def write_record(self, file_handle, value):
        raise ValueError('disk full on purpose')


def test_a_failing_sink_names_its_step(tmp_path, spark_session, spark_args):
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(spark_args))
    _ = (p | beam.Create(['a', 'b']) | beam.Map(str.upper)
         | 'Sink' >> beam.io.Write(_FailingSink(str(tmp_path / 'out'))))
    with pytest.raises(Exception, match='disk full on purpose') as raised:
        p.run().wait_until_finish()
    assert 'Sink/WriteImpl/WriteBundles' in str(raised.value)
