"""What every task of a pipeline run needs: the `WorkerPlan`, broadcast once per run.

The driver builds it (`driver.lineage.worker_plan`); a task reads it from the
broadcast and finds (or builds) its process's `WorkerRuntime` with `runtime()`.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from beam_streams_runner.driver.plan import StagePlan
from beam_streams_runner.translators.group_by_key import GroupingCoders
from beam_streams_runner.translators.keyed_outputs import groupable
from beam_streams_runner.worker.runtime import WorkerRuntime


@dataclasses.dataclass(frozen=True)
class GroupingSpec:
    """How the reduce side of one GroupByKey decodes, groups and encodes."""

    input_coder_id: str
    key_coder_id: str
    value_coder_id: str
    output_coder_id: str
    windowing_strategy_id: str
    step_name: str

    def coders(self, runtime: WorkerRuntime) -> GroupingCoders:
        return GroupingCoders(
            input=runtime.coder_impl(self.input_coder_id),
            output=runtime.coder_impl(self.output_coder_id),
            key=runtime.coder_impl(self.key_coder_id),
            value=runtime.coder_impl(self.value_coder_id))

    def windowing(self, runtime: WorkerRuntime):
        """Beam's `Windowing` of the grouped PCollection."""
        return runtime.context.windowing_strategies.get_by_id(self.windowing_strategy_id)

    def takes_objects(self, runtime: WorkerRuntime) -> bool:
        """Whether its input may arrive as `KeyedValues` and its panes leave as
        `GroupedPanes` (`keyed_outputs.groupable`)."""
        return groupable(runtime.coder(self.input_coder_id), runtime.coder(self.key_coder_id),
                         self.windowing(runtime))


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
