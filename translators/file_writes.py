"""File sinks written a batch at a time: `WriteToText` and Beam's other file-based sinks.

Design section 9 (the paper's ParDo specialisations). Beam writes a file-based sink's
bundle with `_WriteBundleDoFn` (its "WriteBundles" step): per record one harness dispatch
through a per-window invoker (the step reads the sink's initialisation as a side input)
and one `write` of the record and one of its newline. `batch_file_writes` swaps that
DoFn, at plan time, for `BatchWriteBundleDoFn`, the same DoFn that also takes a
`RecordBatch` as one element and writes its records at once (a text sink's in one
`write` of their encoded lines joined). A stateless chain or a bulk read in front hands
it its batches so (`FileWriteBatches`, through the harness's own `process` of the step,
which opens the writer with the side input as before); any other producer still hands
it records one by one. The files, their names, the temporary files and the finalize
step are Beam's.

Only a sink without per-shard record or byte limits is swapped: with them Beam's DoFn
closes a file in the middle of a bundle, at the record that fills it.
"""

from __future__ import annotations

import uuid

from apache_beam.internal import pickler
from apache_beam.io import filebasedsink, iobase, textio
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from beam_streams_runner.translators.chain_steps import pickled_par_do, with_payloads


class RecordBatch(list):
    """Records a `BatchWriteBundleDoFn` takes as one element (never leaves the worker)."""


class BatchWriteBundleDoFn(iobase._WriteBundleDoFn):
    """Beam's `_WriteBundleDoFn` for a sink without shard limits, also taking a
    `RecordBatch` as one element."""

    def process(self, element, init_result):
        if self.writer is None:
            self.writer = self.sink.open_writer(init_result, str(uuid.uuid4()))
        if type(element) is RecordBatch:
            write_records(self.writer, element)
        else:
            self.writer.write(element)


def write_records(writer: filebasedsink.FileBasedSinkWriter, records: list) -> None:
    """`writer.write` of each record, a text sink's records in one `write`."""
    sink = writer.sink
    if (type(sink).write_record is filebasedsink.FileBasedSink.write_record
            and type(sink).write_encoded_record is textio._TextSink.write_encoded_record):
        encode = sink.coder.encode
        lines = [encode(record) for record in records]
        if sink._append_trailing_newlines:
            lines.append(b'')
            writer.temp_handle.write(b'\n'.join(lines))
        else:
            writer.temp_handle.write(b''.join(lines))
        writer.num_records_written += len(records)
        return
    for record in records:
        writer.write(record)


# Plan side ---------------------------------------------------------------------------
def batch_file_writes(
    descriptor: beam_fn_api_pb2.ProcessBundleDescriptor,
) -> beam_fn_api_pb2.ProcessBundleDescriptor:
    """`descriptor` with each file sink's "WriteBundles" DoFn swapped for
    `BatchWriteBundleDoFn` where it can be (a copy; `descriptor` is left as it is)."""
    swapped = {}
    for transform_id, transform in descriptor.transforms.items():
        payload = _swapped_payload(transform)
        if payload is not None:
            swapped[transform_id] = payload
    return with_payloads(descriptor, swapped) if swapped else descriptor


def _swapped_payload(transform: beam_runner_api_pb2.PTransform
                     ) -> beam_runner_api_pb2.ParDoPayload | None:
    par_do = pickled_par_do(transform)
    if par_do is None:
        return None
    payload, (fn, *rest) = par_do
    sink = getattr(fn, 'sink', None)
    if (type(fn) is not iobase._WriteBundleDoFn
            or not isinstance(sink, filebasedsink.FileBasedSink)
            or sink.max_records_per_shard or sink.max_bytes_per_shard):
        return None
    payload.do_fn.payload = pickler.dumps((BatchWriteBundleDoFn(sink), *rest))
    return payload


# Worker side -------------------------------------------------------------------------
class FileWriteBatches:
    """A "WriteBundles" step of `BatchWriteBundleDoFn` fed a batch at once: one
    `RecordBatch` element through the step's own `process` when the records share
    their windows (the step reads its side input per window), else one by one."""

    def __init__(self, op) -> None:
        self._process = op.process

    def add_batch(self, values: list, bases: list) -> None:
        windows = bases[0].windows
        if all(base.windows is windows or base.windows == windows for base in bases):
            self._process(bases[0].with_value(RecordBatch(values)))
            return
        for value, base in zip(values, bases, strict=True):
            self._process(base if base.value is value else base.with_value(value))


def is_batch_file_write(transform: beam_runner_api_pb2.PTransform) -> bool:
    """Whether `transform` runs a `BatchWriteBundleDoFn` (see `batch_file_writes`)."""
    par_do = pickled_par_do(transform)
    return par_do is not None and isinstance(par_do[1][0], BatchWriteBundleDoFn)
