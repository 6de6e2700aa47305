"""ParDo, and every SDK-side primitive fused with it: one Spark stage's Python work.

Design sections 3, 4 and 7. A fused stage (ParDos incl. multi-output and
splittable ones, WindowInto/AssignWindows, the lifted halves of Combine,
single-input Flatten) runs through Beam's SDK harness (`WorkerRuntime`): one
bundle in, one harness bundle (`start_bundle` ... `finish_bundle`, then bundle
finalization), its outputs out as chunks per output buffer.

Stateful stages get their input partitioned by key (see `group_by_key`); their
user state lives in the partition's `KeyedStateStore` and their timers in
`TimerQueue`s, one for event time and one for processing time. When the input
watermark advances, due event-time timers fire, per key in timestamp order; at
the end of a bounded input the processing-time clock also jumps to +inf (as in
Beam's batch runners), so every timer fires before the partition ends. Expired
keys are then dropped through the ordered expiry index.

Source-level bundling (design section 4): in a stage reading a splittable DoFn
(every bounded read after its initial split, see `read`), a bundle ends after
`bundle_size` elements from the source: the steps downstream of the source run
`finish_bundle` and `start_bundle` there, inside one harness bundle (a read
slice). The slice ends with a runner checkpoint of the restriction after at
least a default bundle's worth (in batch, also a default bundle time's); SDF
residuals (runner checkpoints and the DoFn's own self-checkpoints) are fed back
as new slices of the same stage.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import math
import pickle
import sys
import time
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import NamedTuple

from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner.execution import BundleContextManager
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms import userstate

from beam_streams_runner.driver.plan import StagePlan, stateful_main_input
from beam_streams_runner.errors import StageExecutionError
from beam_streams_runner.failure_hints import failed_combine_step
from beam_streams_runner.metrics import MetricCells
from beam_streams_runner.options import DEFAULT_BUNDLE_SIZE, DEFAULT_BUNDLE_TIME_MS
from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK, Record, decode_with_raw
from beam_streams_runner.state.keyed_state import KeyedStateStore
from beam_streams_runner.state.state_handler import PartitionStateHandler
from beam_streams_runner.state.timers import TimerQueue
from beam_streams_runner.translators.operator import Bundle, Operator
from beam_streams_runner.translators.partial_combine import (
    TaskPartialCombines,
    task_partial_combines,
)
from beam_streams_runner.translators.read import SOURCE_BUNDLES_URN, set_source_bundle_listener
from beam_streams_runner.worker.element_counts import CountedOutput, count_elements
from beam_streams_runner.worker.runtime import WorkerRuntime

_PROCESSING_TIME = beam_runner_api_pb2.TimeDomain.PROCESSING_TIME
# "Split right after the current position": the smallest fraction trackers accept.
_CHECKPOINT_FRACTION = 1e-9
_WINDOW_END_CACHE_SIZE = 10_000
_PROCESS_SIZED_ELEMENTS = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
_TIME_SHIFT = 1 << 63  # Beam's timestamp encoding flips the sign bit


class Residual(NamedTuple):
    """What is left of a splittable DoFn's restriction, kept for a later epoch."""

    input_id: str
    element: bytes  # encoded (element, restriction, watermark estimator state)
    resume_delay_s: float
    watermark: int  # micros: the output watermark the restriction's estimator allows


class FusedStageOperator(Operator):
    """One partition of a fused stage, run by the in-process SDK harness."""

    def __init__(
        self,
        runtime: WorkerRuntime,
        stage: StagePlan,
        side_inputs: Mapping[bytes, bytes],
        bundle_size: int = 0,
        channels=('input',),
        streaming: bool = False,
        bundle_time_ms: int = 0,
    ) -> None:
        super().__init__(channels)
        # Streaming: SDF residuals go back to the driver (`residuals`) instead of
        # being read on here, and bundles are also cut after `bundle_time_ms`.
        self._streaming = streaming
        self._bundle_time_ms = bundle_time_ms
        self.residuals: list[Residual] = []
        # Streaming side inputs: keys with pushed-back elements keep their state.
        self.has_pushed_back: Callable[[bytes], bool] = lambda key: False
        # Off only for comparison benchmarks (--no_keyed_state_gc): expired keys stay.
        self.keyed_state_gc = True
        self.runtime = runtime
        self.stage = stage
        self.descriptor_id = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(
            stage.descriptor).id
        self._descriptor = None
        self.event_timers = TimerQueue()
        self.processing_timers = TimerQueue()
        self.keyed_state = KeyedStateStore()
        self._window_coders: dict[str, object] = {}
        self._window_ends: dict[tuple[str, bytes], int] = {}
        self._allowed_lateness = 0
        self.metrics = MetricCells()
        # Streaming progress: the outputs whose elements this task counts (see `progress`).
        self.counted: tuple[CountedOutput, ...] = ()
        self.element_counts: dict[str, int] = {}
        self._bundle_size = bundle_size
        self._inputs_of_roots: dict[tuple[str, str], str] = {}
        self._input_counts: dict[str, int] = {}
        self._bundle_steps: dict[str, list[str]] | None = None
        self._splittable_inputs = self._inputs_of_splittable_dofns()
        # Lifted combines' partial combines last the whole task (see `partial_combine`).
        self._partial_combines = TaskPartialCombines(
            runtime, stage, self._descriptor_view().process_bundle_descriptor, bundle_size)
        if stage.stateful:
            self._prepare_state()
        self.state = PartitionStateHandler(
            self.keyed_state, side_inputs,
            self._window_max_timestamp if stage.stateful else None)
        self._timer_readers = {}
        for family, (coder_id, _) in stage.timer_families.items():
            key_coder_id, window_coder_id = runtime.components.coders[
                coder_id].component_coder_ids
            self._timer_readers[family] = _TimerReader(
                runtime.coder_impl(key_coder_id), runtime.coder(window_coder_id))

    # The operator contract -------------------------------------------------------
    def process_bundle(self, bundle: Bundle) -> list[Record]:
        data: dict[str, list[bytes]] = collections.defaultdict(list)
        for input_id, chunk in bundle:
            data[input_id].append(chunk)
        return self._run(data, {})

    def read_residual(self, residual: Residual) -> list[Record]:
        """Reads the next slice of a restriction the source stage kept (`residuals`)."""
        return self._run({residual.input_id: [residual.element]}, {}, {residual.input_id: 1})

    def on_input_watermark(self, watermark: int) -> list[Record]:
        outputs: list[Record] = []
        while True:
            due = self.event_timers.pop_due(watermark)
            if not due and watermark >= MAX_WATERMARK:
                # The bounded input is exhausted: processing time runs out too.
                due = self.processing_timers.pop_due(MAX_WATERMARK)
            if not due:
                break
            outputs.extend(self._fire(due))
        if watermark >= MAX_WATERMARK:
            outputs.extend(self.finish_task())  # the bounded input has ended
        if self.stage.stateful and self.keyed_state_gc:
            self.keyed_state.expire(watermark, self._allowed_lateness, self._is_pinned)
        return outputs

    def on_processing_time(self, now: int) -> list[Record]:
        """Fires the processing-time timers due at `now` (micros, the driver's clock)."""
        outputs: list[Record] = []
        while True:
            due = self.processing_timers.pop_due(now)
            if not due:
                return outputs
            outputs.extend(self._fire(due))

    def next_processing_time(self) -> int | None:
        return self.processing_timers.next_timestamp()

    def finish_task(self) -> list[Record]:
        """What the stage's partial combines held over this task's bundles."""
        try:
            return self._partial_combines.emit()
        except Exception as exc:  # noqa: BLE001 - a CombineFn's `compact` is user code
            raise StageExecutionError.from_exception(exc, self.stage.display_name) from None

    def state_delta(self) -> tuple[dict[bytes, bytes], set[bytes]]:
        """What changed since the last call (design section 8), per user key: its keyed
        state under b'k' + key (`KeyedStateStore.encode_key`), its event- and
        processing-time timers under b'e' + key and b'p' + key (each timer as its
        arrival number, family, Beam encoding, where the timer's id ends in that
        encoding, and its firing and hold timestamps, so that a restore decodes no
        timer); plus b'm': the input watermark and the timer queues' next arrival
        numbers."""
        with _collector_paused():
            dirty: dict[bytes, bytes] = {}
            deleted: set[bytes] = set()
            keyed_state = self.keyed_state
            for key in keyed_state.take_changed():
                value = keyed_state.encode_key(key)
                if value is None:
                    deleted.add(b'k' + key)
                else:
                    dirty[b'k' + key] = value
            for prefix, queue in ((b'e', self.event_timers), (b'p', self.processing_timers)):
                for key in queue.take_changed():
                    timers = [(seq, timer.timer_id[1], timer.payload,
                               len(key) + len(timer.timer_id[2]), timer.fire_timestamp,
                               timer.hold_timestamp)
                              for seq, timer in queue.timers_of(key)]
                    if timers:
                        dirty[prefix + key] = pickle.dumps(timers, pickle.HIGHEST_PROTOCOL)
                    else:
                        deleted.add(prefix + key)
            dirty[b'm'] = pickle.dumps((self.watermarks.current(), self.event_timers.next_seq,
                                        self.processing_timers.next_seq))
        return dirty, deleted

    def restore_state(self, state: Mapping[bytes, bytes]) -> None:
        """Rebuilds the partition from its full state as `state_delta` wrote it (called
        on a fresh operator, with {} for the initial state); tracks changes from here.

        Cheap, since a task lands in another worker most epochs: the keyed state is
        restored lazily (`KeyedStateStore.restore_keys`) and no timer is decoded."""
        with _collector_paused():
            keyed: list[tuple[bytes, bytes]] = []
            timers: dict[bytes, list] = {b'e': [], b'p': []}
            for name, value in state.items():
                kind = name[:1]
                if kind == b'k':
                    keyed.append((name[1:], value))
                elif kind in timers:
                    key = name[1:]
                    start = len(key)
                    timers[kind].extend(
                        (seq, ((key, family, encoded[start:id_end]), fire, hold, encoded))
                        for seq, family, encoded, id_end, fire, hold in pickle.loads(value))
                elif name == b'm':
                    watermark, event_seq, processing_seq = pickle.loads(value)
                    self.watermarks.advance('input', watermark)
            self.keyed_state.restore_keys(keyed)
            for kind, queue in ((b'e', self.event_timers), (b'p', self.processing_timers)):
                queue.restore(timers[kind])
            if b'm' in state:
                self.event_timers.next_seq, self.processing_timers.next_seq = (
                    event_seq, processing_seq)
            for tracked in (self.keyed_state, self.event_timers, self.processing_timers):
                tracked.track_changes()

    def output_watermark(self) -> int:
        holds = [self.watermarks.current()]
        for queue in (self.event_timers, self.processing_timers):
            hold = queue.min_hold()
            if hold is not None:
                holds.append(hold)
        return min(holds)

    # Running harness bundles -----------------------------------------------------
    def _run(self, data: dict[str, list[bytes]], fired: dict,
             counts: dict[str, int] | None = None) -> list[Record]:
        self.runtime.state_router.target = self.state
        outputs: list[Record] = []
        pending = [(data, fired)]
        while pending:
            data, fired = pending.pop()
            delayed, cuts = self._run_bundle(data, fired, outputs, counts)
            counts = None
            if self._streaming:
                self._last_data = data
                self._keep_residuals(delayed, cuts)
                continue
            residuals: dict[str, list[bytes]] = collections.defaultdict(list)
            delays = [0.0]
            for cut in cuts:
                self._collect_unprocessed(cut, data, residuals)
            for root in delayed:
                input_id = self._input_of(root)
                residuals[input_id].append(root.application.element)
                delays.append(root.requested_time_delay.ToTimedelta().total_seconds())
            if residuals:
                # A self-checkpointing DoFn asked to be resumed later (e.g. a
                # PeriodicImpulse waiting for its next firing time).
                if min(delays) > 0:
                    time.sleep(min(delays))
                pending.append((residuals, {}))
        return outputs

    def _keep_residuals(self, delayed, cuts) -> None:
        """Streaming: what is left of each restriction goes back to the driver."""
        roots = list(delayed) + [root for cut in cuts for root in cut.residual_roots]
        for root in roots:
            input_id = self._input_of(root)
            watermarks = [w.seconds * 1_000_000 + w.nanos // 1000
                          for w in root.application.output_watermarks.values()]
            self.residuals.append(Residual(
                input_id, root.application.element,
                root.requested_time_delay.ToTimedelta().total_seconds(),
                min(watermarks) if watermarks else MIN_WATERMARK))
        unread: dict[str, list[bytes]] = collections.defaultdict(list)
        for cut in cuts:
            self._collect_unread(cut.channel_splits, self._last_data, unread)
        for input_id, elements in unread.items():
            self.residuals.extend(
                Residual(input_id, element, 0.0, MIN_WATERMARK) for element in elements)

    @property
    def reads_source(self) -> bool:
        """Whether a splittable DoFn (a source) reads this stage's input."""
        return bool(self._splittable_inputs)

    def residual_hold(self) -> int:
        """The output watermark the residuals kept for later epochs allow."""
        return min((r.watermark for r in self.residuals), default=MAX_WATERMARK)

    def _run_bundle(self, data, fired, outputs: list[Record],
                    counts: dict[str, int] | None = None):
        runtime = self.runtime
        conn = runtime.data_conn
        instruction_id = runtime.next_instruction_id()
        for transform_id, family in self.stage.timer_families:
            stream = conn.output_timer_stream(instruction_id, transform_id, family)
            for timers in fired.get((transform_id, family), ()):
                stream.write(timers)
            stream.close()
        for input_id in self.stage.inputs:
            stream = conn.output_stream(instruction_id, input_id)
            for chunk in data.get(input_id, ()):
                stream.write(chunk)
            stream.close()
        cuts: list[beam_fn_api_pb2.ProcessBundleSplitResponse] = []
        # Elements of the bundle's inputs: given, or counted when the bundle is split.
        self._input_counts: dict[str, int] = dict(counts or {})
        # The harness's bundle processor is driven directly (what SdkWorker does,
        # minus building every system MonitoringInfo of every step per bundle).
        processors = runtime.processors
        if processors.cached_bundle_processors[self.descriptor_id]:
            processor = processors.get(instruction_id, self.descriptor_id)
        else:
            # Only a new processor looks these up.
            with _cheap_combining_state(), task_partial_combines():
                processor = processors.get(instruction_id, self.descriptor_id)
        self._partial_combines.hold(processor)
        try:
            if self._splittable_inputs and self._bundle_size and not fired:
                set_source_bundle_listener(
                    self._source_bundler(processor, instruction_id, data, cuts))
            try:
                with processor.state_handler.process_instruction_id(instruction_id, ()):
                    delayed, requires_finalization = processor.process_bundle(instruction_id)
            finally:
                set_source_bundle_listener(None)
            by_output: dict[str, list[bytes]] = collections.defaultdict(list)
            for element in conn.input_elements(instruction_id, None):
                if isinstance(element, beam_fn_api_pb2.Elements.Timers):
                    self._record_timers(element)
                elif element.data:
                    by_output[element.transform_id].append(element.data)
            for transform_id, parts in by_output.items():
                outputs.append((self.stage.outputs[transform_id], b''.join(parts)))
            for transform_id, op in processor.ops.items():
                if op.metrics_container.metrics:
                    self.metrics.fold(transform_id, op.metrics_container.metrics)
            if self.counted:
                count_elements(processor, self.counted, self.element_counts)
            if requires_finalization:
                processor.finalize_bundle()
            runtime.processors.release(instruction_id)
        except Exception as exc:  # noqa: BLE001 - any user failure is rewrapped with its step
            runtime.processors.discard(instruction_id, exc)
            # Drop whatever the failed bundle left on the channel.
            list(conn.input_elements(instruction_id, None))
            transforms = processor.process_bundle_descriptor.transforms
            raise StageExecutionError.from_exception(
                exc, self.stage.display_name, failed_combine_step(exc, transforms)) from None
        return delayed, cuts

    # Source-level bundling ---------------------------------------------------------
    def _inputs_of_splittable_dofns(self) -> set[str]:
        """The inputs read by a splittable DoFn (sources, after their initial split)."""
        descriptor = self._descriptor_view()
        inputs = set()
        for transform_id, transform in descriptor.process_bundle_descriptor.transforms.items():
            if transform.spec.urn == _PROCESS_SIZED_ELEMENTS:
                for input_tag in transform.inputs:
                    try:
                        inputs.add(BundleContextManager.input_for(
                            descriptor, transform_id, input_tag))
                    except RuntimeError:
                        continue  # a side input
        return inputs

    def _source_bundler(self, processor, instruction_id: str, data, cuts: list):
        """The hook of the stage's `SourceBundleBoundary`s: cuts source bundles.

        Every `bundle_size` elements a source emitted (or `bundle_time_ms`, when
        set) a source bundle ends: the steps downstream of the source finish their
        bundle and start the next (`finish_bundle`, `start_bundle`), inside the
        same harness bundle. The harness bundle is a read slice: at the first
        bundle end past `max(bundle_size, DEFAULT_BUNDLE_SIZE)` elements (in batch,
        and past `DEFAULT_BUNDLE_TIME_MS`; in streaming, or past
        `max(bundle_time_ms, DEFAULT_BUNDLE_TIME_MS)`) the runner checkpoints the
        source's restriction and the rest is read as the next slice. So small
        bundles cost a `finish_bundle`/`start_bundle` of the steps downstream, not a
        harness bundle and an SDF checkpoint each.
        """
        ops = processor.ops
        steps = self._steps_after_sources(ops)
        bundle_size = self._bundle_size
        bundle_s = self._bundle_time_ms / 1000.0 if self._bundle_time_ms else None
        slice_size = max(bundle_size, DEFAULT_BUNDLE_SIZE)
        started = time.monotonic()
        slice_until = (started + max(bundle_s, DEFAULT_BUNDLE_TIME_MS / 1000.0)
                       if bundle_s else math.inf)
        # Batch: a slice also lasts a default bundle time. Each slice costs a harness
        # bundle and an SDF checkpoint (Beam pickles and compresses the restriction):
        # 10% of a word count's CPU at a slice per 1,000 lines.
        slice_from = started if self._streaming else started + DEFAULT_BUNDLE_TIME_MS / 1000.0
        in_bundle = dict.fromkeys(steps, 0)
        bundle_until = dict.fromkeys(steps, started + bundle_s if bundle_s else math.inf)
        read = 0

        def on_element(boundary_id: str) -> None:
            nonlocal read
            read += 1
            count = in_bundle[boundary_id] + 1
            if count < bundle_size and (bundle_s is None
                                        or time.monotonic() < bundle_until[boundary_id]):
                in_bundle[boundary_id] = count
                return
            in_bundle[boundary_id] = 0
            now = time.monotonic()
            if (((read >= slice_size and now >= slice_from) or now >= slice_until)
                    and self._checkpoint(processor, instruction_id, data, cuts)):
                return  # the slice's last bundle ends with the harness bundle
            finishing = steps[boundary_id]
            for step in finishing:
                ops[step].finish()
            for step in reversed(finishing):
                ops[step].start()
            if bundle_s is not None:
                bundle_until[boundary_id] = time.monotonic() + bundle_s

        return on_element

    def _checkpoint(self, processor, instruction_id: str, data, cuts: list) -> bool:
        """Checkpoints the source's restriction just after the current position.

        This is a runner-initiated split (fraction ~0 of the remainder) through the
        harness's own splitting protocol: the rest of the restriction comes back as
        a residual and is read as the next slice. True if it split; a tracker may
        refuse (byte-offset trackers only split between records), and a bundle end
        later asks again.
        """
        if any(cut.residual_roots for cut in cuts):
            return False
        counts = self._input_counts
        for input_id in self._splittable_inputs:
            if input_id not in counts:  # once per bundle (a refused split is asked again)
                counts[input_id] = self._count(input_id, data)
        desired = {
            input_id: beam_fn_api_pb2.ProcessBundleSplitRequest.DesiredSplit(
                fraction_of_remainder=_CHECKPOINT_FRACTION,
                estimated_input_elements=counts[input_id])
            for input_id in self._splittable_inputs
        }
        cut = processor.try_split(beam_fn_api_pb2.ProcessBundleSplitRequest(
            instruction_id=instruction_id, desired_splits=desired))
        if cut.residual_roots or cut.channel_splits:
            cuts.append(cut)
        return bool(cut.residual_roots)

    def _steps_after_sources(self, ops) -> dict[str, list[str]]:
        """Per `SourceBundleBoundary`, the steps a source bundle's end finishes, in
        the harness's order: every step downstream of its splittable DoFn except
        the data outputs (their stream closes only with the harness bundle)."""
        if self._bundle_steps is None:
            transforms = self._descriptor_view().process_bundle_descriptor.transforms
            consumers = collections.defaultdict(list)
            producers = {}
            for transform_id, transform in transforms.items():
                for pcollection in transform.inputs.values():
                    consumers[pcollection].append(transform_id)
                for pcollection in transform.outputs.values():
                    producers[pcollection] = transform_id
            skipped = {bundle_processor.DATA_OUTPUT_URN, SOURCE_BUNDLES_URN}
            self._bundle_steps = {}
            for boundary_id, boundary in transforms.items():
                if boundary.spec.urn != SOURCE_BUNDLES_URN:
                    continue
                below: set[str] = set()
                frontier = [producers[next(iter(boundary.inputs.values()))]]
                while frontier:
                    for pcollection in transforms[frontier.pop()].outputs.values():
                        for consumer in consumers[pcollection]:
                            if consumer not in below:
                                below.add(consumer)
                                frontier.append(consumer)
                self._bundle_steps[boundary_id] = [
                    step for step in ops
                    if step in below and transforms[step].spec.urn not in skipped]
        return self._bundle_steps

    def _input_of(self, root: beam_fn_api_pb2.DelayedBundleApplication) -> str:
        """The stage input a residual root of the harness goes back to."""
        application = root.application
        key = (application.transform_id, application.input_id)
        input_id = self._inputs_of_roots.get(key)
        if input_id is None:
            input_id = self._inputs_of_roots[key] = BundleContextManager.input_for(
                self._descriptor_view(), *key)
        return input_id

    def _count(self, input_id: str, data) -> int:
        coder = self.runtime.coder_impl(self.stage.input_coders[input_id])
        return sum(1 for chunk in data.get(input_id, ()) for _ in decode_with_raw(coder, chunk))

    def _collect_unprocessed(self, cut, data, residuals: dict[str, list[bytes]]) -> None:
        """Adds what a split left over (residual roots and unread inputs) to `residuals`."""
        for root in cut.residual_roots:
            residuals[self._input_of(root)].append(root.application.element)
        self._collect_unread(cut.channel_splits, data, residuals)

    def _collect_unread(self, channel_splits, data, residuals: dict[str, list[bytes]]) -> None:
        """Adds the input elements a split left unread to `residuals`. A split inside the
        bundle's last element (by `_input_counts`, when known) leaves none: its input is
        not decoded again to find that out."""
        for channel in channel_splits:
            input_id = channel.transform_id
            if channel.first_residual_element >= self._input_counts.get(input_id, sys.maxsize):
                continue
            coder = self.runtime.coder_impl(self.stage.input_coders[input_id])
            raw = [encoded for chunk in data.get(input_id, ())
                   for _, encoded in decode_with_raw(coder, chunk)]
            residuals[input_id].extend(raw[channel.first_residual_element:])

    # Timers ------------------------------------------------------------------------
    def _record_timers(self, element: beam_fn_api_pb2.Elements.Timers) -> None:
        """Sets and clears the timers the harness wrote. A pending timer is kept as its
        Beam encoding (fired as it is); its id is (encoded user key, family, encoded
        dynamic timer tag and windows), so equal ids are equal timers."""
        family = (element.transform_id, element.timer_family_id)
        _, domain = self.stage.timer_families[family]
        queue = self.processing_timers if domain == _PROCESSING_TIME else self.event_timers
        for key, ident, fire, hold, encoded in self._timer_readers[family].read(
                element.timers):
            timer_id = (key, family, ident)
            if fire is None:
                queue.clear(timer_id)
            else:
                queue.set(timer_id, fire, encoded, hold)

    def _fire(self, due) -> list[Record]:
        by_family: dict[tuple[str, str], list[bytes]] = {}
        for pending in due:
            family = pending.timer_id[1]
            encoded = by_family.get(family)
            if encoded is None:
                by_family[family] = [pending.payload]
            else:
                encoded.append(pending.payload)
        fired = {family: [b''.join(encoded)] for family, encoded in by_family.items()}
        return self._run({}, fired)

    def _is_pinned(self, key: bytes) -> bool:
        return (self.has_pushed_back(key)
                or self.event_timers.has_timers_for_key(key)
                or self.processing_timers.has_timers_for_key(key))

    # Keyed state -------------------------------------------------------------------
    def _prepare_state(self) -> None:
        descriptor = self._descriptor_view().process_bundle_descriptor
        lateness_ms = 0
        for transform_id, transform in descriptor.transforms.items():
            main_input = stateful_main_input(transform)
            if main_input is None:
                continue
            strategy = descriptor.windowing_strategies[
                descriptor.pcollections[main_input].windowing_strategy_id]
            self._window_coders[transform_id] = self.runtime.coder_impl(strategy.window_coder_id)
            lateness_ms = max(lateness_ms, strategy.allowed_lateness)
        self._allowed_lateness = lateness_ms * 1000

    def _window_max_timestamp(self, transform_id: str, window: bytes) -> int:
        cache_key = (transform_id, window)
        end = self._window_ends.get(cache_key)
        if end is None:
            coder = self._window_coders.get(transform_id)
            end = (coder.decode(window).max_timestamp().micros if coder is not None
                   else MAX_WATERMARK)
            if len(self._window_ends) >= _WINDOW_END_CACHE_SIZE:
                self._window_ends.clear()  # windows come and go: keep only recent ones
            self._window_ends[cache_key] = end
        return end

    def _descriptor_view(self) -> SimpleNamespace:
        if self._descriptor is None:
            self._descriptor = SimpleNamespace(
                process_bundle_descriptor=beam_fn_api_pb2.ProcessBundleDescriptor.FromString(
                    self.stage.descriptor))
        return self._descriptor


class _TimerReader:
    """Reads a stream of timers in Beam's encoding (`TimerCoderImpl`: user key, dynamic
    timer tag, windows, clear bit, then unless cleared the firing and hold timestamps
    and the pane) into its parts, without building Beam's `Timer`s."""

    def __init__(self, key_coder_impl, window_coder: coders.Coder) -> None:
        self._key = key_coder_impl
        self._tag = coders.StrUtf8Coder().get_impl()
        self._windows = coders.TupleSequenceCoder(window_coder).get_impl()
        self._pane = coders.PaneInfoCoder().get_impl()

    def read(self, data: bytes):
        """(encoded user key, encoded tag and windows, firing micros or None if the timer
        is cleared, hold micros, the timer's whole encoding) of each timer."""
        stream = create_InputStream(data)
        total = len(data)
        key_impl, tag_impl, windows_impl, pane_impl = (
            self._key, self._tag, self._windows, self._pane)
        while stream.size():
            start = total - stream.size()
            key_impl.decode_from_stream(stream, True)
            key_end = total - stream.size()
            tag_impl.decode_from_stream(stream, True)
            windows_impl.decode_from_stream(stream, True)
            id_end = total - stream.size()
            if stream.read_byte():  # the clear bit
                yield data[start:key_end], data[key_end:id_end], None, None, None
                continue
            fire = _read_timestamp(stream)
            hold = _read_timestamp(stream)
            pane_impl.decode_from_stream(stream, True)
            yield (data[start:key_end], data[key_end:id_end], fire, hold,
                   data[start:total - stream.size()])


def _read_timestamp(stream) -> int:
    """Micros of a timestamp in Beam's encoding (`TimestampCoderImpl`: milliseconds as a
    big-endian int64 with the sign bit flipped)."""
    millis = stream.read_bigendian_int64()
    return (millis + _TIME_SHIFT if millis < 0 else millis - _TIME_SHIFT) * 1000


class _UserStateContext(bundle_processor.FnApiUserStateContext):
    """Beam's user state context, but combining states copy their CombineFn by
    unpickling it rather than by `copy.deepcopy`.

    Beam's `FnApiUserStateContext` gives every combining state (one per key and
    window a bundle touches) its own deep copy of the spec's CombineFn; a deep copy
    of even `CountCombineFn` (its type hints included) costs more than the rest of
    the element's state access. Unpickling a pickle made once gives an equally fresh
    copy several times faster. A CombineFn that pickle cannot round-trip, or that
    defines its own `__deepcopy__`, is still deep-copied.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pickled_fns: dict[int, tuple[object, bytes | None]] = {}

    def _create_state(self, state_spec, key, window):
        if type(state_spec) is not userstate.CombiningValueStateSpec:
            return super()._create_state(state_spec, key, window)
        combine_fn = state_spec.combine_fn
        entry = self._pickled_fns.get(id(combine_fn))
        if entry is None or entry[0] is not combine_fn:
            entry = self._pickled_fns[id(combine_fn)] = (
                combine_fn, _pickled_or_none(combine_fn))
        if entry[1] is None:
            return super()._create_state(state_spec, key, window)
        bag_state = bundle_processor.SynchronousBagRuntimeState(
            self._state_handler,
            state_key=beam_fn_api_pb2.StateKey(
                bag_user_state=beam_fn_api_pb2.StateKey.BagUserState(
                    transform_id=self._transform_id,
                    user_state_id=state_spec.name,
                    window=self._window_coder.encode(window),
                    key=self._key_coder.encode_nested(key))),
            value_coder=state_spec.coder)
        return bundle_processor.CombiningValueRuntimeState(bag_state, pickle.loads(entry[1]))


@contextlib.contextmanager
def _cheap_combining_state():
    """Bundle processors built in this block use `_UserStateContext` (the harness
    looks Beam's class up by name when it builds a stateful ParDo)."""
    previous = bundle_processor.FnApiUserStateContext
    bundle_processor.FnApiUserStateContext = _UserStateContext
    try:
        yield
    finally:
        bundle_processor.FnApiUserStateContext = previous


def _pickled_or_none(combine_fn) -> bytes | None:
    if hasattr(type(combine_fn), '__deepcopy__'):
        return None
    try:
        pickled = pickle.dumps(combine_fn, pickle.HIGHEST_PROTOCOL)
        pickle.loads(pickled)
    except Exception:  # noqa: BLE001 - anything pickle cannot round-trip is deep-copied
        return None
    return pickled


@contextlib.contextmanager
def _collector_paused():
    """Pauses Python's cyclic garbage collector while a partition's state is encoded or
    rebuilt: those allocate many objects and free none in cycles, and every collection
    they would trigger scans the whole (large) heap of a worker."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
