"""What the batch and streaming drivers share: the Spark jobs of a run and their
cancelling, the broadcast `WorkerPlan`, the buffers between stages, the shuffles'
partitioning and the small functions the lineages ship to Spark.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import uuid
from collections.abc import Callable, Iterator

from apache_beam.portability import common_urns
from pyspark import SparkContext
from pyspark.rdd import RDD

from beam_streams_runner.driver.plan import PipelinePlan, StagePlan, kv_component_coder_ids
from beam_streams_runner.translators.flatten import flattened
from beam_streams_runner.worker import shuffles
from beam_streams_runner.worker.worker_plan import GroupingSpec, WorkerPlan


class PipelineJobs:
    """The Spark jobs of one pipeline run, all tagged with its run id."""

    def __init__(self, sc: SparkContext) -> None:
        self.sc = sc
        self.run_id = f'beam-{uuid.uuid4().hex[:12]}'
        self.cancelled = threading.Event()
        self._description = ''

    def start(self, description: str) -> None:
        """Names the jobs this thread submits from here on (Spark UI) and tags them."""
        self._description = description
        self.sc.setJobGroup(self.run_id, description, interruptOnCancel=True)
        self.sc.addJobTag(self.run_id)  # what `cancel` cancels

    @contextlib.contextmanager
    def epoch(self, number: int) -> Iterator[str]:
        """The jobs this thread submits in the block (one streaming epoch's) go to a job
        group of their own, which it yields: `cancel_epoch` cancels them alone. They
        keep the run's tag, so `cancel` still cancels them; the run's group comes back
        after the block."""
        group = f'{self.run_id}-epoch-{number}'
        self.sc.setJobGroup(group, self._description, interruptOnCancel=True)
        try:
            yield group
        finally:
            self.sc.setJobGroup(self.run_id, self._description, interruptOnCancel=True)

    def cancel_epoch(self, group: str) -> None:
        """Cancels the running jobs of one epoch's group (see `epoch`), not the run: the
        driver sees that epoch fail and goes on (the drain timeout)."""
        self.sc.cancelJobGroup(group)

    def cancel(self) -> None:
        # Cancelling stops the running jobs only: the flag stops the next. By job tag,
        # not group: Spark warns about a group without active jobs, and PySpark's Ctrl-C
        # handler may have cancelled them all already.
        self.cancelled.set()
        self.sc.cancelJobsWithTag(self.run_id)


def buffer_rdd(sc: SparkContext, plan: PipelinePlan, stage_rdds: dict[str, RDD | None],
               buffer_id: bytes) -> RDD:
    """The records of one buffer: the union of what its producers (their RDDs in
    `stage_rdds`, None for a producer that has none) wrote to it."""
    producers = [stage_rdds[s.name] for s in plan.producers(buffer_id)]
    return flattened(sc, [rdd for rdd in producers if rdd is not None], buffer_id)


def reshuffled(buffer: RDD, stage: StagePlan, num_partitions: int,
               deal: Callable) -> RDD:
    """A Reshuffle stage: `deal(input coder, output coder, output buffer, index,
    records)` routes each map partition's records round-robin (batch and streaming)."""
    (input_id, _), = stage.inputs.items()
    (output_id, output_buffer), = stage.outputs.items()
    input_coder = stage.input_coders[input_id]
    output_coder = stage.output_coders[output_id]

    def deal_partition(index, records):
        return deal(input_coder, output_coder, output_buffer, index, records)

    return (buffer.mapPartitionsWithIndex(deal_partition)
            .partitionBy(num_partitions, identity)
            .values())


def worker_plan(plan: PipelinePlan, run_id: str, bundle_size: int,
                num_partitions: int, master: str = 'local') -> WorkerPlan:
    """What every task of a run needs, broadcast once (batch and streaming).

    Only a local master's workers get the driver's import path: on a cluster the
    driver's directories mean nothing on other hosts (and on a shared filesystem
    would hide a module missing from `spark.submit.pyFiles` until the job moves)."""
    return WorkerPlan(
        run_id=run_id,
        components=plan.components,
        stages={s.name: s for s in plan.stages},
        groupings=groupings(plan),
        bundle_size=bundle_size,
        num_partitions=num_partitions,
        driver_sys_path=tuple(p for p in sys.path if p) if master.startswith('local') else ())


def count_uses(plan: PipelinePlan) -> dict[str, int]:
    """How many times each stage's output RDD is read (main and side inputs)."""
    uses: dict[str, int] = collections.Counter()
    for stage in plan.stages:
        uses[stage.name] += 0
        read = list(stage.inputs.values()) + [b for b, _ in stage.side_inputs.values()]
        for buffer_id in set(read):
            for producer in plan.producers(buffer_id):
                uses[producer.name] += 1
    return uses


def groupings(plan: PipelinePlan) -> dict[bytes, GroupingSpec]:
    """The `GroupingSpec` of every GroupByKey of `plan`, by its buffer id."""
    context = plan.execution_context
    components = context.pipeline_components
    specs = {}
    for buffer_id, transform_id in plan.gbk_transforms.items():
        transform = components.transforms[transform_id]
        assert transform.spec.urn == common_urns.primitives.GROUP_BY_KEY.urn
        input_pcoll = next(iter(transform.inputs.values()))
        output_pcoll = next(iter(transform.outputs.values()))
        input_coder = context.data_channel_coders[input_pcoll]
        key_coder_id, value_coder_id = kv_component_coder_ids(context, input_coder)
        specs[buffer_id] = GroupingSpec(
            input_coder_id=input_coder,
            key_coder_id=key_coder_id,
            value_coder_id=value_coder_id,
            output_coder_id=context.data_channel_coders[output_pcoll],
            windowing_strategy_id=components.pcollections[input_pcoll].windowing_strategy_id,
            step_name=transform.unique_name)
    return specs


def key_partition_fn(plan_bc, coder_id: str, key_coder_id: str, tag: str):
    def partition(records):
        return shuffles.key_partition(plan_bc, coder_id, key_coder_id, tag,
                                      (chunk for _, chunk in records))
    return partition


def retag(input_id: str):
    def retag(record):
        return input_id, record[1]
    return retag


def identity(partition: int) -> int:
    return partition


def discard(_record) -> None:
    return None
