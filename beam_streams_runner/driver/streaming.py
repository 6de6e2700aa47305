"""The streaming driver: epochs of Spark jobs over one stage DAG (design section 5).

Each epoch is one Spark job running every stage of the pipeline once, with
watermarks in band (`records.Punctuation`, see `worker.epoch_tasks`). Between epochs
the driver keeps what belongs to the sources: the residual restrictions of
every splittable DoFn (with their resume times and watermark holds), the events
of a TestStream still to play, and the processing-time clock. In an epoch the
restrictions that are due are dealt to the source stage's tasks and read,
furthest behind first, read slice after read slice (each of whole source
bundles of at most `bundle_size` elements or `bundle_time_ms`, see
`par_do.FusedStageOperator`) for the epoch's read budget; what is left comes
back as a residual. Stateful operators live in their partitions across epochs
(`worker.partition_cache`).

Adaptive epochs (`read_budget`): an epoch costs a fixed part (scheduling, shuffles,
state) on top of its reading. The driver measures that part after every epoch and
gives the next one the read budget `target_latency_ms` minus it (at least a quarter
of the goal), so an element waits about one epoch: its reading, then the rest of the
job. A source with no backlog hands its restriction back early (see
`read.ReadInEpochs.read_on`), so under a light load epochs get short and latency low;
under a backlog (the goal lost already) they grow, up to a few times the goal, so
the fixed part is paid less often and the backlog ends sooner.

A stage whose inputs all come from finished stages and whose partitions all
reported the output watermark +inf with nothing left (no residual, no timer)
can never output again: it is finished and left out of later epochs (a bounded
branch such as Impulse -> Create -> Reshuffle feeding a source's restrictions
would otherwise rerun in every epoch); its consumers hear no channel of it,
which leaves their input watermark to their other inputs.

After every epoch the driver turns its reports into a progress record
(`progress.EpochProgress`): logged as one line, kept for `result.progress()`,
and carried by the next epoch's Spark job description.

The pipeline ends when every stage partition reports the output watermark +inf
and no residual or TestStream event is left; a TestStream plays one event per
epoch, with processing time starting at 0 and moved only by its events, so a
test sees exactly the interleaving it wrote.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator

from apache_beam.runners.portability.fn_api_runner.execution import ENCODED_IMPULSE_VALUE
from apache_beam.utils.timestamp import Timestamp
from pyspark import SparkContext, StorageLevel
from pyspark.broadcast import Broadcast
from pyspark.rdd import RDD

from beam_streams_runner.checkpoint_options import CheckpointSettings
from beam_streams_runner.driver.checkpointing import Checkpointing
from beam_streams_runner.driver.draining import EpochWatch, end_drain
from beam_streams_runner.driver.lineage import (
    PipelineJobs,
    buffer_rdd,
    count_uses,
    discard,
    identity,
    reshuffled,
    retag,
    worker_plan,
)
from beam_streams_runner.driver.partition_revisions import PartitionRevisions
from beam_streams_runner.driver.plan import IMPULSE_BUFFER, PipelinePlan, StagePlan
from beam_streams_runner.driver.progress import Endpoints, EpochProgress, summary
from beam_streams_runner.driver.read_budget import ReadBudget
from beam_streams_runner.driver.side_input_buffers import SideInputBuffers
from beam_streams_runner.driver.source_positions import SourcePositions
from beam_streams_runner.driver.source_splits import SourceSplitter
from beam_streams_runner.driver.stage_kinds import STAGE_KINDS, stage_builder
from beam_streams_runner.errors import (
    PipelineExecutionError,
    pipeline_error_from_spark,
    spark_failures_as_pipeline_errors,
)
from beam_streams_runner.metrics import RUNNER_NAMESPACE, MetricTotals, MetricTotalsAccumulator
from beam_streams_runner.records import MAX_WATERMARK, Punctuation
from beam_streams_runner.regions import fault_points
from beam_streams_runner.translators.read import Residual
from beam_streams_runner.translators.test_stream import TestStreamEvents, TestStreamStep
from beam_streams_runner.worker import epoch_tasks, shuffles
from beam_streams_runner.worker.epoch_info import (
    DueResiduals,
    EpochInfo,
    PartitionReport,
    ReportsAccumulator,
)
from beam_streams_runner.worker.warnings_relay import WarningsAccumulator, reissue

_LOGGER = logging.getLogger(__name__)
_IDLE_WAIT_S = 1.0  # longest sleep when nothing is due, so cancel() stays prompt


@dataclasses.dataclass
class EpochJob:
    """What building one epoch's stage RDDs shares: the epoch, its broadcast, the
    residuals due per stage, the TestStream steps, and what was built so far."""

    number: int
    epoch_bc: Broadcast
    due: dict[str, list[Residual]]
    steps: dict[str, TestStreamStep | None]
    stage_rdds: dict[str, RDD | None] = dataclasses.field(default_factory=dict)
    collected: dict[bytes, bool] = dataclasses.field(default_factory=dict)  # side buffers
    impulses: set[str] = dataclasses.field(default_factory=set)  # stages fed an Impulse


class StreamingDriver:
    def __init__(self, sc: SparkContext, plan: PipelinePlan, bundle_size: int,
                 bundle_time_ms: int, num_partitions: int | None = None,
                 on_progress: Callable[[str], None] | None = None,
                 target_latency_ms: int = 1000, keyed_state_gc: bool = True,
                 endpoints: Endpoints | None = None,
                 checkpoint: CheckpointSettings | None = None) -> None:
        self.sc = sc
        self.plan = plan
        self._jobs = PipelineJobs(sc)
        self.run_id = self._jobs.run_id
        self.num_partitions = num_partitions or sc.defaultParallelism
        self.bundle_time_ms = bundle_time_ms
        self.target_latency_ms = target_latency_ms
        self.keyed_state_gc = keyed_state_gc
        self._read_budget = ReadBudget(
            target_latency_ms, checkpoint.period_s if checkpoint is not None else 0.0)
        self.metrics = sc.accumulator(MetricTotals(), MetricTotalsAccumulator())
        self.warnings = sc.accumulator([], WarningsAccumulator())
        self.reports = sc.accumulator({}, ReportsAccumulator())
        self._on_progress = on_progress or (lambda message: None)
        self.progress = EpochProgress(plan.stages, endpoints)
        self._worker_plan = worker_plan(plan, self.run_id, bundle_size, self.num_partitions,
                                        master=sc.master)
        self._uses = count_uses(plan)
        self.epochs = 0
        # What the driver keeps between epochs, each a consistent-region member.
        self.sources = SourcePositions(self._test_stream_events, frozenset(
            s.name for s in plan.stages if s.kind == 'test_stream'))
        self.side_inputs = SideInputBuffers(sc, plan)
        coders = plan.execution_context.pipeline_context.coders
        self._splitter = SourceSplitter(lambda coder_id: coders[coder_id].get_impl(),
                                        self.num_partitions)
        self.revisions = PartitionRevisions()
        self.checkpointing = Checkpointing(checkpoint, plan, self.num_partitions, self.run_id)
        self._draining = threading.Event()
        self._watch = EpochWatch.of_run(self._jobs, self.checkpointing)
        self._drained = False  # the run stopped for a drain

    @property
    def read_budget_ms(self) -> int:
        """How long the next epoch's source tasks read (`read_budget`)."""
        return self._read_budget.ms

    def cancel(self) -> None:
        self._jobs.cancel()

    def drain(self) -> None:
        """Stops after the running epoch, with a last checkpoint of every region, waited
        for; the running epoch gets at most --drain_timeout_s (see `draining`)."""
        self._draining.set()
        self._watch.drain_requested()

    def drained(self) -> bool:
        """Whether the run stopped for a drain (False: it finished before it got there)."""
        return self._drained

    @spark_failures_as_pipeline_errors()
    def run(self) -> None:
        self._jobs.start('Beam streaming pipeline (StreamsSparkRunner)')
        self._plan_bc = self.sc.broadcast(self._worker_plan)
        finished = False
        try:
            first = self.checkpointing.start([self.sources, self.side_inputs, self.revisions])
            finished = self._run_epochs(first)
        finally:
            reissue(self.warnings.value)
            self.side_inputs.close()
            self.checkpointing.close(finished)

    def _run_epochs(self, first: int) -> bool:
        """Runs epochs from `first` on; True once the pipeline finished, False when it was
        cancelled or drained. A failed epoch resets the consistent regions (if on), and
        so does one the drain timeout cancelled (with regions off it fails the run)."""
        sources, checkpointing = self.sources, self.checkpointing
        clock = 0 if sources.test_streaming else Timestamp.now().micros
        next_wakeup: int | None = None
        succeeded: int | None = None  # the last epoch that did, since the start or a reset
        for epoch in itertools.count(first):
            if self._jobs.cancelled.is_set():
                return False
            if self._draining.is_set():
                end_drain(checkpointing, epoch - 1, cut=succeeded == epoch - 1)
                self._drained = True
                return False
            steps = sources.next_test_steps()
            if sources.test_streaming:
                sources.test_clock += max((s.advance_processing_time_by for s in steps.values()
                                           if s), default=0)
                clock = sources.test_clock
            else:
                if next_wakeup is not None and not sources.any_due(clock):
                    self._jobs.cancelled.wait(min(
                        _IDLE_WAIT_S, max(0.0, (next_wakeup - clock) / 1e6)))
                clock = max(clock, Timestamp.now().micros)
            try:
                checkpointing.before_epoch(epoch)
                reports = self._run_epoch(epoch, clock, steps)
                fault_points.reached(fault_points.AFTER_EPOCH_DELTAS)
                checkpointing.after_epoch(epoch, any(
                    r.checkpoint_requested for r in reports.values()))
            except Exception as exc:
                timeout = self._watch.timeout_error(epoch)
                if self._jobs.cancelled.is_set() or not checkpointing.enabled:
                    if timeout is not None and not self._jobs.cancelled.is_set():
                        raise timeout from None  # not Spark's cancellation: no CANCELLED
                    raise
                checkpointing.reset(timeout or pipeline_error_from_spark(exc))
                sources.epoch_failed(checkpointing.region_stages)
                next_wakeup = None
                continue
            self.epochs += 1
            succeeded = epoch
            if self._finished(reports, steps):
                return True
            next_wakeup = self._next_wakeup(reports, steps, clock)
        return False

    def _next_wakeup(self, reports: dict[tuple[str, int], PartitionReport],
                     steps: dict[str, TestStreamStep | None], clock: int) -> int | None:
        """When something is due next: a processing-time timer, a residual, or the cut
        that lets output waiting in a publish gate out."""
        due = [r.next_processing_time for r in reports.values()
               if r.next_processing_time is not None]
        resume = self.sources.next_due()
        if resume is not None:
            due.append(resume)
        to_cut = self.checkpointing.seconds_to_next_cut()
        if to_cut is not None and any(r.unpublished for r in reports.values()):
            due.append(clock + int(to_cut * 1e6))
        next_wakeup = min(due, default=None)
        if next_wakeup is None and not any(steps.values()):
            stuck = sorted({stage for (stage, _), report in reports.items()
                            if report.output_watermark < MAX_WATERMARK})
            raise RuntimeError(
                'StreamsSparkRunner streaming driver: nothing can make progress '
                '(no source residuals, timers or TestStream events left) but the '
                f'watermarks of {stuck} are not at +inf.')
        return next_wakeup

    # One epoch -------------------------------------------------------------------
    def _run_epoch(self, epoch: int, clock: int, steps: dict[str, TestStreamStep | None]
                   ) -> dict[tuple[str, int], PartitionReport]:
        sc = self.sc
        due, holds = self.sources.take_due(clock)
        checkpointing = self.checkpointing
        epoch_bc = sc.broadcast(EpochInfo(
            number=epoch, processing_time=clock, holds=holds, store=checkpointing.store,
            store_id=checkpointing.store_id, state_prefix=checkpointing.state_prefix,
            bases=dict(self.revisions.bases), keep=self.revisions.keep(),
            published_through=checkpointing.published_through(),
            bundle_time_ms=self.bundle_time_ms, read_budget_ms=self.read_budget_ms,
            keyed_state_gc=self.keyed_state_gc))
        started, started_at = time.monotonic(), time.time()
        job = EpochJob(epoch, epoch_bc, due, steps)
        stage_rdds = job.stage_rdds
        try:
            with self._watch.epoch(epoch):  # its own job group, the drain timeout
                for stage in self.plan.stages:
                    sc.setLocalProperty('callSite.short', stage.display_name[:200])
                    rdd = (None if stage.name in self.sources.finished
                           else stage_builder(self, stage.kind, streaming=True)(stage, job))
                    # No RDD names per epoch: each costs a JVM round trip; the call
                    # site and the job description name the stages and the epoch.
                    if rdd is not None and self._uses[stage.name] > 1:
                        rdd.persist(StorageLevel.MEMORY_AND_DISK)
                    stage_rdds[stage.name] = rdd
                leaves = [stage_rdds[s.name] for s in self.plan.stages
                          if self._uses[s.name] == 0 and stage_rdds[s.name] is not None]
                sc.setJobDescription(self.progress.job_description(epoch))
                if leaves:
                    (leaves[0] if len(leaves) == 1 else sc.union(leaves)).foreach(discard)
        finally:
            for rdd in stage_rdds.values():
                if rdd is not None and rdd.is_cached:
                    rdd.unpersist()
            epoch_bc.destroy()
        reports = {(stage, index): report
                   for (number, stage, index), report in self.reports.value.items()
                   if number == epoch}
        self.reports.value = {}
        if not reports and any(rdd is not None and STAGE_KINDS[s.kind].reports
                               for s in self.plan.stages
                               for rdd in (stage_rdds.get(s.name),)):
            # Every task succeeded but no report reached the driver (an accumulator
            # update Spark could not deliver): finishing on no reports would lose data.
            raise PipelineExecutionError(
                f'Epoch {epoch}: no partition report reached the driver although its '
                'tasks succeeded (see the Spark log for "Failed to update accumulator"); '
                'the driver and the workers may run different versions of the runner.')
        wall_s = time.monotonic() - started
        self._on_progress(summary(self.progress.add(
            epoch, started_at, wall_s, reports, self.read_budget_ms)))
        self._read_budget.after_epoch(
            wall_s, max((r.read_s for r in reports.values()), default=0.0),
            behind=any(r.resume_delay_s <= 0 for report in reports.values()
                       for r in report.residuals))
        self._set_gauges(reports)
        self._find_finished_stages(reports)
        self.revisions.advance((partition, r.revision) for partition, r in reports.items())
        self.sources.impulses_fired |= job.impulses
        for (stage_name, _), report in reports.items():
            for residual in report.residuals:
                self.sources.add(stage_name, residual,
                                 clock + int(residual.resume_delay_s * 1e6))
        self._observe_reads(job, reports)
        return reports

    def _observe_reads(self, job: EpochJob, reports: dict[tuple[str, int], PartitionReport]
                       ) -> None:
        """Tells the source splitter what each source stage read of what it was dealt."""
        for stage in self.plan.stages:
            if job.due.get(stage.name):
                mine = [r for (name, _), r in reports.items() if name == stage.name]
                self._splitter.observe(stage, [x for r in mine for x in r.residuals],
                                       sum(r.read_s for r in mine))

    def _find_finished_stages(self, reports: dict[tuple[str, int], PartitionReport]) -> None:
        """Adds the stages that can never output again to `_finished_stages`."""
        by_stage: dict[str, list[PartitionReport]] = collections.defaultdict(list)
        for (stage_name, _), report in reports.items():
            by_stage[stage_name].append(report)
        for stage in self.plan.stages:  # in topological order: producers first
            finished = self.sources.finished
            if stage.name in finished or not STAGE_KINDS[stage.kind].finishes:
                continue
            buffers = [*stage.inputs.values(), *(b for b, _ in stage.side_inputs.values())]
            if not all(producer.name in finished
                       for buffer_id in buffers for producer in self.plan.producers(buffer_id)):
                continue
            if STAGE_KINDS[stage.kind].reports:
                own = by_stage.get(stage.name)
                if (not own or self.sources.pending(stage.name)
                        or any(r.output_watermark < MAX_WATERMARK or r.residuals
                               or r.next_processing_time is not None for r in own)):
                    continue
            finished.add(stage.name)

    def _set_gauges(self, reports: dict[tuple[str, int], PartitionReport]) -> None:
        """The runner's gauges: each count summed over the partitions of its step."""
        summed: dict[tuple[str, str], int] = collections.Counter()
        for report in reports.values():
            for key, count in report.sizes.items():
                summed[key] += count
        if summed:
            totals = MetricTotals()
            for (step, name), count in summed.items():
                totals.set_gauge(step, RUNNER_NAMESPACE, name, count)
            self.metrics.add(totals)

    def _finished(self, reports: dict[tuple[str, int], PartitionReport],
                  steps: dict[str, TestStreamStep | None]) -> bool:
        return (all(r.output_watermark >= MAX_WATERMARK for r in reports.values())
                and not self.sources.pending()
                and not any(steps.values()))

    # Stage RDDs of one epoch -----------------------------------------------------
    def _sdk_stage(self, stage: StagePlan, job: EpochJob) -> RDD:
        sc = self.sc
        stage_rdds, epoch_bc, epoch = job.stage_rdds, job.epoch_bc, job.number
        residuals = job.due.get(stage.name, [])
        side_view = (self.side_inputs.view(stage, epoch, job.collected,
                                           lambda b: self._buffer(b, stage_rdds))
                     if stage.side_inputs else None)
        plan_bc = self._plan_bc
        grouping_input = None
        inputs = []
        for input_id, buffer_id in stage.inputs.items():
            if buffer_id == IMPULSE_BUFFER:
                records = []
                if stage.name not in self.sources.impulses_fired:
                    records.append((input_id, ENCODED_IMPULSE_VALUE))
                    job.impulses.add(stage.name)
                records.append((input_id, Punctuation(('impulse', 0), MAX_WATERMARK)))
                inputs.append(sc.parallelize(records, 1))
                continue
            if buffer_id.startswith(b'group:'):
                grouping_input = input_id
                spec = self._worker_plan.groupings[buffer_id]
                coder_id, key_coder_id = spec.input_coder_id, spec.key_coder_id
            elif stage.stateful:
                coder_id, key_coder_id = stage.input_coders[input_id], stage.key_coders[input_id]
            elif stage.side_inputs or stage.publishes:
                # Pushed-back or staged elements stay in their partition: fixed partitions.
                inputs.append(self._buffer(buffer_id, stage_rdds).mapPartitionsWithIndex(
                    _dealt_fn(self.num_partitions, input_id)
                ).partitionBy(self.num_partitions, identity).values())
                continue
            else:
                inputs.append(self._buffer(buffer_id, stage_rdds).map(retag(input_id)))
                continue
            inputs.append(self._buffer(buffer_id, stage_rdds).mapPartitions(
                _keyed_shuffle_fn(plan_bc, coder_id, key_coder_id, input_id)
            ).partitionBy(self.num_partitions, identity).values())
        if residuals or self.sources.pending(stage.name):
            # Dealt by rank, the slowest to task 0, the next to task 1, ...: each task
            # reads its furthest-behind restriction first (`read_on`), so the slowest of
            # the whole stage read at once; with fewer than tasks, one is split so every
            # task reads (`source_splits`). One record per slice: Spark gives each its own.
            # With none due but some kept for later, one task still runs: it sends the
            # stage's watermark, held by the kept ones (`EpochInfo.holds`). Without it a
            # stage fed only by finished stages has no task, its consumers hear no
            # channel of it and take +inf, and drop what it reads later as late.
            dealt = self._splitter.deal(stage, residuals, self.read_budget_ms / 1000.0)
            inputs.append(sc.parallelize([('', DueResiduals(d)) for d in dealt], len(dealt)))
        source = inputs[0] if len(inputs) == 1 else sc.union(inputs)
        metrics, warnings, reports, name = self.metrics, self.warnings, self.reports, stage.name
        counted = self.progress.counted.get(stage.name, ())

        def run_partition(index, records):
            return epoch_tasks.run_stage_epoch(
                plan_bc, epoch_bc, name, metrics, warnings, reports, grouping_input, index,
                records, side_view, counted)

        return source.mapPartitionsWithIndex(run_partition)

    def _reshuffled(self, stage: StagePlan, job: EpochJob) -> RDD | None:
        if not stage.outputs:
            return None
        (_, buffer_id), = stage.inputs.items()
        plan_bc = self._plan_bc

        def deal(input_coder, output_coder, output_buffer, index, records):
            return shuffles.round_robin_shuffle(
                plan_bc, input_coder, output_coder, output_buffer, index, records)

        return reshuffled(self._buffer(buffer_id, job.stage_rdds), stage, self.num_partitions,
                          deal)

    def _test_stream_rdd(self, stage: StagePlan, job: EpochJob) -> RDD:
        step = job.steps.get(stage.name)
        records: list = list(step.records) if step is not None else []
        watermarks = step.watermarks if step is not None else {
            buffer: MAX_WATERMARK for buffer in stage.outputs.values()}
        records.extend((buffer, Punctuation((stage.name, 0), watermark))
                       for buffer, watermark in watermarks.items())
        return self.sc.parallelize(records, 1)

    def _buffer(self, buffer_id: bytes, stage_rdds: dict[str, RDD | None]) -> RDD:
        return buffer_rdd(self.sc, self.plan, stage_rdds, buffer_id)

    def _test_stream_events(self, stage_name: str) -> Iterator[TestStreamStep]:
        """The events of TestStream stage `stage_name`, from its first."""
        context = self.plan.execution_context.pipeline_context
        stage = next(s for s in self.plan.stages if s.name == stage_name)
        outputs = {
            tag: (stage.outputs[output_id],
                  context.coders[stage.output_coders[output_id]].get_impl())
            for tag, output_id in stage.test_stream_outputs.items()}
        return TestStreamEvents(stage.test_stream, context, outputs).steps()


def _dealt_fn(num_partitions: int, tag: str):
    def deal(index, records):
        return shuffles.dealt_chunks(num_partitions, tag, index, records)
    return deal


def _keyed_shuffle_fn(plan_bc, coder_id: str, key_coder_id: str, tag: str):
    def shuffle(records):
        return shuffles.keyed_shuffle(plan_bc, coder_id, key_coder_id, tag, records)
    return shuffle
