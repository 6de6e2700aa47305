"""The batch driver: a bounded pipeline as a lineage of Spark RDDs (design section 5).

Each fused stage becomes one `mapPartitions` over its input records; edges
between stages are narrow (a materialized PCollection read by the next stage,
filtered by buffer id) or shuffles (GroupByKey, stateful ParDo input,
Reshuffle), all carrying chunks of Beam-encoded elements. Side inputs are
computed by earlier Spark jobs and broadcast. The rest of the pipeline runs as
one final Spark job. Stage outputs read more than once are persisted so no user
code runs twice. Job descriptions and RDD names carry the Beam step names, so
the Spark UI shows which Beam steps a Spark stage runs.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark import SparkContext, StorageLevel
from pyspark.rdd import RDD

from beam_streams_runner.driver.lineage import (
    PipelineJobs,
    buffer_rdd,
    count_uses,
    discard,
    identity,
    key_partition_fn,
    reshuffled,
    retag,
    worker_plan,
)
from beam_streams_runner.driver.plan import IMPULSE_BUFFER, PipelinePlan, StagePlan
from beam_streams_runner.driver.stage_kinds import stage_builder
from beam_streams_runner.errors import spark_failures_as_pipeline_errors
from beam_streams_runner.metrics import MetricTotals, MetricTotalsAccumulator
from beam_streams_runner.records import decode_with_raw
from beam_streams_runner.translators.file_commits import commit_files
from beam_streams_runner.translators.impulse import impulse_rdd
from beam_streams_runner.translators.side_inputs import side_input_state
from beam_streams_runner.worker import batch_tasks, shuffles
from beam_streams_runner.worker.warnings_relay import WarningsAccumulator, reissue


class BatchDriver:
    def __init__(self, sc: SparkContext, plan: PipelinePlan, bundle_size: int,
                 num_partitions: int | None = None,
                 on_progress: Callable[[str], None] | None = None) -> None:
        self.sc = sc
        self.plan = plan
        self._jobs = PipelineJobs(sc)
        self.run_id = self._jobs.run_id
        self.num_partitions = num_partitions or sc.defaultParallelism
        self.metrics = sc.accumulator(MetricTotals(), MetricTotalsAccumulator())
        self.warnings = sc.accumulator([], WarningsAccumulator())
        self._on_progress = on_progress or (lambda message: None)
        self._worker_plan = worker_plan(plan, self.run_id, bundle_size, self.num_partitions,
                                        master=sc.master)
        self._stage_rdds: dict[str, RDD] = {}
        self._side_chunks: dict[bytes, list[bytes]] = {}
        self._uses = count_uses(plan)

    def cancel(self) -> None:
        self._jobs.cancel()

    @spark_failures_as_pipeline_errors()
    def run(self) -> None:
        sc = self.sc
        self._jobs.start('Beam pipeline (StreamsSparkRunner)')
        self._plan_bc = sc.broadcast(self._worker_plan)
        try:
            for stage in self.plan.stages:
                if self._jobs.cancelled.is_set():
                    return
                self._stage_rdds[stage.name] = self._build(stage)
            leaves = [self._stage_rdds[s.name] for s in self.plan.stages
                      if self._uses[s.name] == 0 and self._stage_rdds[s.name] is not None]
            if leaves and not self._jobs.cancelled.is_set():
                final = leaves[0] if len(leaves) == 1 else sc.union(leaves)
                sc.setJobDescription('Beam pipeline: ' + ', '.join(
                    s.display_name for s in self.plan.stages if self._uses[s.name] == 0)[:900])
                self._on_progress('running the pipeline')
                final.foreach(discard)
        finally:
            reissue(self.warnings.value)
            for rdd in self._stage_rdds.values():
                if rdd is not None and rdd.is_cached:
                    rdd.unpersist()

    # Building the lineage ----------------------------------------------------------
    def _build(self, stage: StagePlan) -> RDD | None:
        sc = self.sc
        sc.setLocalProperty('callSite.short', stage.display_name[:200])
        sc.setLocalProperty('callSite.long', stage.display_name)
        rdd = stage_builder(self, stage.kind, streaming=False)(stage)
        if rdd is not None:
            rdd.setName(stage.display_name[:200])
            if self._uses[stage.name] > 1:
                rdd.persist(StorageLevel.MEMORY_AND_DISK)
        return rdd

    def _sdk_stage(self, stage: StagePlan) -> RDD:
        side_bc = None
        if stage.side_inputs:
            side_bc = self.sc.broadcast(side_input_state(
                self.plan, stage,
                {buffer: self._materialize(buffer) for buffer, _ in stage.side_inputs.values()}))
        grouping_input = None
        inputs = []
        for input_id, buffer_id in stage.inputs.items():
            if buffer_id == IMPULSE_BUFFER:
                inputs.append(impulse_rdd(
                    self.sc, input_id, self.num_partitions if stage.impulse_slices else 0))
            elif buffer_id.startswith(b'group:'):
                grouping_input = input_id
                spec = self._worker_plan.groupings[buffer_id]
                inputs.append(self._shuffled(
                    self._buffer(buffer_id), input_id,
                    key_partition_fn(self._plan_bc, spec.input_coder_id, spec.key_coder_id,
                                     input_id)))
            elif stage.stateful:
                coder_id = stage.input_coders[input_id]
                inputs.append(self._shuffled(
                    self._buffer(buffer_id), input_id,
                    key_partition_fn(self._plan_bc, coder_id, stage.key_coders[input_id],
                                     input_id)))
            else:
                inputs.append(self._buffer(buffer_id).map(retag(input_id)))
        source = inputs[0] if len(inputs) == 1 else self.sc.union(inputs)
        plan_bc, metrics, warnings, name = (
            self._plan_bc, self.metrics, self.warnings, stage.name)

        def run_partition(records):
            return batch_tasks.run_stage(
                plan_bc, name, side_bc, metrics, warnings, grouping_input, records)

        return source.mapPartitions(run_partition)

    def _reshuffled(self, stage: StagePlan) -> RDD | None:
        if not stage.outputs:
            return None  # Nothing reads this reshuffle's output.
        (input_id, buffer_id), = stage.inputs.items()
        (output_id, output_buffer), = stage.outputs.items()
        producers = self.plan.producers(buffer_id)
        if (producers and all(s.impulse_slices for s in producers)
                and stage.input_coders[input_id] == stage.output_coders[output_id]):
            # A Create read in slices is spread over the partitions already: its
            # Reshuffle would only move each slice to another task.
            return self._buffer(buffer_id).map(retag(output_buffer))
        plan_bc = self._plan_bc

        def deal(input_coder, output_coder, output_buffer, index, records):
            return shuffles.round_robin_partition(
                plan_bc, input_coder, output_coder, output_buffer, index,
                (chunk for _, chunk in records))

        return reshuffled(self._buffer(buffer_id), stage, self.num_partitions, deal)

    def _committed_files(self, stage: StagePlan) -> RDD | None:
        """Runs the job that writes a file sink's files, then commits them here
        (`translators/file_commits`); the final files' names, where something reads
        them."""
        (input_id, buffer_id), = stage.inputs.items()
        self.sc.setJobDescription(f'Beam pipeline: {stage.display_name}'[:900])
        self._on_progress(f'writing the files of {", ".join(stage.step_names)}')
        chunks = self._buffer(buffer_id).values().collect()
        runtime = self._worker_plan.runtime()
        written = runtime.coder_impl(stage.input_coders[input_id])
        results = [wv.value for chunk in chunks for wv, _ in decode_with_raw(written, chunk)]
        finals = commit_files(stage.commit_files, results)
        if not stage.outputs or self._uses[stage.name] == 0:
            return None
        (output_id, output_buffer), = stage.outputs.items()
        impl = runtime.coder_impl(stage.output_coders[output_id])
        return self.sc.parallelize(
            [(output_buffer, b''.join(impl.encode_nested(v) for v in finals))], 1)

    def _shuffled(self, buffer: RDD, input_id: str, partition_fn) -> RDD:
        return buffer.mapPartitions(partition_fn).partitionBy(
            self.num_partitions, identity).values()

    def _buffer(self, buffer_id: bytes) -> RDD:
        """The records of one buffer: the union of what its producers wrote to it."""
        return buffer_rdd(self.sc, self.plan, self._stage_rdds, buffer_id)

    def _materialize(self, buffer_id: bytes) -> list[bytes]:
        if buffer_id not in self._side_chunks:
            self.sc.setJobDescription(
                f"Beam side input {buffer_id.decode('utf-8', 'replace')}")
            self._on_progress(f'computing side input {buffer_id.decode("utf-8", "replace")}')
            self._side_chunks[buffer_id] = self._buffer(buffer_id).values().collect()
        return self._side_chunks[buffer_id]
