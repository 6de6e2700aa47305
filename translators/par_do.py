"""ParDo, and every SDK-side primitive fused with it: one Spark stage's Python work.

Design sections 3, 4 and 7. A fused stage (ParDos incl. multi-output and
splittable ones, WindowInto/AssignWindows, the lifted halves of Combine,
single-input Flatten) runs through Beam's SDK harness (`WorkerRuntime`): one
bundle in, one harness bundle (`start_bundle` ... `finish_bundle`, then bundle
finalization), its outputs out as chunks per output buffer.

Stateful stages get their input partitioned by key (see `group_by_key`) and
their partition's `KeyedStateBackend`: user state per (encoded key, cell), and
timers in its event-time and processing-time queues. When the input watermark
advances, due event-time timers fire, per key in timestamp order; at the end of
a bounded input the processing-time clock also jumps to +inf (as in Beam's
batch runners), so every timer fires before the partition ends. Expired keys
are then dropped through the backend's ordered expiry index.

A stage reading a source (a splittable DoFn) cuts its bundles at the source and
reads in slices (`read.SourceReads`); what a slice leaves is read on or kept as
the policy the operator is handed says (`read.ReadToEnd`, `read.ReadInEpochs`).
"""

from __future__ import annotations

import collections
from types import SimpleNamespace

from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from beam_streams_runner.driver.plan import StagePlan, stateful_main_input
from beam_streams_runner.errors import StageExecutionError
from beam_streams_runner.failure_hints import failed_combine_step
from beam_streams_runner.metrics import MetricCells
from beam_streams_runner.records import MAX_WATERMARK, Record
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.state.beam_timers import TimerReader, latest_due
from beam_streams_runner.state.direct_user_state import direct_user_state
from beam_streams_runner.state.state_handler import PartitionStateHandler
from beam_streams_runner.translators.grouped_inputs import MARKER, GroupedPanes, hand_in
from beam_streams_runner.translators.keyed_outputs import keep_keyed, keyed_parts
from beam_streams_runner.translators.operator import Bundle, Operator, OperatorServices
from beam_streams_runner.translators.partial_combine import (
    TaskPartialCombines,
    task_partial_combines,
)
from beam_streams_runner.translators.read import (
    Residual,
    SourceReads,
    set_source_bundle_listener,
)
from beam_streams_runner.translators.stateless_chain import metric_containers
from beam_streams_runner.worker.element_counts import count_elements
from beam_streams_runner.worker.runtime import WorkerRuntime

_PROCESSING_TIME = beam_runner_api_pb2.TimeDomain.PROCESSING_TIME
_WINDOW_END_CACHE_SIZE = 10_000


class FusedStageOperator(Operator):
    """One partition of a fused stage, run by the in-process SDK harness."""

    def __init__(self, runtime: WorkerRuntime, stage: StagePlan,
                 services: OperatorServices | None = None) -> None:
        services = services if services is not None else OperatorServices()
        self.runtime = runtime
        self.stage = stage
        self._services = services
        self._state = None
        if stage.stateful:
            # Batch hands none: the partition's state lives as long as its task.
            self._state = services.state if services.state is not None else KeyedStateBackend()
        # As `BundleContextManager.input_for` wants it: an object with the descriptor.
        self._descriptor = SimpleNamespace(
            process_bundle_descriptor=beam_fn_api_pb2.ProcessBundleDescriptor.FromString(
                stage.descriptor))
        self.descriptor_id = self._descriptor.process_bundle_descriptor.id
        self.metrics = MetricCells()
        self._reads = SourceReads(runtime, stage, self._descriptor,
                                  services.bundle_size, services.source)
        # Lifted combines' partial combines last the whole task (see `partial_combine`).
        self._partial_combines = TaskPartialCombines(
            runtime, stage, self._descriptor.process_bundle_descriptor,
            services.bundle_size)
        self._window_coders: dict[str, object] = {}
        self._window_ends: dict[tuple[str, bytes], int] = {}
        self._allowed_lateness = self._prepare_state() if stage.stateful else 0
        self._state_handler = PartitionStateHandler(
            self._state, services.side_inputs,
            self._window_max_timestamp if stage.stateful else None)
        self._timer_readers = {}
        for family, (coder_id, _) in stage.timer_families.items():
            key_coder_id, window_coder_id = runtime.components.coders[
                coder_id].component_coder_ids
            self._timer_readers[family] = TimerReader(
                runtime.coder_impl(key_coder_id), runtime.coder(window_coder_id))

    # The operator contract -------------------------------------------------------
    def process_bundle(self, bundle: Bundle) -> list[Record]:
        data: dict[str, list[bytes]] = collections.defaultdict(list)
        for input_id, chunk in bundle:
            data[input_id].append(chunk)
        return self._run(data, {})

    def read_residual(self, residual: Residual) -> list[Record]:
        """Reads the next slice of a restriction the source stage kept."""
        return self._run({residual.input_id: [residual.element]}, {}, {residual.input_id: 1})

    def advance(self, watermark: int, processing_time: int | None = None) -> list[Record]:
        outputs: list[Record] = []
        state = self._state
        if state is None or watermark > state.watermark:
            if state is not None:
                state.watermark = watermark
            outputs.extend(self._on_watermark(watermark))
        if processing_time is not None and state is not None:
            state.processing_time = max(state.processing_time, processing_time)
            outputs.extend(self._fire_until(state.processing_timers, state.processing_time))
        return outputs

    def _on_watermark(self, watermark: int) -> list[Record]:
        outputs: list[Record] = []
        state = self._state
        if state is not None:
            up_to = latest_due(watermark)
            while True:
                due = state.event_timers.pop_due(up_to)
                if not due and watermark >= MAX_WATERMARK:
                    # The bounded input is exhausted: processing time runs out too.
                    due = state.processing_timers.pop_due(MAX_WATERMARK)
                if not due:
                    break
                outputs.extend(self._fire(due))
        if watermark >= MAX_WATERMARK:
            outputs.extend(self.finish_task())  # the bounded input has ended
        if state is not None and self._services.keyed_state_gc:
            state.expire(watermark, self._allowed_lateness, self._services.pinned)
        return outputs

    def _fire_until(self, queue, now: int) -> list[Record]:
        outputs: list[Record] = []
        while True:
            due = queue.pop_due(now)
            if not due:
                return outputs
            outputs.extend(self._fire(due))

    def hold(self) -> int:
        return self._state.min_hold() if self._state is not None else MAX_WATERMARK

    def next_processing_time(self) -> int | None:
        if self._state is None:
            return None
        return self._state.processing_timers.next_timestamp()

    def finish_task(self) -> list[Record]:
        """What the stage's partial combines held over this task's bundles."""
        try:
            return self._partial_combines.emit()
        except Exception as exc:  # noqa: BLE001 - a CombineFn's `compact` is user code
            raise StageExecutionError.from_exception(exc, self.stage.display_name) from None

    @property
    def reads_source(self) -> bool:
        """Whether a splittable DoFn (a source) reads this stage's input."""
        return bool(self._reads.splittable_inputs)

    def sizes(self) -> dict[str, int]:
        """What the partition holds (the runner's gauges): live keys and timers."""
        state = self._state
        if state is None:
            return {}
        return {'keyed_states': state.live_keys(),
                'timers': state.timer_count()}

    # Running harness bundles -----------------------------------------------------
    def _run(self, data: dict[str, list[bytes]], fired: dict,
             counts: dict[str, int] | None = None) -> list[Record]:
        self.runtime.state_router.target = self._state_handler
        outputs: list[Record] = []
        pending = [(data, fired, counts)]
        while pending:
            data, fired, counts = pending.pop()
            delayed, cuts = self._run_bundle(data, fired, outputs, counts)
            if not delayed and not cuts:
                continue
            again = self._services.source.keep(self._reads.leftovers(delayed, cuts, data))
            if again:
                by_input: dict[str, list[bytes]] = collections.defaultdict(list)
                for residual in again:
                    by_input[residual.input_id].append(residual.element)
                pending.append((by_input, {}, None))
        return outputs

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
        handed: dict[str, list[GroupedPanes]] = {}
        for input_id in self.stage.inputs:
            stream = conn.output_stream(instruction_id, input_id)
            for chunk in data.get(input_id, ()):
                if type(chunk) is GroupedPanes:
                    handed.setdefault(input_id, []).append(chunk)
                else:
                    stream.write(chunk)
            stream.close()
            if input_id in handed:  # its own data element: see `grouped_inputs`
                marker = conn.output_stream(instruction_id, input_id)
                marker.write(MARKER)
                marker.close()
        cuts: list[beam_fn_api_pb2.ProcessBundleSplitResponse] = []
        self._reads.start_bundle(counts)
        # The harness's bundle processor is driven directly (what SdkWorker does,
        # minus building every system MonitoringInfo of every step per bundle).
        processors = runtime.processors
        if processors.cached_bundle_processors[self.descriptor_id]:
            processor = processors.get(instruction_id, self.descriptor_id)
        else:
            # Only a new processor looks these up.
            with direct_user_state(), task_partial_combines():
                processor = processors.get(instruction_id, self.descriptor_id)
            if self._services.keyed_outputs:
                keep_keyed(processor, self._services.keyed_outputs)
        self._partial_combines.hold(processor)
        for input_id, panes in handed.items():
            hand_in(processor, input_id, panes)
        try:
            hook = None if fired else self._reads.bundler(processor, instruction_id, data, cuts)
            if hook is not None:
                set_source_bundle_listener(hook)
            try:
                with processor.state_handler.process_instruction_id(instruction_id, ()):
                    delayed, requires_finalization = processor.process_bundle(instruction_id)
            finally:
                set_source_bundle_listener(None)
            self._collect_outputs(processor, instruction_id, outputs)
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

    def _collect_outputs(self, processor, instruction_id: str, outputs: list[Record]) -> None:
        """The bundle's data and timers from the channel, its metrics and element counts."""
        by_output: dict[str, list[bytes]] = collections.defaultdict(list)
        for element in self.runtime.data_conn.input_elements(instruction_id, None):
            if isinstance(element, beam_fn_api_pb2.Elements.Timers):
                self._record_timers(element)
            elif element.data:
                by_output[element.transform_id].append(element.data)
        for transform_id, parts in by_output.items():
            outputs.append((self.stage.outputs[transform_id], b''.join(parts)))
        if self._services.keyed_outputs:
            for transform_id, keyed in keyed_parts(processor):
                outputs.append((self.stage.outputs[transform_id], keyed))
        for op_id, op in processor.ops.items():
            for transform_id, container in metric_containers(op_id, op):
                if container.metrics:
                    self.metrics.fold(transform_id, container.metrics)
        if self._services.counted:
            count_elements(processor, self._services.counted, self._services.element_counts)

    # Timers ------------------------------------------------------------------------
    def _record_timers(self, element: beam_fn_api_pb2.Elements.Timers) -> None:
        """Sets and clears the timers the harness wrote. A pending timer is kept as its
        Beam encoding (fired as it is); its id is (encoded user key, family, encoded
        dynamic timer tag and windows), so equal ids are equal timers."""
        family = (element.transform_id, element.timer_family_id)
        _, domain = self.stage.timer_families[family]
        state = self._state
        queue = state.processing_timers if domain == _PROCESSING_TIME else state.event_timers
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

    # Keyed state -------------------------------------------------------------------
    def _prepare_state(self) -> int:
        """Learns the window coders of the stateful steps; returns their largest allowed
        lateness (micros)."""
        descriptor = self._descriptor.process_bundle_descriptor
        lateness_ms = 0
        for transform_id, transform in descriptor.transforms.items():
            main_input = stateful_main_input(transform)
            if main_input is None:
                continue
            strategy = descriptor.windowing_strategies[
                descriptor.pcollections[main_input].windowing_strategy_id]
            self._window_coders[transform_id] = self.runtime.coder_impl(strategy.window_coder_id)
            lateness_ms = max(lateness_ms, strategy.allowed_lateness)
        return lateness_ms * 1000

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
