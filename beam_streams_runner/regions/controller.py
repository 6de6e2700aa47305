"""The consistent-region controller: cuts, commit records, resets (design sections 8, 12).

One controller per region, on the driver. It assigns strictly increasing sequence
ids (0 is the initial state, which needs no record), decides which epochs end a
cut (every `period_s`, or at once when an operator asked for one), and reaches
what it checkpoints only through the `hooks.RegionMember` hooks:

* a cut after epoch e: `drain` (the epoch boundary already is one), then
  `checkpoint` of every member; the commit record of those parts is written
  (blocking: before the next epoch; non-blocking: by a background thread while the
  next epochs run, waited for before the next cut); once it is durable the
  sequence id is consistent: `region_checkpointed`, and the cut before the
  previous one is retired (`retire_checkpoint`, the record deleted): the last
  two stay;
* a failure: `reset` of every member to the newest consistent cut (or
  `reset_to_initial_state` before the first), counted; after
  `max_consecutive_reset_attempts` resets without a new consistent cut in
  between, the pipeline fails with `RegionResetError` naming the region, its
  last consistent sequence id and the cause of every attempt;
* a driver start: `resume` resets to the newest cut in the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from beam_streams_runner.errors import CheckpointStoreUnavailableError, PipelineExecutionError
from beam_streams_runner.regions import fault_points
from beam_streams_runner.regions.commit_records import CheckpointLedger, CommitRecord
from beam_streams_runner.regions.hooks import RegionMember

_LOGGER = logging.getLogger(__name__)
RETAINED_CUTS = 2
_STORE_RETRY_S = 0.5  # the first wait for an unavailable store during a reset
_STORE_RETRY_MAX_S = 5.0


class RegionResetError(PipelineExecutionError):
    """A region failed again after every reset attempt it was allowed."""


class ConsistentRegionController:
    """Cuts and resets one region (see the module docstring)."""

    def __init__(self, name: str, stages: frozenset[str], ledger: CheckpointLedger,
                 members: Sequence[RegionMember], period_s: float, non_blocking: bool,
                 max_reset_attempts: int, reset_timeout_s: float) -> None:
        self.name = name
        self.stages = stages
        self._ledger = ledger
        self._members = list(members)
        self._period_s = period_s
        self._max_reset_attempts = max_reset_attempts
        self._reset_timeout_s = reset_timeout_s
        self._writer = ThreadPoolExecutor(1, f'checkpoint-{name}') if non_blocking else None
        self._pending: tuple[CommitRecord, Future] | None = None
        self.sequence_id = 0  # the newest consistent cut (0: the initial state)
        self.consistent_epoch = -1  # the epoch it was taken after (-1: none)
        self._next_sequence_id = 1
        self._retained: list[int] = []
        self._causes: list[str] = []
        self._last_cut = time.monotonic()

    # Start ---------------------------------------------------------------------------
    def resume(self) -> CommitRecord | None:
        """Resets every member to the newest consistent cut in the store, if any."""
        record = self._ledger.latest(self.name)
        self._reset_members(record)
        if record is not None:
            self.sequence_id = record.sequence_id
            self.consistent_epoch = record.epoch
            self._next_sequence_id = record.sequence_id + 1
            self._retained = [record.sequence_id]
        self._last_cut = time.monotonic()
        return record

    # Cuts ----------------------------------------------------------------------------
    def after_epoch(self, epoch: int, requested: bool = False) -> int | None:
        """Called after every successful epoch: declares a finished background write
        consistent, and cuts after `epoch` when the period passed or an operator asked.
        Returns the sequence id of a cut started now, or None."""
        self._collect(wait=False)
        due = requested or time.monotonic() - self._last_cut >= self._period_s
        if not due or self._pending is not None:
            return None
        return self.cut(epoch)

    def cut(self, epoch: int, wait: bool = False) -> int:
        """Checkpoints every member after `epoch` under a new sequence id (after the
        previous cut's background write is consistent: cuts commit in order)."""
        self._collect(wait=True)
        sequence_id = self._next_sequence_id
        self._next_sequence_id += 1
        self._last_cut = time.monotonic()
        for member in self._members:
            member.drain(self.stages)
        if self._writer is not None:
            for member in self._members:
                member.prepare_for_non_blocking_checkpoint(sequence_id, self.stages)
        record = CommitRecord(sequence_id, epoch, {
            member.name: member.checkpoint(sequence_id, self.stages)
            for member in self._members})
        fault_points.reached(fault_points.BEFORE_COMMIT_RECORD)
        if self._writer is None:
            self._ledger.write(self.name, record)
            self._consistent(record)
        else:
            self._pending = (record, self._writer.submit(self._write_in_background, record))
            if wait:
                self._collect(wait=True)
        return sequence_id

    def seconds_to_next_cut(self) -> float:
        """How long until a periodic cut is due (0: due now, or a write to finish)."""
        if self._pending is not None:
            return 0.0
        return max(0.0, self._period_s - (time.monotonic() - self._last_cut))

    def _write_in_background(self, record: CommitRecord) -> None:
        fault_points.reached(fault_points.DURING_NON_BLOCKING_WRITE)
        self._ledger.write(self.name, record)

    def _collect(self, wait: bool) -> None:
        """Declares the background write consistent once it finished; its failure is the
        caller's failure (the epoch that follows resets)."""
        if self._pending is None:
            return
        record, future = self._pending
        if not wait and not future.done():
            return
        self._pending = None
        future.result()
        self._consistent(record)

    def _consistent(self, record: CommitRecord) -> None:
        fault_points.reached(fault_points.AFTER_COMMIT_RECORD)
        self.sequence_id = record.sequence_id
        self.consistent_epoch = record.epoch
        self._causes.clear()
        for member in self._members:
            member.region_checkpointed(record.sequence_id, self.stages)
        self._retained.append(record.sequence_id)
        while len(self._retained) > RETAINED_CUTS:
            retired = self._retained.pop(0)
            for member in self._members:
                member.retire_checkpoint(retired, self.stages)
            self._ledger.retire(self.name, retired)
        _LOGGER.info('Consistent region %r: checkpoint %d after epoch %d is consistent',
                     self.name, record.sequence_id, record.epoch)

    # Resets --------------------------------------------------------------------------
    def reset(self, cause: BaseException) -> CommitRecord | None:
        """Puts every member back to the newest consistent cut after `cause` failed an
        epoch; raises `RegionResetError` once the attempts are used up."""
        started = time.monotonic()
        # When the failure reached the driver: with the reset line's time, the split
        # of a recovery into detection, reset and catch-up (benchmarks/checkpoints.py).
        _LOGGER.info('Consistent region %r: resetting after a failed epoch: %s', self.name,
                     _describe(cause))
        try:
            # A cut still being written becomes the one to reset to if it completes.
            self._collect(wait=True)
        except Exception as exc:  # noqa: BLE001 - a failed write leaves the older cut
            _LOGGER.warning('Consistent region %r: checkpoint write failed (%s); resetting '
                            'to checkpoint %d', self.name, exc, self.sequence_id)
        self._causes.append(_describe(cause))
        if len(self._causes) > self._max_reset_attempts:
            raise RegionResetError(self._exhausted_message(cause)) from cause
        record = self._latest_cut(started)
        self._reset_members(record)
        self.consistent_epoch = -1 if record is None else record.epoch
        elapsed = time.monotonic() - started
        _LOGGER.warning(
            'Consistent region %r: reset %d of %d to checkpoint %d after: %s (%.1f s)',
            self.name, len(self._causes), self._max_reset_attempts,
            0 if record is None else record.sequence_id, self._causes[-1], elapsed)
        if elapsed > self._reset_timeout_s:
            self._causes.append(f'the reset took {elapsed:.0f} s, longer than '
                                f'--reset_timeout_s={self._reset_timeout_s:g}')
        return record

    def _latest_cut(self, started: float) -> CommitRecord | None:
        """The newest consistent cut, read again while the store is unavailable (it may
        be restarting) until `reset_timeout_s` has passed since `started`."""
        delay = _STORE_RETRY_S
        while True:
            try:
                return self._ledger.latest(self.name)
            except CheckpointStoreUnavailableError as exc:
                if time.monotonic() - started + delay > self._reset_timeout_s:
                    self._causes.append(f'the store stayed unavailable for the reset, '
                                        f'--reset_timeout_s={self._reset_timeout_s:g}: {exc}')
                    raise RegionResetError(self._exhausted_message(exc)) from exc
                _LOGGER.warning('Consistent region %r: the checkpoint store is unavailable '
                                'for the reset (%s); trying again in %.1f s', self.name, exc,
                                delay)
                time.sleep(delay)
                delay = min(delay * 2, _STORE_RETRY_MAX_S)

    def _reset_members(self, record: CommitRecord | None) -> None:
        for index, member in enumerate(self._members):
            if index:
                fault_points.reached(fault_points.DURING_RESET)
            if record is None:
                member.reset_to_initial_state(self.stages)
            else:
                member.reset(record.sequence_id, self.stages, record.parts.get(member.name))

    def _exhausted_message(self, last: BaseException) -> str:
        attempts = '\n'.join(f'  attempt {i}: {cause}' for i, cause in enumerate(self._causes, 1))
        return (f'Consistent region {self.name!r} failed {len(self._causes)} times in a row '
                f'without reaching a new consistent state (last consistent checkpoint: '
                f'{self.sequence_id}; --max_consecutive_reset_attempts='
                f'{self._max_reset_attempts}). The causes:\n{attempts}\nFix the cause and run '
                f'the same command again: the job resumes from checkpoint {self.sequence_id}.'
                f'\nThe last failure: {last}')

    def close(self) -> None:
        """Waits for a background write (so a drain's last cut is durable), then stops."""
        try:
            self._collect(wait=True)
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)


def _describe(cause: BaseException) -> str:
    text = str(cause).strip().splitlines()
    return f'{type(cause).__name__}: {text[0] if text else ""}'
