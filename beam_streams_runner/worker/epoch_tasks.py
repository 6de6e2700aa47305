"""What runs inside a Spark task of a streaming epoch (design sections 4, 5 and 8).

An epoch is one Spark job over the whole stage DAG. Every task of a stage
partition:

1. takes the operators of its partition: stateless ones are built afresh;
   stateful ones (GroupByKey buffers and triggers, stateful DoFns' keyed state
   and timers) come from `PartitionOperatorCache` at version epoch-1;
2. runs the epoch's bundles through them; a stage reading a source then reads
   its restrictions (the SDF residuals the driver dealt it, `DueResiduals`, and
   what its own bundles left) bundle after bundle, furthest behind first, for
   the epoch's read budget (`read_on`), so that an epoch is one Spark job
   however small the bundles are;
3. collects the `Punctuation`s of its input channels: every upstream partition
   sends its watermark after the data it produced this epoch, so once the
   input is consumed the input watermark is the minimum over all channels;
4. advances the input watermark and the processing time, firing due timers
   and windows;
5. sends its output watermark, min(input watermark, holds of timers, trigger
   state and SDF residuals), after its data to every output buffer, and reports
   it with the residuals to the driver (`PartitionReport`);
6. commits the new version of its stateful operators before it succeeds.

The map sides of the shuffles between the stages are in `shuffles`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from pyspark import AccumulatorParam

from beam_streams_runner.errors import StageExecutionError, stage_failures_named
from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK, Punctuation, Record
from beam_streams_runner.translators.group_by_key import StreamingGroupByKeyOperator
from beam_streams_runner.translators.par_do import FusedStageOperator, Residual
from beam_streams_runner.translators.side_input_gate import SideInputGate
from beam_streams_runner.worker.element_counts import CountedOutput
from beam_streams_runner.worker.partition_cache import PartitionOperatorCache
from beam_streams_runner.worker.warnings_relay import recorded_warnings
from beam_streams_runner.worker.worker_plan import WorkerPlan


@dataclasses.dataclass(frozen=True)
class EpochInfo:
    """What the driver tells every task of one epoch."""

    number: int
    processing_time: int  # micros: the driver's clock for this epoch
    holds: dict[str, int]  # stage -> watermark hold of residuals the driver kept back
    state_dir: str
    bundle_time_ms: int
    read_budget_ms: int  # how long a source stage's task reads on (see `read_on`)
    keyed_state_gc: bool = True


@dataclasses.dataclass(frozen=True)
class DueResiduals:
    """The SDF residuals due this epoch that the driver deals to one task of a source
    stage: `read_on` reads them, not the input loop, so that a restriction ahead of the
    others waits instead of reading a bundle every epoch."""

    residuals: tuple[Residual, ...]


class PartitionReport(NamedTuple):
    output_watermark: int
    residuals: list[Residual]
    next_processing_time: int | None
    sizes: dict[tuple[str, str], int]  # (Beam step, gauge name) -> live count here
    read_s: float = 0.0  # seconds a source stage's task spent reading (its input and on)
    # Streaming progress (see `driver.progress`): the watermark of what the partition reads
    # (what its channels sent; for a source, what its restrictions allow), the
    # elements of the counted PCollections, the bytes its state commits wrote.
    input_watermark: int = MAX_WATERMARK
    elements: dict[str, int] = {}  # noqa: RUF012 - never mutated (tasks pass their own)
    state_bytes: int = 0


class ReportsAccumulator(AccumulatorParam):
    """Per-epoch reports keyed by (epoch, stage, partition): a re-run task replaces its own."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        value1.update(value2)
        return value1


class SideInputsView(NamedTuple):
    """What a stage reading side inputs gets in one epoch (see `side_input_gate`)."""

    state_bc: object  # broadcast of the state-API layout of everything seen so far
    watermarks: dict  # (ParDo, tag) -> the side input's watermark this epoch (micros)


def run_stage_epoch(plan_bc, epoch_bc, stage_name: str, metrics_acc, warnings_acc, reports_acc,
                    grouping_input: str | None, index: int,
                    records: Iterable[tuple[str, object]],
                    side_view: SideInputsView | None = None,
                    counted: tuple[CountedOutput, ...] = ()) -> Iterator[Record]:
    """Runs partition `index` of an SDK stage for one epoch; counts the elements of
    the `counted` outputs for the epoch's progress record."""
    plan: WorkerPlan = plan_bc.value
    epoch: EpochInfo = epoch_bc.value
    started = time.monotonic()
    deadline = started + epoch.read_budget_ms / 1000.0
    runtime = plan.runtime()
    stage = plan.stages[stage_name]

    def new_stage_operator() -> FusedStageOperator:
        created = FusedStageOperator(runtime, stage, {}, plan.bundle_size, streaming=True,
                                     bundle_time_ms=epoch.bundle_time_ms)
        created.keyed_state_gc = epoch.keyed_state_gc
        return created

    grouping = None
    if grouping_input is not None:
        spec = plan.groupings[stage.inputs[grouping_input]]
        grouping = _load(
            epoch, f'stage-{stage.index}/group-{index}', lambda: StreamingGroupByKeyOperator(
                runtime.coder_impl(spec.input_coder_id), runtime.coder_impl(spec.output_coder_id),
                runtime.coder_impl(spec.key_coder_id),
                runtime.context.windowing_strategies.get_by_id(spec.windowing_strategy_id),
                grouping_input, plan.bundle_size,
                value_coder_impl=runtime.coder_impl(spec.value_coder_id)))
        grouping.keyed_state_gc = epoch.keyed_state_gc
    if stage.stateful:
        operator = _load(epoch, f'stage-{stage.index}/partition-{index}', new_stage_operator)
        operator.residuals = []  # the driver took the last epoch's residuals already
    else:
        operator = new_stage_operator()
    operator.counted, operator.element_counts = counted, {}
    gate = None
    if side_view is not None:
        gate = _load(epoch, f'stage-{stage.index}/gate-{index}',
                     lambda: SideInputGate(runtime, stage))
        operator.state.side_inputs = side_view.state_bc.value
        operator.has_pushed_back = gate.graph.has_pending
    heard: dict[object, int] = {}
    with recorded_warnings(warnings_acc), stage_failures_named(stage.display_name):
        try:
            if gate is not None:
                yield from _each(operator.process_bundle,
                                 gate.on_side_watermarks(side_view.watermarks))
            for input_id, payload in records:
                if isinstance(payload, DueResiduals):
                    operator.residuals.extend(
                        r._replace(resume_delay_s=0.0) for r in payload.residuals)
                elif isinstance(payload, Punctuation):
                    heard[payload.channel] = max(
                        payload.watermark, heard.get(payload.channel, MIN_WATERMARK))
                elif grouping is not None:
                    grouped = _grouping_step(
                        spec.step_name, grouping.process_bundle, [(input_id, payload)])
                    yield from _each(operator.process_bundle, _admitted(gate, grouped))
                else:
                    yield from _each(operator.process_bundle,
                                     _admitted(gate, [(input_id, payload)]))
            read_s = 0.0
            if operator.reads_source:
                yield from read_on(operator, deadline)
                read_s = time.monotonic() - started
            # Every upstream partition sent its watermark after its data. A partition
            # that heard no channel reads only residuals the driver fed back; their
            # own watermarks hold its output (below).
            input_watermark = min(heard.values()) if heard else MAX_WATERMARK
            reading = input_watermark
            if operator.reads_source:
                reading = min(reading, operator.residual_hold(),
                              epoch.holds.get(stage_name, MAX_WATERMARK))
            if grouping is not None:
                grouping.clock.micros = max(grouping.clock.micros, epoch.processing_time)
                grouped = _grouping_step(
                    spec.step_name, grouping.on_watermark, 'input', input_watermark)
                grouped += _grouping_step(
                    spec.step_name, grouping.on_processing_time, epoch.processing_time)
                yield from _each(operator.process_bundle, _admitted(gate, grouped))
                input_watermark = grouping.output_watermark()
            yield from operator.on_watermark('input', input_watermark)
            yield from operator.on_processing_time(epoch.processing_time)
            # Nothing the task holds may outlive its epoch (see `partial_combine`).
            yield from operator.finish_task()
        finally:
            totals = operator.metrics.take()
            if totals is not None:
                metrics_acc.add(totals)
    output_watermark = min(operator.output_watermark(), operator.residual_hold(),
                           epoch.holds.get(stage_name, MAX_WATERMARK),
                           gate.hold() if gate is not None else MAX_WATERMARK)
    for buffer_id in stage.outputs.values():
        yield buffer_id, Punctuation((stage_name, index), output_watermark)
    timers = [t for t in (operator.next_processing_time(),
                          grouping.next_processing_time() if grouping is not None else None)
              if t is not None]
    state_bytes = 0
    if grouping is not None:
        state_bytes += PartitionOperatorCache.commit(
            epoch.state_dir, f'stage-{stage.index}/group-{index}', epoch.number, grouping)
    if stage.stateful:
        state_bytes += PartitionOperatorCache.commit(
            epoch.state_dir, f'stage-{stage.index}/partition-{index}', epoch.number, operator)
    if gate is not None:
        state_bytes += PartitionOperatorCache.commit(
            epoch.state_dir, f'stage-{stage.index}/gate-{index}', epoch.number, gate)
    # Reported after the commits (a task's accumulator updates reach the driver only
    # when it succeeds either way), so the report carries what they wrote.
    reports_acc.add({(epoch.number, stage_name, index): PartitionReport(
        output_watermark, operator.residuals, min(timers) if timers else None,
        _sizes(stage, operator, grouping,
               spec.step_name if grouping is not None else None, gate),
        read_s, reading, operator.element_counts, state_bytes)})


def read_on(operator: FusedStageOperator, deadline: float,
            clock: Callable[[], float] = time.monotonic) -> Iterator[Record]:
    """Reads the residuals of a source stage's restrictions on, one read slice each
    in turn (see `FusedStageOperator.read_residual`), while one is due at once and
    `deadline` (on `clock`) is not reached; the first slice is read even past
    the deadline, so every task moves on.

    The furthest-behind restriction reads first (lowest watermark, then earliest due):
    the stage's watermark is their minimum, and a restriction left behind while the
    others read ahead would keep every key read ahead alive in downstream state. So
    a restriction ahead of the others waits until they catch up (Flink calls this
    watermark alignment). Reading each restriction a bundle per epoch instead lets
    their event times drift apart without bound when they advance at different
    event-time paces (NEXMark parts of 12 and 13 timelines under time-cut bundles).

    A residual due now means backlog (a runner checkpoint after a full bundle, or
    an input element not read yet); one due later is a source waiting for data (a
    self-checkpoint with a resume delay): it goes back to the driver, so a paced
    source ends the epoch early and the epoch's length follows the load. What is
    left when the budget runs out also goes back, with its remaining delay.
    """
    now = clock()
    pending = [(now + r.resume_delay_s, r) for r in operator.residuals]
    operator.residuals = []
    read_any = False
    while pending and (now < deadline or not read_any):
        due = [item for item in pending if item[0] <= now]
        if not due:
            break
        item = min(due, key=lambda entry: (entry[1].watermark, entry[0]))
        pending.remove(item)
        residual = item[1]
        yield from operator.read_residual(residual)
        read_any = True
        now = clock()
        pending.extend((now + r.resume_delay_s, r) for r in operator.residuals)
        operator.residuals = []
    operator.residuals = [r._replace(resume_delay_s=max(0.0, at - now)) for at, r in pending]


def _sizes(stage, operator: FusedStageOperator, grouping, grouping_step: str | None,
           gate: SideInputGate | None) -> dict[tuple[str, str], int]:
    """What the partition holds: the runner's gauges (see `metrics.RUNNER_NAMESPACE`)."""
    sizes = {}
    if grouping is not None:
        held = grouping.sizes()
        sizes[(grouping_step, 'keyed_states')] = held['keys']
        sizes[(grouping_step, 'timers')] = held['timers']
    step = stage.step_names[0] if stage.step_names else stage.name
    if stage.stateful:
        sizes[(step, 'keyed_states')] = operator.keyed_state.live_keys()
        sizes[(step, 'timers')] = len(operator.event_timers) + len(operator.processing_timers)
    if gate is not None:
        held = gate.graph.sizes()
        sizes[(step, 'pushed_back_elements')] = held['elements']
        sizes[(step, 'pending_side_windows')] = held['side_windows']
    return sizes


def _load(epoch: EpochInfo, name: str, create: Callable):
    return PartitionOperatorCache.load(epoch.state_dir, name, epoch.number - 1, create)


def _grouping_step(step_name: str, method: Callable, *args) -> list[Record]:
    try:
        return method(*args)
    except Exception as exc:  # noqa: BLE001 - rewrapped with the GroupByKey's step name
        raise StageExecutionError.from_exception(exc, f"Beam step '{step_name}'") from None


def _admitted(gate: SideInputGate | None, records: list[Record]) -> list[Record]:
    """The records whose elements may run now (all of them when no side input is read)."""
    if gate is None:
        return records
    admitted = [(input_id, gate.admit(input_id, chunk)) for input_id, chunk in records]
    return [(input_id, chunk) for input_id, chunk in admitted if chunk]


def _each(process_bundle: Callable, records: list[Record]) -> Iterator[Record]:
    for record in records:
        yield from process_bundle([record])
