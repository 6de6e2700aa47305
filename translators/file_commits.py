"""A batch file sink committed by the driver once its files are written.

Design sections 5 (batch) and 9 (reuse what Beam does well). Beam's `WriteImpl` on a
bounded input (`WriteToText`, `WriteToAvro`, any `FileBasedSink`) runs four steps with
three side inputs between them: a one-element InitializeWrite whose result every
writer reads, the WriteBundles of the data, a GroupByKey of the written files to one
place, PreFinalize and FinalizeWrite. On Spark that is four jobs, three of them of one
tiny task each (half a second of a word count's four). Spark's own `saveAsTextFile`
has tasks write temporary files and the driver commit them after the job (Hadoop's
commit protocol); `commit_batch_file_writes` does the same with the sink's own code:

* the temporary directory is named at plan time, as the sink's `_create_temp_dir`
  names it, and made by the first writer that needs it;
* WriteBundles is Beam's `_WriteBundleDoFn` given that directory instead of the
  InitializeWrite side input (`CommittedWriteBundleDoFn`; also written a batch at a
  time, see `file_writes`);
* the written files' names go to a runner step (`COMMIT_FILES_URN`) that the batch
  driver runs after the job that wrote them: Beam's PreFinalize and FinalizeWrite
  (`iobase._finalize_write`, with its empty shard when nothing was written), whose
  outputs, the final file names, are the step's output as Beam's are.

Only a sink that keeps `FileBasedSink`'s own initialize, pre-finalize and finalize
(its temporary directory is then all its initialisation gives a writer), without
shard counts or per-shard limits, on a bounded input in a pipeline the batch driver
runs; any other keeps Beam's steps.
"""

from __future__ import annotations

from apache_beam import pvalue
from apache_beam.internal import pickler
from apache_beam.io import filebasedsink, iobase
from apache_beam.io.filesystems import FileSystems
from apache_beam.pipeline import AppliedPTransform, Pipeline, PipelineVisitor, PTransformOverride
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import core, ptransform, window
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.translators.file_writes import BatchWriteBundleDoFn

COMMIT_FILES_URN = 'beam_streams_runner:commit_files:v1'

_SINK_STEPS = ('initialize_write', 'pre_finalize', 'finalize_write', 'open_writer')


class CommittedWriteBundleDoFn(BatchWriteBundleDoFn):
    """Beam's WriteBundles with the temporary directory given, not read as a side input."""

    def __init__(self, sink: filebasedsink.FileBasedSink, temp_dir: str) -> None:
        super().__init__(sink)
        self.temp_dir = temp_dir

    def process(self, element):
        if self.writer is None:
            make_dir(self.temp_dir)
        return super().process(element, self.temp_dir)


def make_dir(path: str) -> None:
    """`path` made if missing; another task making it at the same time is no error."""
    if FileSystems.exists(path):
        return
    try:
        FileSystems.mkdirs(path)
    except OSError:
        if not FileSystems.exists(path):
            raise


class CommitFiles(ptransform.PTransform):
    """The runner step that commits a sink's written files (see the module doc)."""

    def __init__(self, sink: filebasedsink.FileBasedSink, temp_dir: str) -> None:
        super().__init__()
        self.sink = sink
        self.temp_dir = temp_dir

    def expand(self, pcoll):
        return pvalue.PCollection.from_(pcoll)

    def to_runner_api_parameter(self, context):
        return COMMIT_FILES_URN, pickler.dumps((self.sink, self.temp_dir))


class CommittedFileWrite(ptransform.PTransform):
    """What `commit_batch_file_writes` puts in a `WriteImpl`'s place."""

    def __init__(self, sink: filebasedsink.FileBasedSink) -> None:
        super().__init__()
        self.sink = sink

    def expand(self, pcoll):
        temp_dir = self.sink._create_temp_dir(self.sink.file_path_prefix.get())
        return (pcoll
                | core.WindowInto(window.GlobalWindows())
                | 'WriteBundles' >> core.ParDo(CommittedWriteBundleDoFn(self.sink, temp_dir))
                | 'CommitFiles' >> CommitFiles(self.sink, temp_dir).with_output_types(str))


def commits(sink: object) -> bool:
    """Whether `sink`'s writes can be committed by the driver (the module doc's terms)."""
    if not isinstance(sink, filebasedsink.FileBasedSink):
        return False
    if any(getattr(type(sink), step) is not getattr(filebasedsink.FileBasedSink, step)
           for step in _SINK_STEPS):
        return False
    return (not sink.num_shards and not sink.max_records_per_shard
            and not sink.max_bytes_per_shard and sink.file_path_prefix.is_accessible())


class _CommittedWriteOverride(PTransformOverride):
    def matches(self, applied: AppliedPTransform) -> bool:
        if not isinstance(applied.transform, iobase.WriteImpl):
            return False
        (pcoll,) = applied.main_inputs.values()
        return pcoll.is_bounded and commits(applied.transform.sink)

    def get_replacement_transform_for_applied_ptransform(
            self, applied: AppliedPTransform) -> CommittedFileWrite:
        return CommittedFileWrite(applied.transform.sink)


def commit_batch_file_writes(pipeline: Pipeline, streaming: bool) -> None:
    """Puts `CommittedFileWrite`s in place in `pipeline` if the batch driver runs it:
    not `--streaming` and no TestStream (`plan.needs_streaming`'s terms)."""
    found: list = []

    class _FindTestStream(PipelineVisitor):
        def visit_transform(self, node: AppliedPTransform) -> None:
            if isinstance(node.transform, TestStream):
                found.append(node)

    if streaming:
        return
    pipeline.visit(_FindTestStream())
    if not found:
        pipeline.replace_all([_CommittedWriteOverride()])


# Driver side -------------------------------------------------------------------------
def commit_files(payload: bytes, write_results: list) -> list[WindowedValue]:
    """Beam's PreFinalize and FinalizeWrite of the sink in `payload` over the files its
    writers wrote (`write_results`): the final files' names, as FinalizeWrite outputs
    them."""
    sink, temp_dir = pickler.loads(payload)
    if not write_results and not sink.skip_if_empty:
        make_dir(temp_dir)  # FinalizeWrite writes an empty shard there
    pre_finalized = sink.pre_finalize(temp_dir, write_results)
    outputs = iobase._finalize_write(None, sink, temp_dir, write_results, 1, pre_finalized)
    return [WindowedValue(v.value, v.timestamp, (window.GlobalWindow(),))
            for v in outputs or ()]
