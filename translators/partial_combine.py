"""The lifted Combine's partial combine, kept for a whole task (design section 3.5).

Beam's `lift_combiners` ends the stage before a CombinePerKey's shuffle with a
partial combine (`PartialGroupByKeyCombiningValues`, the harness's
`PGBKCVOperation`): a table of accumulators per (window, key) that the harness
empties into its output at every `finish`. Here `finish` comes at every source
bundle end and every harness bundle end (design section 4), so with bundles of
1,000 elements and 10,000 keys the table barely combines anything before the
shuffle (the word count of 2M words ran 2.4x slower at the default bundle size
than at 100,000).

A partial combine is the runner's own operation: no user code sees its
bundles. So, as Spark's map-side combine does, the table lives as long as the
task: the partition's run in batch, its epoch in streaming (nothing may be held
across epochs: no checkpoint would hold it, and the epoch's output watermark
promises that the data before it has been sent). User DoFns still see their
source bundles. Meanwhile the table keeps Beam's own bound (100,000 keys, or
1,000,000 for sum, min, max, count and mean): past it, a tenth of the keys go
out in the current bundle's output, as in Beam. What the table holds at the end
of the task is encoded here with the stage output's coder, the very coder the
harness would have written it with.

`TaskPartialCombine` is Beam's operation with a deferred `finish`; bundle
processors the runner builds get it (`task_partial_combines`). The
`TaskPartialCombines` of a `FusedStageOperator` (one task) marks the
operations of each harness bundle's processor as held by that task and emits
them in `emit`. A task that never reached `emit` (its consumer stopped reading)
leaves its operations held: the next task that gets the same processor drops
their contents, which belonged to the abandoned task's output.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.internal import pickler
from apache_beam.portability import common_urns
from apache_beam.runners import common
from apache_beam.runners.worker import bundle_processor, operation_specs, operations
from apache_beam.transforms import combiners, core
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.options import DEFAULT_BUNDLE_SIZE
from beam_streams_runner.records import ChunkBuilder, Record

PRECOMBINE_URN = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn
_BUFFERED_CALLABLES = (core.CallableWrapperCombineFn, core.NoSideInputsCallableWrapperCombineFn)


class TaskPartialCombine(operations.PGBKCVOperation):
    """Beam's partial combine, whose table outlives harness bundles while a task
    holds it (`holder`); `drain` empties it outside any harness bundle.

    The table is this class's own (Beam's is private to its compiled operation), kept
    as Beam keeps it: per (window, key) a `[accumulator, timestamp]`, at most
    `max_keys` keys, a tenth of them output in arrival order past that bound. So a
    stateless chain in front can hand it a whole batch (`add_batch`): the batch's
    values grouped per key and added with one `add_inputs` per key, not one harness
    dispatch per element."""

    holder: object = None
    _drained: list | None = None

    def setup(self, data_sampler=None) -> None:
        super().setup(data_sampler)
        self._table: dict = {}
        fn = self.combine_fn
        # Beam's bound (`PGBKCVOperation.max_keys`), for its tiny accumulators.
        self._max_keys = 1_000_000 if (
            isinstance(fn, (combiners.CountCombineFn, combiners.MeanCombineFn))
            or (isinstance(fn, core.CallableWrapperCombineFn) and fn._fn in (min, max, sum))
        ) else 100_000
        self._per_element_timestamps = (not self.is_default_windowing
                                        and self.timestamp_combiner is not None)
        # (callable, buffer size) of Beam's wrappers of a plain callable, whose
        # accumulator is a list (`_add_to_buffers`); subclasses may differ.
        self._buffered_callable = (
            (fn._fn, fn._buffer_size) if type(fn) in _BUFFERED_CALLABLES else None)

    def process(self, wkv: WindowedValue) -> None:
        with self.scoped_process_state:
            key, value = wkv.value
            if self.is_default_windowing:
                self.add_key_value(key, value, None)
            else:
                timestamp = wkv.timestamp if self.timestamp_combiner else None
                for window in wkv.windows:
                    self.add_key_value((window, key), value, timestamp)

    def add_key_value(self, wkey, value, timestamp) -> None:
        entry = self._table.get(wkey)
        if entry is None:
            entry = self._new_entry(wkey, timestamp)
        entry[0] = self.combine_fn_add_input(entry[0], value)
        if self._per_element_timestamps:
            entry[1] = self.timestamp_combiner.combine(entry[1], timestamp)

    def add_batch(self, values: list, bases: list) -> None:
        """`process` for each `(key, value)` of `values`, whose windows and timestamp
        are those of the WindowedValue at the same place in `bases`."""
        if self._per_element_timestamps:
            for value, base in zip(values, bases, strict=True):
                self.process(base.with_value(value))
            return
        if self._buffered_callable is not None and self.is_default_windowing:
            self._add_to_buffers(values)
            return
        grouped: dict = {}
        with self.scoped_process_state:
            if self.is_default_windowing:
                for key, value in values:
                    inputs = grouped.get(key)
                    if inputs is None:
                        grouped[key] = [value]
                    else:
                        inputs.append(value)
            else:
                for (key, value), base in zip(values, bases, strict=True):
                    for window in base.windows:
                        grouped.setdefault((window, key), []).append(value)
            table, add_inputs = self._table, self.combine_fn.add_inputs
            for wkey, inputs in grouped.items():
                entry = table.get(wkey)
                if entry is None:
                    entry = self._new_entry(wkey, None)
                entry[0] = add_inputs(entry[0], inputs)

    def _add_to_buffers(self, values: list) -> None:
        """`add_batch` for a CombineFn wrapping a callable (`CombinePerKey(sum)`): its
        accumulator is a list of inputs that the callable compacts once it is longer
        than the buffer (Beam's `add_input`), so each value is appended in place."""
        fn, size = self._buffered_callable
        table = self._table
        if fn is sum:
            self._add_to_sums(values)
            return
        with self.scoped_process_state:
            for key, value in values:
                entry = table.get(key)
                if entry is None:
                    entry = self._new_entry(key, None)
                buffer = entry[0]
                buffer.append(value)
                if len(buffer) > size:
                    entry[0] = [fn(buffer)]

    def _add_to_sums(self, values: list) -> None:
        """`_add_to_buffers` for `sum`: each key's buffer holds one running total, its
        first item, that each value is added to (`sum` adds left to right from 0, so the
        total is the one Beam's compacted buffers give, three times as fast)."""
        table = self._table
        with self.scoped_process_state:
            for key, value in values:
                entry = table.get(key)
                if entry is None:
                    entry = self._new_entry(key, None)
                    entry[0].append(0)
                buffer = entry[0]
                buffer[0] = buffer[0] + value

    def _new_entry(self, wkey, timestamp) -> list:
        table = self._table
        if len(table) >= self._max_keys:
            # Beam's eviction: the oldest tenth out, in arrival order.
            evicted = list(itertools.islice(table, len(table) - len(table) * 9 // 10))
            for old in evicted:
                accumulator, old_timestamp = table.pop(old)
                self.output_key(old, accumulator, old_timestamp)
        entry = table[wkey] = [self.combine_fn.create_accumulator(), timestamp]
        return entry

    def finish(self) -> None:
        if self.holder is None:
            self._output_table()

    def _output_table(self) -> None:
        table, self._table = self._table, {}
        for wkey, (accumulator, timestamp) in table.items():
            self.output_key(wkey, accumulator, timestamp)

    def output(self, windowed_value: WindowedValue, output_index: int = 0) -> None:
        # Beam's `finish` and its eviction past the bound both output through here.
        drained = self._drained
        if drained is None:
            operations.Operation.output(self, windowed_value, output_index)
        else:
            drained.append(windowed_value)

    def drain(self) -> list[WindowedValue]:
        """Empties the table: its (key, accumulator) elements, as Beam would output them."""
        self._drained = drained = []
        try:
            self._output_table()
        finally:
            self._drained = None
        return drained


def _create_task_partial_combine(factory, transform_id, transform_proto, payload,
                                 consumers) -> TaskPartialCombine:
    # Beam's `create_combine_per_key_precombine`, with this module's operation.
    serialized_combine_fn = pickler.dumps(
        (beam.CombineFn.from_runner_api(payload.combine_fn, factory.context), [], {}))
    return factory.augment_oldstyle_op(
        TaskPartialCombine(
            common.NameContext(transform_proto.unique_name, transform_id),
            operation_specs.WorkerPartialGroupByKey(
                serialized_combine_fn, None, [factory.get_only_output_coder(transform_proto)]),
            factory.counter_factory,
            factory.state_sampler,
            factory.get_input_windowing(transform_proto)),
        transform_proto.unique_name,
        consumers)


@contextlib.contextmanager
def task_partial_combines() -> Iterator[None]:
    """Bundle processors built in this block run partial combines as
    `TaskPartialCombine` (the harness looks up the operation of each URN when it
    builds a processor). Scoped, not registered: Beam's own runners in the same
    process keep Beam's operation."""
    known = bundle_processor.BeamTransformFactory._known_urns
    previous = known[PRECOMBINE_URN]
    known[PRECOMBINE_URN] = (_create_task_partial_combine, previous[1])
    try:
        yield
    finally:
        known[PRECOMBINE_URN] = previous


class TaskPartialCombines:
    """The partial combines of one task's stage, held over the task's harness bundles."""

    def __init__(self, runtime, stage, descriptor, bundle_size: int) -> None:
        """`descriptor`: the stage's `ProcessBundleDescriptor`. Only a partial combine
        whose output goes straight out of the stage (to the shuffle) is held; the
        runner encodes it with that output's coder."""
        self._targets: dict[str, tuple[bytes, object]] = {}
        transforms = descriptor.transforms
        for transform_id, transform in transforms.items():
            if transform.spec.urn != PRECOMBINE_URN or len(transform.outputs) != 1:
                continue
            (pcollection,) = transform.outputs.values()
            readers = [reader_id for reader_id, reader in transforms.items()
                       if pcollection in reader.inputs.values()]
            if (len(readers) == 1
                    and transforms[readers[0]].spec.urn == bundle_processor.DATA_OUTPUT_URN
                    and readers[0] in stage.outputs):
                self._targets[transform_id] = (
                    stage.outputs[readers[0]],
                    runtime.coder_impl(stage.output_coders[readers[0]]))
        self._chunk_size = bundle_size or DEFAULT_BUNDLE_SIZE
        self._held: list[tuple[str, TaskPartialCombine]] = []

    def hold(self, processor) -> None:
        """Holds the partial combines of `processor` (about to run a harness bundle of
        this task) until `emit`."""
        for transform_id in self._targets:
            op = processor.ops.get(transform_id)
            if not isinstance(op, TaskPartialCombine) or op.holder is self:
                continue
            if op.holder is not None:
                op.drain()  # what an abandoned task held: its output is void
            op.holder = self
            self._held.append((transform_id, op))

    def emit(self) -> list[Record]:
        """The end of the task: everything the held partial combines hold, as output
        records of the stage; they go back to Beam's behaviour until held again."""
        records: list[Record] = []
        held, self._held = self._held, []
        for transform_id, op in held:
            if op.holder is not self:
                continue  # taken over since (never while this task runs)
            elements = op.drain()
            op.holder = None
            buffer_id, coder = self._targets[transform_id]
            builder = ChunkBuilder(self._chunk_size)
            encode = coder.encode_nested
            for element in elements:
                chunk = builder.add(encode(element))
                if chunk is not None:
                    records.append((buffer_id, chunk))
            chunk = builder.flush()
            if chunk is not None:
                records.append((buffer_id, chunk))
        return records
