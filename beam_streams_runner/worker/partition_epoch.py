"""One partition of one stage for one streaming epoch, in the steps its task takes.

Design sections 4, 5 and 8. An epoch is one Spark job over the whole stage DAG;
every task of a stage partition is a `PartitionEpoch`:

1. `load`: the partition's keyed-state backends (a GroupByKey's trigger state,
   a stateful DoFn's user state and timers, a side-input gate's pushed-back
   elements) at the revision the driver names (the previous epoch's, or a
   consistent cut's after a reset) from `PartitionStateCache`, and its operators
   built over them;
2. `feed`: the epoch's records through the operators; the `Punctuation`s of
   its input channels to the partition's `PartitionWatermarks` (every upstream
   partition sends its watermark after the data it produced this epoch);
3. `read_on`: a stage reading a source reads its restrictions on (the residuals
   the driver dealt it and what its own slices left) for the epoch's read
   budget, so that an epoch is one Spark job however small the bundles are;
4. `advance`: the input watermark and processing time advance through the
   operators, firing due timers and windows;
5. `report`: the output watermark (the input watermark held back by the
   operators' state, the residuals, the driver's hold and the gate) goes after
   the data to every output buffer;
6. `commit`: the backends' deltas go to the checkpoint store as revision (epoch,
   task attempt), then the report (watermark, residuals, timers, sizes, the
   revision, a cut asked for) to the driver; a task's accumulator updates reach
   the driver only when it succeeds, so only a successful attempt's revision is
   ever loaded again (an attempt that writes and then dies is a zombie whose
   revision nothing reads; `fault_points.late_write` makes one for the fault tests).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Iterator

from pyspark import TaskContext

from beam_streams_runner.errors import StageExecutionError
from beam_streams_runner.records import MAX_WATERMARK, Punctuation, Record
from beam_streams_runner.regions import fault_points
from beam_streams_runner.regions.publishing import fenced
from beam_streams_runner.regions.requests import take_checkpoint_request
from beam_streams_runner.state.backend import PICKLE_CODEC, KeyedStateBackend, never_pinned
from beam_streams_runner.state.versioned_state import INITIAL_REVISION, Revision
from beam_streams_runner.translators.operator import OperatorServices
from beam_streams_runner.translators.par_do import FusedStageOperator
from beam_streams_runner.translators.publish_gate import PublishGate
from beam_streams_runner.translators.read import ReadInEpochs
from beam_streams_runner.translators.side_input_gate import SideInputGate
from beam_streams_runner.translators.streaming_group_by_key import (
    TRIGGER_STATE_CODEC,
    StreamingGroupByKeyOperator,
)
from beam_streams_runner.worker import watermarks as holds
from beam_streams_runner.worker.epoch_info import (
    DueResiduals,
    EpochInfo,
    PartitionReport,
    SideInputsView,
)
from beam_streams_runner.worker.partition_cache import (
    PartitionStateCache,
    check_run_mark,
    worker_host,
)
from beam_streams_runner.worker.watermarks import PartitionWatermarks
from beam_streams_runner.worker.worker_plan import WorkerPlan


class PartitionEpoch:
    """Partition `index` of stage `stage_name` in one epoch (see the module docstring)."""

    def __init__(self, plan: WorkerPlan, epoch: EpochInfo, stage_name: str, index: int,
                 grouping_input: str | None, side_view: SideInputsView | None,
                 counted: tuple = ()) -> None:
        self._plan = plan
        self._epoch = epoch
        self._stage = plan.stages[stage_name]
        self._index = index
        self._grouping_input = grouping_input
        self._grouping_spec = (plan.groupings[self._stage.inputs[grouping_input]]
                               if grouping_input is not None else None)
        self._side_view = side_view
        self._counted = counted
        self._base = epoch.bases.get((stage_name, index), INITIAL_REVISION)
        self._started = time.monotonic()
        self._runtime = plan.runtime()
        self._source = ReadInEpochs(epoch.bundle_time_ms)
        self._element_counts: dict[str, int] = {}
        self._backends: dict[str, KeyedStateBackend] = {}
        self._state_loads: collections.Counter = collections.Counter()
        self._state_load_ms: collections.Counter = collections.Counter()
        self._read_s = 0.0
        self._reading = 0
        self._report: PartitionReport | None = None
        self.watermarks = PartitionWatermarks()
        self.grouping: StreamingGroupByKeyOperator | None = None
        self.gate: SideInputGate | None = None
        self.publish_gate: PublishGate | None = None
        self.operator: FusedStageOperator | None = None

    @property
    def display_name(self) -> str:
        return self._stage.display_name

    # 1. Load ---------------------------------------------------------------------------
    def load(self) -> None:
        """Takes the partition's keyed state at epoch-1 and builds its operators on it."""
        stage, plan, epoch, runtime = self._stage, self._plan, self._epoch, self._runtime
        spec = self._grouping_spec
        if spec is not None:
            self.grouping = StreamingGroupByKeyOperator(
                spec.coders(runtime), spec.windowing(runtime), self._grouping_input,
                plan.bundle_size, self._load('group', TRIGGER_STATE_CODEC),
                epoch.keyed_state_gc)
        side_inputs = {}
        if self._side_view is not None:
            self.gate = SideInputGate(runtime, stage, self._load('gate'))
            side_inputs = self._side_view.state_bc.value
        published_through = epoch.published_through.get(stage.name)
        if published_through is not None:
            self.publish_gate = PublishGate(runtime, stage, self._load('publish'),
                                            epoch.number, published_through)
        self.operator = FusedStageOperator(runtime, stage, OperatorServices(
            bundle_size=plan.bundle_size,
            state=self._load('partition') if stage.stateful else None,
            side_inputs=side_inputs,
            source=self._source,
            counted=self._counted,
            element_counts=self._element_counts,
            pinned=self.gate.pins if self.gate is not None else never_pinned,
            keyed_state_gc=epoch.keyed_state_gc))

    def _load(self, part: str, codec=PICKLE_CODEC) -> KeyedStateBackend:
        name = self._entry(part)
        epoch = self._epoch
        check_run_mark(epoch.store, epoch.state_prefix, epoch.store_id)
        kinds: collections.Counter = collections.Counter()
        started = time.perf_counter()
        backend = PartitionStateCache.load(
            epoch.store, epoch.store_id, name, self._base,
            lambda: KeyedStateBackend(codec, track_changes=True), kinds)
        (kind,) = kinds  # a load counts its one kind
        self._state_load_ms[kind] += 1000 * (time.perf_counter() - started)
        self._state_loads[kind] += 1
        self._backends[name] = backend
        return backend

    def _entry(self, part: str) -> str:
        return f'{self._epoch.state_prefix}{self._stage.name}/{part}-{self._index}'

    # 2. Feed ---------------------------------------------------------------------------
    def feed(self, records: Iterable[tuple[str, object]]) -> Iterator[Record]:
        """Runs the epoch's records; hears the punctuations of the input channels."""
        if self.gate is not None:
            yield from self._each(self.gate.on_side_watermarks(self._side_view.watermarks))
        if self.publish_gate is not None:
            yield from self._published()
        for input_id, payload in records:
            if isinstance(payload, DueResiduals):
                self._source.deal(payload.residuals)
            elif isinstance(payload, Punctuation):
                self.watermarks.hear(payload.channel, payload.watermark)
            elif self.grouping is not None:
                grouped = self._grouping_step(self.grouping.process_bundle, [(input_id, payload)])
                yield from self._run(grouped)
            else:
                yield from self._run([(input_id, payload)])

    # 3. Read on ------------------------------------------------------------------------
    def read_on(self) -> Iterator[Record]:
        """A stage reading a source reads on for the epoch's read budget."""
        if self.operator.reads_source:
            deadline = self._started + self._epoch.read_budget_ms / 1000.0
            yield from self._source.read_on(self.operator.read_residual, deadline)
            self._read_s = time.monotonic() - self._started

    # 4. Advance ------------------------------------------------------------------------
    def advance(self) -> Iterator[Record]:
        """The input watermark and the epoch's processing time through the operators."""
        watermarks, now = self.watermarks, self._epoch.processing_time
        self._hold_residuals()
        # What the partition reads: what its channels sent; for a source, what its
        # restrictions allow (streaming progress).
        self._reading = (watermarks.held(holds.RESIDUALS, holds.DRIVER)
                         if self.operator.reads_source else watermarks.input())
        if self.grouping is not None:
            grouped = self._grouping_step(self.grouping.advance, watermarks.input(), now)
            yield from self._run(grouped)
            watermarks.hold(holds.GROUPING, self.grouping.hold())
        yield from self.operator.advance(watermarks.held(holds.GROUPING), now)
        # Nothing the task holds may outlive its epoch (see `partial_combine`).
        yield from self.operator.finish_task()

    def _hold_residuals(self) -> None:
        self.watermarks.hold(holds.RESIDUALS, self._source.hold())
        self.watermarks.hold(holds.DRIVER, self._epoch.holds.get(self._stage.name))

    # 5. Report -------------------------------------------------------------------------
    def report(self) -> Iterator[Record]:
        """Sends the output watermark after the data to every output buffer."""
        watermarks = self.watermarks
        watermarks.hold(holds.TIMERS, self.operator.hold())
        self._hold_residuals()
        if self.gate is not None:
            watermarks.hold(holds.SIDE_INPUT_GATE, self.gate.hold())
        unpublished = 0
        if self.publish_gate is not None:
            watermarks.hold(holds.PUBLISH_GATE, self.publish_gate.hold())
            unpublished = self.publish_gate.waiting()
        output = watermarks.output()
        for buffer_id in self._stage.outputs.values():
            yield buffer_id, Punctuation((self._stage.name, self._index), output)
        timers = [t for t in (self.operator.next_processing_time(),
                              self.grouping.next_processing_time()
                              if self.grouping is not None else None) if t is not None]
        self._report = PartitionReport(
            output, self._source.residuals, min(timers) if timers else None, self._sizes(),
            self._read_s, self._reading, self._element_counts, unpublished=unpublished,
            host=worker_host(), state_loads=dict(self._state_loads),
            state_load_ms=dict(self._state_load_ms))

    def _sizes(self) -> dict[tuple[str, str], int]:
        """What the partition holds: the runner's gauges (see `metrics.RUNNER_NAMESPACE`)."""
        stage = self._stage
        sizes = {}
        if self.grouping is not None:
            step = self._grouping_spec.step_name
            held = self.grouping.sizes()
            sizes[(step, 'keyed_states')] = held['keys']
            sizes[(step, 'timers')] = held['timers']
        step = stage.step_names[0] if stage.step_names else stage.name
        for name, count in self.operator.sizes().items():
            sizes[(step, name)] = count
        if self.gate is not None:
            held = self.gate.sizes()
            sizes[(step, 'pushed_back_elements')] = held['elements']
            sizes[(step, 'pending_side_windows')] = held['side_windows']
        return sizes

    # 6. Commit -------------------------------------------------------------------------
    def commit(self, reports_acc) -> None:
        """Writes the backends' deltas as revision (epoch, attempt), then reports to the
        driver (with the revision and the bytes the deltas wrote)."""
        epoch, partition = self._epoch, (self._stage.name, self._index)
        revision = None
        if self._backends:
            context = TaskContext.get()
            revision = Revision(epoch.number, context.attemptNumber() if context else 0)
        keep = epoch.keep.get(partition, ())

        def write_deltas(emptied: bool = False) -> int:
            if emptied:  # a zombie's write: wrong if ever read (see `fault_points`)
                for backend in self._backends.values():
                    for key in backend.all_keys():
                        backend.delete_key(key)
            return sum(PartitionStateCache.commit(epoch.store, epoch.store_id, name, revision,
                                                  self._base, backend, keep)
                       for name, backend in self._backends.items())

        state_bytes = (write_deltas() if revision is None else fault_points.late_write(
            epoch.number, revision.attempt, f'{partition}', write_deltas))
        reports_acc.add({(epoch.number, *partition): self._report._replace(
            state_bytes=state_bytes, revision=revision,
            # Output staged after its input ended waits for a cut: ask for one now.
            checkpoint_requested=take_checkpoint_request() or bool(
                self._report.unpublished and self.watermarks.input() >= MAX_WATERMARK))})

    # Helpers ---------------------------------------------------------------------------
    def _grouping_step(self, method: Callable, *args) -> list[Record]:
        try:
            return method(*args)
        except Exception as exc:  # noqa: BLE001 - rewrapped with the GroupByKey's step name
            raise StageExecutionError.from_exception(
                exc, f"Beam step '{self._grouping_spec.step_name}'") from None

    def _run(self, records: list[Record]) -> Iterator[Record]:
        """Runs `records` through the operators, or stages them in the publish gate."""
        if self.publish_gate is not None:
            self.publish_gate.stage(records)
            return iter(())
        return self._each(self._admitted(records))

    def _published(self) -> Iterator[Record]:
        """Runs what a consistent cut now covers, each under the fence of its epoch."""
        for fence, record in self.publish_gate.release():
            with fenced(fence):
                outputs = list(self._each(self._admitted([record])))
            yield from outputs

    def _admitted(self, records: list[Record]) -> list[Record]:
        """The records whose elements may run now (all of them when no side input is read)."""
        if self.gate is None:
            return records
        admitted = [(input_id, self.gate.admit(input_id, chunk)) for input_id, chunk in records]
        return [(input_id, chunk) for input_id, chunk in admitted if chunk]

    def _each(self, records: list[Record]) -> Iterator[Record]:
        for record in records:
            yield from self.operator.process_bundle([record])
