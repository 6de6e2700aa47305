"""Where a streaming run keeps its state, and its consistent regions (design 8, 12).

`Checkpointing.start` picks the store the partitions' keyed state goes to and,
when consistent regions are on (`--checkpoint_period_s` > 0), opens the job in
its checkpoint store (refusing a changed pipeline or a wiped store), makes one
`ConsistentRegionController` per region of the layout over the driver's members
(source positions, side-input buffers, partition revisions), and resumes them
from the newest consistent cuts. With regions off, state goes to a temporary
directory removed at the end, as a run without checkpoints needs nothing after it.

A job that finishes (every watermark at +inf) deletes its checkpoints: there is
nothing to resume. A job that fails, is cancelled or drained keeps them, and the
run logs the `--job_name` that resumes it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence

from beam_streams_runner.checkpoint_options import CheckpointSettings, new_job_name
from beam_streams_runner.driver.plan import PipelinePlan
from beam_streams_runner.errors import (
    InvalidPipelineError,
    StoreNotSharedError,
    WorkerPythonError,
)
from beam_streams_runner.option_types import SecretUrl
from beam_streams_runner.regions.commit_records import (
    CheckpointLedger,
    CheckpointStateError,
    PipelineGraph,
)
from beam_streams_runner.regions.controller import ConsistentRegionController
from beam_streams_runner.regions.hooks import RegionMember
from beam_streams_runner.regions.layout import RegionLayout, RegionLayoutError
from beam_streams_runner.stores import store_from_url
from beam_streams_runner.stores.base import CheckpointStore
from beam_streams_runner.stores.local_directory import LocalDirectoryStore
from beam_streams_runner.worker.partition_cache import mark_run

_LOGGER = logging.getLogger(__name__)
_NOT_MENDED_BY_RESET = (WorkerPythonError, InvalidPipelineError, CheckpointStateError,
                        StoreNotSharedError)


def stage_regions(plan: PipelinePlan, layout: RegionLayout) -> dict[str, frozenset[str]]:
    """Each region's stages. A stage's Beam steps must share one region (or all be
    autonomous: the stage is then in none); a stage without user steps (a shuffle)
    goes with the stages feeding it. Raises `RegionLayoutError`."""
    assignment = layout.assign(step for s in plan.stages for step in s.step_names)
    of_stage: dict[str, str | None] = {}
    problems = []
    for stage in plan.stages:  # producers first: a shuffle takes its inputs' region
        regions = {assignment[step] for step in stage.step_names}
        if not stage.step_names:
            regions = {of_stage.get(p.name) for b in stage.inputs.values()
                       for p in plan.producers(b)} or {None}
        if len(regions) > 1:
            problems.append(f'the steps {stage.step_names} run fused in one stage but belong '
                            f'to {sorted(str(r) for r in regions)}; put them in one region')
        of_stage[stage.name] = next(iter(regions))
    edges = [(p.name, stage.name) for stage in plan.stages for b in stage.inputs.values()
             for p in plan.producers(b)]
    crossing = {(of_stage[a], of_stage[b]) for a, b in edges
                if of_stage[a] and of_stage[b] and of_stage[a] != of_stage[b]}
    problems += [f'region {a!r} feeds region {b!r}: regions must be independent; merge them '
                 'or make the boundary steps autonomous' for a, b in sorted(crossing)]
    if problems:
        raise RegionLayoutError(problems, "The consistent regions do not fit the pipeline's "
                                          'stages')
    regions: dict[str, set[str]] = {}
    for stage_name, region in of_stage.items():
        if region is not None:
            regions.setdefault(region, set()).add(stage_name)
    return {name: frozenset(stages) for name, stages in regions.items()}


class Checkpointing:
    """The store of a streaming run and, when enabled, its region controllers."""

    def __init__(self, settings: CheckpointSettings | None, plan: PipelinePlan,
                 partitions: int, run_id: str) -> None:
        self.settings = settings
        self.enabled = settings is not None and settings.enabled
        self.job_name = (settings and settings.job_name) or new_job_name()
        self.store_id = run_id
        # Checked before any Spark job runs (the driver is built before the run starts).
        self.regions = stage_regions(plan, settings.layout) if self.enabled else {}
        self.controllers: list[ConsistentRegionController] = []
        self._plan = plan
        self._publishing = frozenset(s.name for s in plan.stages if s.publishes)
        self._partitions = partitions
        self._temporary: str | None = None
        self._ledger: CheckpointLedger | None = None
        self._reserved_until = 0
        self.store: CheckpointStore
        self.state_prefix = ''

    def start(self, members: Sequence[RegionMember]) -> int:
        """Opens the store and resumes the regions; returns the first epoch to run."""
        if not self.enabled:
            self._start_without_regions()
            return 0
        settings = self.settings
        url = settings.store_url_for(self.job_name)
        self._open_store(url)
        label = url.redacted
        ledger = self._ledger = CheckpointLedger(self.store, self.job_name, label)
        self.state_prefix = ledger.state_prefix
        resumed = ledger.open(PipelineGraph(
            tuple((s.name, s.kind, tuple(sorted(s.step_names))) for s in self._plan.stages),
            self._partitions), settings.restart_from_scratch)
        mark_run(self.store, self.state_prefix, self.store_id)
        self.controllers = [ConsistentRegionController(
            name, stages, ledger, members, settings.period_s,
            settings.mode == 'non_blocking', settings.max_consecutive_reset_attempts,
            settings.reset_timeout_s)
            for name, stages in self.regions.items()]
        # Before the first cut a region resumes from its initial state.
        cuts = [c.resume() for c in self.controllers]
        first = max([ledger.first_free_epoch()] + [c.epoch + 1 for c in cuts if c is not None])
        _LOGGER.info('Checkpoints of job %r go to %s every %g s; to resume it after a '
                     'failure, run the same command with --job_name=%s', self.job_name,
                     label, settings.period_s, self.job_name)
        if resumed and any(cuts):
            _LOGGER.info('Job %r resumes from its checkpoints %s at epoch %d', self.job_name,
                         {c.name: c.sequence_id for c in self.controllers}, first)
        return first

    def _open_store(self, url: SecretUrl) -> None:
        self.store = store_from_url(url.reveal(), hmac_key_env=self.settings.hmac_key_env)
        self.store.check()  # an unreachable store fails before any Spark job

    def _start_without_regions(self) -> None:
        """The run's state goes to --checkpoint_store when given (under the run's own
        prefix, deleted at the end: a store every host of a cluster reaches), else to a
        temporary directory of this host."""
        settings = self.settings
        if settings is not None and settings.store_url is not None:
            self._open_store(settings.store_url)
            self.state_prefix = f'runs/{self.store_id}/'
        else:
            self._temporary = tempfile.mkdtemp(prefix=f'{self.store_id}-state-')
            self.store = LocalDirectoryStore(self._temporary)
        mark_run(self.store, self.state_prefix, self.store_id)

    def before_epoch(self, epoch: int) -> None:
        """Reserves epoch numbers, so a later driver of the job never reuses one."""
        if self._ledger is not None and epoch >= self._reserved_until:
            self._reserved_until = self._ledger.reserve_epochs(epoch)

    def after_epoch(self, epoch: int, requested: bool) -> None:
        for controller in self.controllers:
            controller.after_epoch(epoch, requested)

    def published_through(self) -> dict[str, int]:
        """Each publishing stage of a region -> the epoch of the region's newest
        consistent cut (-1: none yet): what its publish gate may release."""
        return {stage: controller.consistent_epoch for controller in self.controllers
                for stage in controller.stages if stage in self._publishing}

    def seconds_to_next_cut(self) -> float | None:
        """How long until some region cuts (None: consistent regions are off)."""
        return min((c.seconds_to_next_cut() for c in self.controllers), default=None)

    @property
    def region_stages(self) -> frozenset[str]:
        """The stages of every region (the others are autonomous)."""
        return frozenset().union(*self.regions.values())

    def reset(self, cause: BaseException) -> None:
        """Resets every region after `cause` failed an epoch (or raises, see controller).
        A failure no replay can mend (the workers' Python, the stored checkpoints
        themselves) is raised at once."""
        if isinstance(cause, _NOT_MENDED_BY_RESET):
            raise cause
        for controller in self.controllers:
            controller.reset(cause)

    def drain(self, epoch: int) -> None:
        """A last cut of every region after `epoch`, waited for."""
        for controller in self.controllers:
            controller.cut(epoch, wait=True)

    def close(self, finished: bool) -> None:
        """Stops the controllers; a finished job's checkpoints (or the temporary state of
        a run without them) are deleted."""
        try:
            for controller in self.controllers:
                controller.close()
        finally:
            if self._temporary is not None:
                shutil.rmtree(self._temporary, ignore_errors=True)
            elif not self.enabled and self.state_prefix:
                for entry in self.store.entries(prefix=self.state_prefix):
                    self.store.delete_entry(entry)
            elif finished and self._ledger is not None:
                self._ledger.delete_job()
