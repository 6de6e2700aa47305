"""The keyed-state backends of streaming partitions, versioned as deltas in a store.

Design section 8 (versioned partition state) and section 12 (consistent
regions). PySpark gives no task-to-process affinity, so partition p of a
stateful stage may run in another Python worker each epoch. The state of each
(operator, partition) is its `KeyedStateBackend`, kept by one
`state.versioned_state.VersionedStateCache` per process and checkpoint store;
the partition's name (e.g. 'stage-3/partition-1') is its store entry as it is.

A task of epoch e calls `load(..., base, create)` with the revision the driver
names: the one the successful attempt of the partition's previous task committed,
or after a reset the one a consistent cut recorded (so a zombie attempt's late
write is never loaded, and an aborted lineage never again):

* hit: this process committed (or loaded) exactly `base` and still holds the
  live backend attached to its cache entry: the task takes it (detached while
  the task runs, so a failed task never leaves a half-changed backend behind);
* otherwise: a fresh backend (`create`) `restore`s the full state at `base`
  that the cache holds or rebuilds (catching up on the deltas it missed, or a
  snapshot plus the deltas after it); at INITIAL_REVISION the state is empty.

Before it succeeds the task `commit`s revision (e, attempt) on `base`: the
backend's `take_delta` (the keys changed and deleted since it was loaded) goes to
the store as that revision's delta, and the live backend is attached at it. An
epoch touching 10 of a million keys writes about 10 values. The cache writes a
full snapshot of a lineage at a multiple of `SNAPSHOT_EVERY` revisions once its deltas
hold `SNAPSHOT_BYTES_RATIO` times the state's bytes (so snapshots add at most half to
what the deltas write, and a full load reads at most three times the state), and at
`MAX_CHAIN` revisions whatever the bytes (so a load reads at most that many deltas);
a large state that changes little is not rewritten every few epochs. It keeps loadable
what a retried task needs (`base`) and the revisions the driver's retained cuts
need (`keep`). Operators are built afresh each epoch over the backend they are
handed; checkpointing is the backend's job, not theirs.

Caches are keyed by the id of the run's store (the driver's run id): a long-lived
Python worker serving many runs keeps the caches of the `CACHED_STORES` stores it
used last.
"""

from __future__ import annotations

import collections
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable
from typing import ClassVar

from beam_streams_runner.errors import StoreNotSharedError
from beam_streams_runner.state.backend import KeyedStateBackend, head_length
from beam_streams_runner.state.host_state import HostCopies, HostStateStore, host_state_root
from beam_streams_runner.state.versioned_state import (
    Revision,
    VersionedStateCache,
    as_revision,
)
from beam_streams_runner.stores.base import CheckpointStore

SNAPSHOT_EVERY = 20
SNAPSHOT_BYTES_RATIO = 2.0
MAX_CHAIN = 200
CACHED_STORES = 4
# The driver's mark in the store of a run (`mark_run`): a task that does not find it
# is looking at another store than the driver's (a directory local to another host).
RUN_MARK_ENTRY = 'driver'
RUN_MARK_KEY = b'run'
# For the cluster tests: set in the workers' environment, every partition's state moves
# after each task, as if its next task ran on another host: the process keeps nothing,
# so every load of a revision catches up from the store.
STATE_MOVES_ENV = 'BEAM_STREAMS_RUNNER_STATE_MOVES'
# 'process' keeps each worker's copies of the states in its own memory instead of in
# the host's live states (the benchmarks compare the two).
LIVE_STATE_ENV = 'BEAM_STREAMS_RUNNER_LIVE_STATE'


def worker_host() -> str:
    """The host this worker runs on, as Spark names it (a local cluster's workers each
    have an address of their own)."""
    return os.environ.get('SPARK_LOCAL_IP') or socket.gethostname()


def mark_run(store: CheckpointStore, state_prefix: str, store_id: str) -> None:
    """The driver marks the store its run's state goes to, before any task runs."""
    entry = f'{state_prefix}{RUN_MARK_ENTRY}'
    if not store.entry_exists(entry):
        store.create_entry(entry)
    store.put(entry, RUN_MARK_KEY, store_id.encode())


_MARKS_SEEN: set[str] = set()


def check_run_mark(store: CheckpointStore, state_prefix: str, store_id: str) -> None:
    """Raises StoreNotSharedError when the driver's mark of run `store_id` is not in
    `store` as this process sees it (looked for once per process and run)."""
    if store_id in _MARKS_SEEN:
        return
    if store.get(f'{state_prefix}{RUN_MARK_ENTRY}', RUN_MARK_KEY) == store_id.encode():
        _MARKS_SEEN.add(store_id)
        return
    host = worker_host()
    raise StoreNotSharedError(
        f'The keyed state of this run is kept in {store!r}, which the driver wrote to but '
        f'this task, on host {host}, does not see: the state of a streaming run must be in '
        'a store that every host of the cluster reaches. Give '
        '--checkpoint_store=redis://host:port/db (or a directory that every host mounts '
        'at the same path).')


class PartitionStateCache:
    """Live keyed-state backends over versioned partition state, one cache per store
    (the `CACHED_STORES` used last)."""

    _lock = threading.Lock()
    # Least recently used first (dicts keep insertion order).
    _caches: ClassVar[dict[str, VersionedStateCache]] = {}

    @classmethod
    def cache(cls, store: CheckpointStore, store_id: str) -> VersionedStateCache:
        """This process's cache over the store of id `store_id` (its `stats` count hits,
        catch-ups and snapshot loads). The first `store` given for an id serves it."""
        with cls._lock:
            cache = cls._caches.pop(store_id, None)
            if cache is None:
                copies = None
                if os.environ.get(LIVE_STATE_ENV) != 'process':
                    copies = HostCopies(HostStateStore.at(host_state_path(store_id)), head_length)
                cache = VersionedStateCache(store, snapshot_every=SNAPSHOT_EVERY,
                                            snapshot_bytes_ratio=SNAPSHOT_BYTES_RATIO,
                                            max_chain=MAX_CHAIN, copies=copies)
                while len(cls._caches) >= CACHED_STORES:
                    # The run it served is most likely over: a later task of it rebuilds.
                    old = next(iter(cls._caches))
                    del cls._caches[old]
                    if os.path.isdir(host_state_path(old)):
                        HostStateStore.at(host_state_path(old)).close(remove=True)
            cls._caches[store_id] = cache
            return cache

    @classmethod
    def load(cls, store: CheckpointStore, store_id: str, name: str, base: Revision,
             create: Callable[[], KeyedStateBackend],
             kinds: collections.Counter | None = None) -> KeyedStateBackend:
        """The backend of partition `name` at revision `base` (INITIAL_REVISION: the
        initial state); `kinds` counts how it was loaded: 'live' (this process's backend
        of the last task), else as `VersionedStateCache.load` says ('hit': from the
        host's live states, reading the values of a key when it is first used)."""
        cache = cls.cache(store, store_id)
        state, kind = cache.load(name, base)
        if kind == 'hit':
            live = cache.attached(name, base)
            if live is not None:
                cache.attach(name, base, None)  # the task changes it from here on
                kind = 'live'
        if kinds is not None:
            kinds[kind] += 1
        if kind == 'live':
            return live
        backend = create()
        backend.restore(state)
        return backend

    @classmethod
    def commit(cls, store: CheckpointStore, store_id: str, name: str, revision: Revision,
               parent: Revision, backend: KeyedStateBackend,
               keep: Iterable[Revision] = ()) -> int:
        """Writes what `backend` changed since it was loaded at `parent` as `revision`,
        then keeps it live in this process. `keep`: the revisions of this partition
        the driver's retained cuts need. Returns the bytes of the keys and values the
        delta wrote (streaming progress)."""
        cache = cls.cache(store, store_id)
        revision = as_revision(revision)
        dirty, deleted = backend.take_delta()
        cache.commit(name, revision, dirty, deleted, parent=parent, keep=keep)
        if os.environ.get(STATE_MOVES_ENV):
            cache.drop(name)
        elif cache.cached_revision(name) == revision:
            backend.paged_moved_to(revision)
            cache.attach(name, revision, backend)
        return sum(len(k) + len(v) for k, v in dirty.items()) + sum(len(k) for k in deleted)


def host_state_path(store_id: str) -> str:
    """The directory of the host's live states of the run of `store_id`."""
    return os.path.join(host_state_root(), re.sub(r'[^A-Za-z0-9._-]', '_', store_id))
