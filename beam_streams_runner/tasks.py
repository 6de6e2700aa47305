"""What runs inside a Spark task: the map and reduce sides of the stages.

Every function here is shipped to Spark workers; it reads the broadcast
`WorkerPlan`, finds (or builds) the process's `WorkerRuntime` and drives the
operators of `translators/` over the partition's records, following the
operator contract (bundles, then the watermark +inf per channel at the end of a
bounded input).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Iterator

from beam_streams_runner.errors import StageExecutionError, stage_failures_named
from beam_streams_runner.operators import MAX_WATERMARK
from beam_streams_runner.plan import StagePlan
from beam_streams_runner.records import Record
from beam_streams_runner.translators.group_by_key import GroupByKeyOperator, KeyPartitioner
from beam_streams_runner.translators.par_do import FusedStageOperator
from beam_streams_runner.translators.reshuffle import RoundRobinPartitioner
from beam_streams_runner.warnings_relay import recorded_warnings
from beam_streams_runner.worker_runtime import WorkerRuntime


@dataclasses.dataclass(frozen=True)
class GroupingSpec:
    """How the reduce side of one GroupByKey decodes, groups and encodes."""

    input_coder_id: str
    key_coder_id: str
    value_coder_id: str
    output_coder_id: str
    windowing_strategy_id: str
    step_name: str


@dataclasses.dataclass
class WorkerPlan:
    """Everything a task needs, broadcast once per pipeline run."""

    run_id: str
    components: bytes
    stages: dict[str, StagePlan]
    groupings: dict[bytes, GroupingSpec]
    bundle_size: int
    num_partitions: int
    # The driver's import path: on a local master the Python workers then import
    # the same user modules the driver does (a pipeline's sibling modules, tests).
    driver_sys_path: tuple[str, ...] = ()

    def runtime(self) -> WorkerRuntime:
        for entry in self.driver_sys_path:
            if entry not in sys.path and os.path.isdir(entry):
                sys.path.append(entry)
        descriptors = {}
        for stage in self.stages.values():
            if stage.descriptor is not None:
                descriptors[_descriptor_id(stage)] = stage.descriptor
        return WorkerRuntime.for_run(self.run_id, self.components, descriptors)


def _descriptor_id(stage: StagePlan) -> str:
    from apache_beam.portability.api import beam_fn_api_pb2
    return beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor).id


def key_partition(plan_bc, coder_id: str, key_coder_id: str, tag: str,
                  chunks: Iterable[bytes]) -> Iterator[tuple[int, Record]]:
    plan: WorkerPlan = plan_bc.value
    runtime = plan.runtime()
    partitioner = KeyPartitioner(
        runtime.coder_impl(coder_id), runtime.coder_impl(key_coder_id),
        plan.num_partitions, plan.bundle_size)
    return shuffle_failures_named(partitioner.partition(tag, chunks), plan, tag)


def shuffle_failures_named(routed: Iterator, plan: WorkerPlan, tag: str) -> Iterator:
    """`routed` (a keyed shuffle's map side), with a failure named after the step whose
    input `tag` is: the map side decodes every element, so a user coder's `decode`
    raises here, outside any step the harness would name."""
    try:
        yield from routed
    except StageExecutionError:
        raise  # the producing stage's, run in the same worker before the shuffle
    except Exception as exc:  # noqa: BLE001 - rewrapped with the consuming step's name
        stage = next(s for s in plan.stages.values() if tag in s.inputs)
        grouping = plan.groupings.get(stage.inputs[tag])
        where = f"Beam step '{grouping.step_name}'" if grouping else stage.display_name
        raise StageExecutionError.from_exception(exc, f'{where} (reading its input)') from None


def round_robin_partition(plan_bc, input_coder_id: str, output_coder_id: str, tag: str,
                          index: int, chunks: Iterable[bytes]) -> Iterator[tuple[int, Record]]:
    plan: WorkerPlan = plan_bc.value
    runtime = plan.runtime()
    input_impl = runtime.coder_impl(input_coder_id)
    output_impl = runtime.coder_impl(output_coder_id)
    partitioner = RoundRobinPartitioner(
        input_impl, output_impl, plan.num_partitions, plan.bundle_size, start=index)
    return partitioner.partition(tag, chunks)


def run_stage(plan_bc, stage_name: str, side_bc, metrics_acc, warnings_acc,
              grouping_input: str | None,
              records: Iterable[tuple[str, bytes]]) -> Iterator[Record]:
    """Runs one partition of an SDK stage; `records` are (input id, chunk)."""
    plan: WorkerPlan = plan_bc.value
    runtime = plan.runtime()
    stage = plan.stages[stage_name]
    operator = FusedStageOperator(
        runtime, stage, side_bc.value if side_bc is not None else {}, plan.bundle_size)
    with recorded_warnings(warnings_acc), stage_failures_named(stage.display_name):
        try:
            if grouping_input is not None:
                records = _grouped(runtime, plan, stage, grouping_input, records)
            for input_id, chunk in records:
                yield from operator.process_bundle([(input_id, chunk)])
            yield from operator.on_watermark('input', MAX_WATERMARK)
            yield from operator.finish_task()
        finally:
            totals = operator.metrics.take()
            if totals is not None:
                metrics_acc.add(totals)


def _grouped(runtime: WorkerRuntime, plan: WorkerPlan, stage: StagePlan, input_id: str,
             records: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
    spec = plan.groupings[stage.inputs[input_id]]
    windowing = runtime.context.windowing_strategies.get_by_id(spec.windowing_strategy_id)
    operator = GroupByKeyOperator(
        runtime.coder_impl(spec.input_coder_id),
        runtime.coder_impl(spec.output_coder_id),
        runtime.coder_impl(spec.key_coder_id),
        windowing, input_id, plan.bundle_size)
    try:
        for record in records:
            operator.process_bundle([record])
        grouped = operator.on_watermark('input', MAX_WATERMARK)
    except Exception as exc:  # noqa: BLE001 - rewrapped with the GroupByKey's step name
        raise StageExecutionError.from_exception(exc, f"Beam step '{spec.step_name}'") from None
    yield from grouped
