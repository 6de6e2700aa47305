"""The keyed-state backends of streaming partitions, versioned as deltas in a store.

Design section 8 (versioned partition state). PySpark gives no task-to-process
affinity, so partition p of a stateful stage may run in another Python worker
each epoch. The state of each (operator, partition) is its `KeyedStateBackend`,
kept by one `state.versioned_state.VersionedStateCache` per process and state
directory over the `LocalDirectoryStore` rooted at the run's state directory;
the partition's name (e.g. 'stage-3/partition-1') is its store entry as it is
(the store escapes '/' in the entry's directory name).

A task of epoch e calls `load(..., e-1, create)`:

* hit: this process committed e-1 of the partition and still holds the live
  backend attached to its cache entry: the task takes it (detached while the
  task runs, so a failed task never leaves a half-changed backend behind);
* otherwise: a fresh backend (`create`) `restore`s the full state at e-1 that
  the cache holds or rebuilds (catching up on the deltas it missed, or the last
  snapshot plus the deltas after it); at e-1 = -1 the state is empty.

Before it succeeds the task `commit`s e: the backend's `take_delta` (the keys
changed and deleted since it was loaded) goes to the store as the delta of
version e, and the live backend is attached at e. An epoch touching 10 of a
million keys writes about 10 values. The cache writes a full snapshot every
`SNAPSHOT_EVERY` versions and keeps what a retried task of epoch e needs to load
e-1 exactly. Operators are built afresh each epoch over the backend they are
handed; checkpointing is the backend's job, not theirs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import ClassVar

from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.state.versioned_state import VersionedStateCache
from beam_streams_runner.stores.local_directory import LocalDirectoryStore

SNAPSHOT_EVERY = 20


class PartitionStateCache:
    """Live keyed-state backends over versioned partition state, one cache per state
    directory."""

    _lock = threading.Lock()
    _caches: ClassVar[dict[str, VersionedStateCache]] = {}

    @classmethod
    def cache(cls, state_dir: str) -> VersionedStateCache:
        """This process's cache over the store rooted at `state_dir` (its `stats`
        count hits, catch-ups and snapshot loads)."""
        with cls._lock:
            cache = cls._caches.get(state_dir)
            if cache is None:
                # A finished run removed its state directory: forget its partitions.
                for stale in [d for d in cls._caches if not os.path.isdir(d)]:
                    del cls._caches[stale]
                cache = cls._caches[state_dir] = VersionedStateCache(
                    LocalDirectoryStore(state_dir), snapshot_every=SNAPSHOT_EVERY)
            return cache

    @classmethod
    def load(cls, state_dir: str, name: str, version: int,
             create: Callable[[], KeyedStateBackend]) -> KeyedStateBackend:
        """The backend of partition `name` as of `version` (-1: the initial state)."""
        cache = cls.cache(state_dir)
        state, kind = cache.load(name, version)
        if kind == 'hit':
            live = cache.attached(name, version)
            if live is not None:
                cache.attach(name, version, None)  # the task changes it from here on
                return live
        backend = create()
        backend.restore(state)
        return backend

    @classmethod
    def commit(cls, state_dir: str, name: str, version: int, backend: KeyedStateBackend) -> int:
        """Writes what `backend` changed as `version`, then keeps it live in this process.
        Returns the bytes of the keys and values the delta wrote (streaming progress)."""
        cache = cls.cache(state_dir)
        dirty, deleted = backend.take_delta()
        cache.commit(name, version, dirty, deleted)
        if cache.cached_version(name) == version:
            cache.attach(name, version, backend)
        return sum(len(k) + len(v) for k, v in dirty.items()) + sum(len(k) for k in deleted)
