"""What a job keeps in its checkpoint store besides partition state: its graph, its
epoch reservation and the commit record of every consistent cut of every region.

Design section 12 ("Checkpoint = the epoch's deltas plus a commit record"). The
partitions' deltas are written by their tasks every epoch; a cut with sequence id
s exists once its commit record is durable: one chunked value (its header is
written last, so a reader sees all of it or nothing), then the region's `latest`
pointer. Store entries, for job J:

* `jobs/J/job`: `graph` (the pipeline's stages, to refuse a changed pipeline on
  resume), `epochs` (epoch numbers reserved by drivers: a restarted driver starts
  above them, so an epoch number is never reused and a late write of a dead
  driver's task never lands on a live one's key);
* `jobs/J/region/R`: `cut` + s (the record), `latest` (the newest consistent s);
* `jobs/J/state/...`: the partitions' versioned keyed state (see
  `worker.partition_cache`).

A local journal (`<runner home>/journal/`, one file per store and job) remembers
the newest sequence id committed, so a store that was wiped between two runs is
reported instead of silently starting the job again from scratch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import struct
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from beam_streams_runner.errors import StreamsSparkRunnerError
from beam_streams_runner.stores.base import CheckpointStore

_SEQUENCE = struct.Struct('>Q')
_CUT = b'cut'
_LATEST = b'latest'
_GRAPH = b'graph'
_EPOCHS = b'epochs'
_JOURNAL_LOCK = threading.Lock()
EPOCH_RESERVATION = 1000  # epochs a driver reserves with one write


def runner_home() -> str:
    """Where the runner keeps what is local to this machine (journal, default stores)."""
    return os.path.expanduser(os.environ.get('BEAM_STREAMS_RUNNER_HOME',
                                             '~/.beam_streams_runner'))


class CheckpointStateError(StreamsSparkRunnerError):
    """The stored checkpoints of a job cannot be used (wiped, changed pipeline, damage)."""


@dataclasses.dataclass(frozen=True)
class CommitRecord:
    """A consistent cut of one region: its members' parts after epoch `epoch`."""

    sequence_id: int
    epoch: int
    parts: Mapping[str, Any]
    written_at: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass(frozen=True)
class PipelineGraph:
    """What must not change between a run and its resume: the stages and the partitions."""

    # (stage name, kind, its Beam steps sorted), in any order: the stage names are the
    # same in every driver process (`plan.stable_stage_name`), their order is not.
    stages: tuple[tuple[str, str, tuple[str, ...]], ...]
    partitions: int

    def differences(self, stored: PipelineGraph) -> list[str]:
        """What changed from `stored` to this graph, in words (empty: the same)."""
        problems = []
        if stored.partitions != self.partitions:
            problems.append(f'the stored state is partitioned in {stored.partitions}, this run '
                            f'in {self.partitions} (set --parallelism={stored.partitions})')
        old = {name: steps for name, _, steps in stored.stages}
        new = {name: steps for name, _, steps in self.stages}
        for name in sorted(old.keys() - new.keys()):
            problems.append(f'steps {list(old[name])} (stage {name}) are gone or changed')
        for name in sorted(new.keys() - old.keys()):
            problems.append(f'steps {list(new[name])} (stage {name}) are new or changed')
        return problems


class CheckpointLedger:
    """Reads and writes a job's graph, epoch reservation and commit records."""

    def __init__(self, store: CheckpointStore, job_name: str, store_label: str) -> None:
        self.store = store
        self.job_name = job_name
        self.store_label = store_label  # the store's URL without its password
        self.job_entry = f'jobs/{job_name}/job'
        self.state_prefix = f'jobs/{job_name}/state/'
        self._journal = os.path.join(runner_home(), 'journal', hashlib.sha256(
            f'{store_label}\0{job_name}'.encode()).hexdigest()[:32])

    def region_entry(self, region: str) -> str:
        return f'jobs/{self.job_name}/region/{region}'

    # The job -------------------------------------------------------------------------
    def open(self, graph: PipelineGraph, restart_from_scratch: bool) -> bool:
        """Prepares the job's entries; True when earlier checkpoints of it exist.

        Refuses a changed graph and a store that lost checkpoints the journal knows of.
        """
        if restart_from_scratch:
            self.delete_job()
        stored = self.store.get_chunked(self.job_entry, _GRAPH)
        journal = self._journal_sequence()
        if stored is None:
            if journal:
                raise CheckpointStateError(
                    f'Job {self.job_name!r} committed checkpoint {journal} to {self.store_label}'
                    ', but the store holds nothing of it now: the store was wiped or is '
                    'another one. Point --checkpoint_store at the job\'s store, or run with '
                    '--restart_from_scratch to start the job again from its sources.')
            self.store.create_entry(self.job_entry)
            self.store.put_chunked(self.job_entry, _GRAPH, pickle.dumps(graph))
            return False
        problems = graph.differences(pickle.loads(stored))
        if problems:
            raise CheckpointStateError(
                f'Job {self.job_name!r} in {self.store_label} was checkpointed by another '
                'pipeline: ' + '; '.join(problems) + '. Run the pipeline that wrote it, '
                'give this one another --job_name, or run with --restart_from_scratch to '
                'drop the stored state.')
        return True

    def reserve_epochs(self, epoch: int) -> int:
        """Records that epochs up to `epoch` + EPOCH_RESERVATION may be used; returns the
        end of the reservation (the first epoch a later driver may use)."""
        end = epoch + EPOCH_RESERVATION
        self.store.put(self.job_entry, _EPOCHS, str(end).encode())
        return end

    def first_free_epoch(self) -> int:
        value = self.store.get(self.job_entry, _EPOCHS)
        return int(value) if value else 0

    def delete_job(self) -> None:
        """Removes everything of the job (a finished job, or a restart from scratch)."""
        for entry in self.store.entries(prefix=f'jobs/{self.job_name}/'):
            self.store.delete_entry(entry)
        self._write_journal(None)

    # Commit records -----------------------------------------------------------------
    def write(self, region: str, record: CommitRecord) -> None:
        """Makes `record` the region's newest consistent cut (the record, then `latest`)."""
        entry = self.region_entry(region)
        self.store.create_entry(entry)
        self.store.put_chunked(entry, _CUT + _SEQUENCE.pack(record.sequence_id),
                               pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
        self.store.put_together(entry, {_LATEST: _SEQUENCE.pack(record.sequence_id)})
        self._write_journal(record.sequence_id)

    def latest(self, region: str) -> CommitRecord | None:
        """The region's newest consistent cut, None before its first."""
        entry = self.region_entry(region)
        pointer = self.store.get(entry, _LATEST)
        if pointer is None:
            return None
        sequence_id = _SEQUENCE.unpack(pointer)[0]
        raw = self.store.get_chunked(entry, _CUT + _SEQUENCE.pack(sequence_id))
        if raw is None:
            raise CheckpointStateError(
                f'Region {region!r} of job {self.job_name!r}: the store {self.store_label} '
                f'names checkpoint {sequence_id} as the newest but holds no record of it: '
                'the store was partly wiped. Run with --restart_from_scratch to start again.')
        return pickle.loads(raw)

    def retire(self, region: str, sequence_id: int) -> None:
        self.store.delete_chunked(self.region_entry(region), _CUT + _SEQUENCE.pack(sequence_id))

    # The journal --------------------------------------------------------------------
    def _journal_sequence(self) -> int:
        try:
            with open(self._journal) as f:
                return int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _write_journal(self, sequence_id: int | None) -> None:
        if sequence_id is None:
            try:
                os.remove(self._journal)
            except FileNotFoundError:
                pass
            return
        directory = os.path.dirname(self._journal)
        os.makedirs(directory, exist_ok=True)
        # The regions of a job commit from threads of their own, to one journal: each
        # write goes through a file of its own, and the journal keeps the newest id.
        with _JOURNAL_LOCK:
            sequence_id = max(sequence_id, self._journal_sequence())
            with tempfile.NamedTemporaryFile('w', dir=directory, delete=False,
                                             prefix='.journal-') as f:
                f.write(str(sequence_id))
            os.replace(f.name, self._journal)
