"""Draining a streaming run: its end, and how long it waits for the running epoch.

`StreamingDriver.drain` (`result.drain()`, SIGTERM) stops the run after the
running epoch: on epochs the drain of a consistent region is the epoch boundary
(design section 12), so `end_drain` then takes a last cut of every region, waited
for (durable), and the same `--job_name` resumes from it. With consistent regions
off nothing is checkpointed: the run stops, and says it cannot be resumed.

A cut, and a drain, wait for the running epoch's Spark job to end. `EpochWatch`
bounds that wait by `--drain_timeout_s`. With consistent regions on, every epoch
boundary may be a cut, so every epoch gets that long from its start; with them off
only a drain waits, so the running epoch gets that long from the drain request. An
epoch past its deadline has its Spark jobs cancelled, by its own job group
(`PipelineJobs.epoch`: the run and its later epochs go on), and fails with
`EpochTimeoutError`, a fault like any other: the regions reset and replay it, or,
with them off, the run fails with that error. The cancellation is never taken for
the user's (`PipelineJobs.cancelled` stays clear).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from beam_streams_runner.checkpoint_options import DEFAULT_DRAIN_TIMEOUT_S
from beam_streams_runner.driver.checkpointing import Checkpointing
from beam_streams_runner.driver.lineage import PipelineJobs
from beam_streams_runner.errors import PipelineExecutionError

_LOGGER = logging.getLogger(__name__)


class EpochTimeoutError(PipelineExecutionError):
    """An epoch ran longer than --drain_timeout_s while a cut or a drain waited for it."""


def end_drain(checkpointing: Checkpointing, last_epoch: int, cut: bool) -> None:
    """Ends a drain after epoch `last_epoch`: a last cut of every region, waited for.
    `cut` False: no epoch succeeded since the start or the last reset, so the newest
    cut already holds this state (and a cut after a reset would label it with an epoch
    whose output was discarded)."""
    if not checkpointing.enabled:
        _LOGGER.warning(
            'Drained after epoch %d with consistent regions off (--checkpoint_period_s=0): '
            'nothing was checkpointed, so this run cannot be resumed; running it again '
            'starts from the beginning.', last_epoch)
        return
    if cut:
        checkpointing.drain(last_epoch)
    _LOGGER.info('Job %r drained after epoch %d, its last checkpoint stored; to resume it, '
                 'run the same command with --job_name=%s', checkpointing.job_name,
                 last_epoch, checkpointing.job_name)


class EpochWatch:
    """Cancels the running epoch's Spark jobs once it is past its deadline (see above)."""

    @classmethod
    def of_run(cls, jobs: PipelineJobs, checkpointing: Checkpointing) -> EpochWatch:
        """The watch of a streaming run: every epoch when its regions are on."""
        settings = checkpointing.settings
        return cls(jobs, settings.drain_timeout_s if settings else DEFAULT_DRAIN_TIMEOUT_S,
                   every_epoch=checkpointing.enabled)

    def __init__(self, jobs: PipelineJobs, timeout_s: float, every_epoch: bool) -> None:
        self._jobs = jobs
        self.timeout_s = timeout_s
        self._every_epoch = every_epoch  # consistent regions on: every boundary may cut
        self._lock = threading.Lock()
        self._running: tuple[int, str, float] | None = None  # epoch, job group, start
        self._timer: threading.Timer | None = None
        self._drain_at: float | None = None
        self._expired: int | None = None  # the epoch whose jobs it cancelled

    @contextlib.contextmanager
    def epoch(self, number: int) -> Iterator[None]:
        """Watches epoch `number` while the block submits its Spark jobs."""
        with self._jobs.epoch(number) as group:
            with self._lock:
                self._running = (number, group, time.monotonic())
                self._arm()
            try:
                yield
            finally:
                with self._lock:
                    self._running = None
                    if self._timer is not None:
                        self._timer.cancel()
                        self._timer = None

    def drain_requested(self) -> None:
        """A drain waits for the running epoch (and for one starting meanwhile)."""
        with self._lock:
            if self._drain_at is None:
                self._drain_at = time.monotonic()
                self._arm()

    def timeout_error(self, number: int) -> EpochTimeoutError | None:
        """The failure of epoch `number` if the watch cancelled it, else None."""
        if self._expired != number:
            return None
        waiting = 'a checkpoint or a drain' if self._every_epoch else 'a drain'
        return EpochTimeoutError(
            f'Epoch {number} exceeded --drain_timeout_s={self.timeout_s:g}: its Spark job '
            f'ran longer than {waiting} may wait for it, so it was cancelled. A step that '
            'blocks (an external call without a timeout, a long sleep) or an epoch with '
            'too much to do causes this: give the call a timeout, lower '
            '--target_latency_ms, or raise --drain_timeout_s.')

    def _arm(self) -> None:
        """Starts the timer of the running epoch once it has a deadline (under the lock)."""
        if self._running is None or self._timer is not None:
            return
        number, group, started = self._running
        if self._every_epoch:
            since = started
        elif self._drain_at is not None:
            since = max(started, self._drain_at)
        else:
            return
        delay = max(0.0, since + self.timeout_s - time.monotonic())
        self._timer = threading.Timer(delay, self._expire, (number, group))
        self._timer.daemon = True
        self._timer.name = f'drain-timeout-{number}'
        self._timer.start()

    def _expire(self, number: int, group: str) -> None:
        with self._lock:
            if self._running is None or self._running[0] != number:
                return  # it ended meanwhile
            self._expired = number
        _LOGGER.warning('Epoch %d exceeded --drain_timeout_s=%g: cancelling its Spark jobs',
                        number, self.timeout_s)
        self._jobs.cancel_epoch(group)
