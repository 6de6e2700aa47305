"""What runs inside a Spark task of a batch run: the stages and the reduce sides of
their GroupByKeys (the map sides of the shuffles are in `shuffles`).

Every function here is shipped to Spark workers; it reads the broadcast
`WorkerPlan`, finds (or builds) the process's `WorkerRuntime` and drives the
operators of `translators/` over the partition's records, following the
operator contract (bundles, then the watermark +inf, which every input channel
reaches at the end of a bounded input).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from beam_streams_runner.driver.plan import StagePlan
from beam_streams_runner.errors import StageExecutionError, stage_failures_named
from beam_streams_runner.records import MAX_WATERMARK, Record
from beam_streams_runner.translators.group_by_key import GroupByKeyOperator
from beam_streams_runner.translators.kv_chunks import KvChunks
from beam_streams_runner.translators.operator import OperatorServices
from beam_streams_runner.translators.par_do import FusedStageOperator
from beam_streams_runner.worker.runtime import WorkerRuntime
from beam_streams_runner.worker.warnings_relay import recorded_warnings
from beam_streams_runner.worker.watermarks import PartitionWatermarks
from beam_streams_runner.worker.worker_plan import WorkerPlan


def run_stage(plan_bc, stage_name: str, side_bc, metrics_acc, warnings_acc,
              grouping_input: str | None,
              records: Iterable[tuple[str, bytes]]) -> Iterator[Record]:
    """Runs one partition of an SDK stage; `records` are (input id, chunk)."""
    plan: WorkerPlan = plan_bc.value
    runtime = plan.runtime()
    stage = plan.stages[stage_name]
    operator = FusedStageOperator(runtime, stage, OperatorServices(
        bundle_size=plan.bundle_size,
        side_inputs=side_bc.value if side_bc is not None else {},
        keyed_outputs=_keyed_outputs(runtime, plan, stage)))
    watermarks = PartitionWatermarks()
    with recorded_warnings(warnings_acc), stage_failures_named(stage.display_name):
        try:
            if grouping_input is not None:
                records = _grouped(runtime, plan, stage, grouping_input, records)
            for input_id, chunk in records:
                yield from operator.process_bundle([(input_id, chunk)])
            watermarks.hear('input', MAX_WATERMARK)
            yield from operator.advance(watermarks.input())
            yield from operator.finish_task()
        finally:
            totals = operator.metrics.take()
            if totals is not None:
                metrics_acc.add(totals)


def _keyed_outputs(runtime: WorkerRuntime, plan: WorkerPlan, stage: StagePlan
                   ) -> dict[str, object]:
    """The stage's outputs that its chains may leave grouped by key (see
    `keyed_outputs`), with their key coder impls."""
    keyed = {}
    for transform_id, buffer_id in stage.outputs.items():
        spec = plan.groupings.get(buffer_id)
        if spec is not None and spec.takes_objects(runtime):
            keyed[transform_id] = runtime.coder_impl(spec.key_coder_id)
    return keyed


def _grouped(runtime: WorkerRuntime, plan: WorkerPlan, stage: StagePlan, input_id: str,
             records: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
    spec = plan.groupings[stage.inputs[input_id]]
    operator = GroupByKeyOperator(
        spec.coders(runtime), spec.windowing(runtime), input_id, plan.bundle_size,
        KvChunks.of(runtime.coder(spec.input_coder_id), runtime.coder(spec.key_coder_id)),
        hands_panes=spec.takes_objects(runtime))
    try:
        for record in records:
            operator.process_bundle([record])
        grouped = operator.advance(MAX_WATERMARK)
    except Exception as exc:  # noqa: BLE001 - rewrapped with the GroupByKey's step name
        raise StageExecutionError.from_exception(exc, f"Beam step '{spec.step_name}'") from None
    yield from grouped
