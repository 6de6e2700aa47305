"""Versioned partition state: a process-local cache over deltas and snapshots.

Design section 8, first half. PySpark gives no task-to-process affinity, so the
state of one (operator, partition) is versioned: its version is the last epoch
applied. The operator's state is a mapping of byte keys to byte values (the
operator decides what a key is). Every epoch's task

1. `load`s the state at the version it expects (the previous epoch): from this
   process's cache if it holds that version ('hit', no I/O, no copy), else by
   applying the deltas the cache missed ('catch-up'), else from the last
   snapshot plus the deltas after it ('snapshot');
2. `commit`s the delta of what it changed (dirty and deleted keys) to the
   checkpoint store *before* updating the cache, and only then reports
   success; a task that fails `drop`s its cache entry.

Store layout, in the entry the caller names (one per operator partition): the
delta of version v under b'd' + v and the snapshot (the full state) at v under
b's' + v, v as 8 big-endian bytes so keys sort by version; both are written
with `put_chunked`. Every `snapshot_every` versions a commit also writes a
snapshot and deletes what no load of version-1 or later needs: a retried task
(Spark re-running epoch v after v was committed) still loads v-1 exactly.

Payload encoding (compact, deterministic, not pickle): a header (kind,
version, pair count, deletion count), then all lengths as little-endian
uint32s in one block, then the keys and values, sorted by key. One
`struct.unpack_from` reads every length, so decoding costs a slice per item.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Mapping
from itertools import accumulate, pairwise
from typing import Any

from beam_streams_runner.errors import StreamsSparkRunnerError
from beam_streams_runner.stores.base import CheckpointStore

INITIAL_VERSION = -1
LOAD_KINDS = ('hit', 'catch-up', 'snapshot', 'initial')

_DELTA = b'd'
_SNAPSHOT = b's'
_VERSION = struct.Struct('>Q')
_KEY_LENGTH = 1 + _VERSION.size
# kind, version, number of (key, value) pairs, number of deleted keys
_PAYLOAD_HEADER = struct.Struct('<cqII')
# A load racing another process's garbage collection retries this often.
_LOAD_ATTEMPTS = 3


class MissingStateError(StreamsSparkRunnerError):
    """The checkpoint store lacks a delta or snapshot needed to rebuild a state."""


class VersionedStateCache:
    """Process-local cache of partition states over a CheckpointStore.

    One instance per process serves every partition the process runs. Each
    cache entry holds a version, the decoded state dict at that version, and
    optionally one object the caller attached (the live operator at that
    version). One lock guards the cache; PySpark runs one task per Python
    worker at a time, so it is never contended in practice.
    """

    def __init__(self, store: CheckpointStore, snapshot_every: int = 20) -> None:
        if snapshot_every < 1:
            raise ValueError(f'snapshot_every must be at least 1, got {snapshot_every}')
        self.store = store
        self.snapshot_every = snapshot_every
        self._cache: dict[str, _Cached] = {}
        self._created: set[str] = set()
        self._counts = dict.fromkeys(LOAD_KINDS, 0)
        self._deltas_read = 0
        self._bytes_read = 0
        self._lock = threading.RLock()

    @property
    def stats(self) -> dict[str, int]:
        """Loads by kind ('hit', 'catch-up', 'snapshot', 'initial'), plus the catch-up
        and snapshot cost: 'deltas_read' and 'bytes_read' from the store."""
        with self._lock:
            return {**self._counts, 'deltas_read': self._deltas_read,
                    'bytes_read': self._bytes_read}

    # Loading -------------------------------------------------------------------------
    def load(self, entry: str, expected_version: int) -> tuple[dict[bytes, bytes], str]:
        """The state of `entry` at `expected_version` (-1: the initial, empty state),
        and how it was obtained: 'hit', 'catch-up', 'snapshot' or 'initial'.

        The dict returned is the cache's own (a hit copies nothing). The caller may
        change it in place during its task only if it `drop`s the entry when the
        task fails; `commit` applies the same changes again, harmlessly.
        Raises `MissingStateError` when the store lacks a delta or snapshot needed.
        """
        if expected_version < INITIAL_VERSION:
            raise ValueError(f'Versions start at {INITIAL_VERSION}, got {expected_version}')
        with self._lock:
            cached = self._cache.get(entry)
            if expected_version == INITIAL_VERSION:
                kind, state = 'initial', {}
            elif cached is not None and cached.version == expected_version:
                kind, state = 'hit', cached.state
            else:
                try:
                    kind, state = self._read(entry, cached, expected_version)
                except BaseException:
                    # A catch-up may have half-changed the cached dict.
                    self.drop(entry)
                    raise
            if kind != 'hit':
                self._cache[entry] = _Cached(expected_version, state)
            self._counts[kind] += 1
            return state, kind

    def _read(self, entry: str, cached: _Cached | None,
              target: int) -> tuple[str, dict[bytes, bytes]]:
        if cached is not None and cached.version < target:
            state = self._catch_up(entry, cached.state, cached.version, target)
            if state is not None:
                return 'catch-up', state
        return 'snapshot', self._rebuild(entry, target)

    def _catch_up(self, entry: str, state: dict[bytes, bytes], version: int,
                  target: int) -> dict[bytes, bytes] | None:
        """`state` (at `version`) moved to `target` in place, or None if a delta is gone."""
        deltas = []
        for missed in range(version + 1, target + 1):
            payload = self.store.get_chunked(entry, _DELTA + _VERSION.pack(missed))
            if payload is None:
                # Collected after a newer snapshot (or never written): the caller
                # falls back to the snapshot, which reports a real gap.
                return None
            deltas.append(payload)
        for missed, payload in enumerate(deltas, version + 1):
            self._deltas_read += 1
            self._bytes_read += len(payload)
            _apply(state, *_decode(payload, _DELTA, missed, entry))
        return state

    def _rebuild(self, entry: str, target: int) -> dict[bytes, bytes]:
        """The state at `target` from the last snapshot at or before it plus deltas."""
        for _ in range(_LOAD_ATTEMPTS):
            snapshots = [v for v in _versions(self.store, entry, _SNAPSHOT) if v <= target]
            base = snapshots[-1] if snapshots else INITIAL_VERSION
            state: dict[bytes, bytes] = {}
            if base != INITIAL_VERSION:
                payload = self.store.get_chunked(entry, _SNAPSHOT + _VERSION.pack(base))
                if payload is None:
                    continue  # collected since we listed it: list again
                self._bytes_read += len(payload)
                state, _ = _decode(payload, _SNAPSHOT, base, entry)
            caught_up = self._catch_up(entry, state, base, target)
            if caught_up is not None:
                return caught_up
        raise MissingStateError(self._gap_message(entry, target))

    def _gap_message(self, entry: str, target: int) -> str:
        snapshots = _versions(self.store, entry, _SNAPSHOT)
        deltas = _versions(self.store, entry, _DELTA)
        snapshots_below = [v for v in snapshots if v <= target]
        base = snapshots_below[-1] if snapshots_below else INITIAL_VERSION
        present = set(deltas)
        missing = [v for v in range(base + 1, target + 1) if v not in present]
        if not missing:
            return (f'Cannot load the state of {entry!r} at version {target} from '
                    f'{self.store!r}: its snapshots and deltas kept being collected by '
                    f'newer commits during {_LOAD_ATTEMPTS} attempts (is another run of '
                    'this job writing to the same store?)')
        return (
            f'Cannot load the state of {entry!r} at version {target} from {self.store!r}: '
            f'the deltas of versions {_ranges(missing)} after '
            f"{'the initial state' if base == INITIAL_VERSION else f'the snapshot at {base}'} "
            f'are missing (the store holds snapshots {_ranges(snapshots)} and deltas '
            f'{_ranges(deltas)}). The store was cleared, collected by a newer run, or '
            'belongs to another job: point --checkpoint_store at this job\'s store, or '
            'delete its checkpoint data and start the pipeline from scratch.')

    # Committing ----------------------------------------------------------------------
    def commit(self, entry: str, version: int, dirty: Mapping[bytes, bytes],
               deleted: Iterable[bytes]) -> None:
        """Record the changes of `version` (keys in both `dirty` and `deleted` end up
        deleted): the delta goes to the store first, then into the cache; every
        `snapshot_every` versions a snapshot too, and old deltas/snapshots go.

        Committing the same version again (a retried task) with the same changes
        is harmless. If this raises, the cache entry is dropped.
        """
        if version < 0:
            raise ValueError(f'Committed versions start at 0, got {version}')
        deleted = sorted(set(deleted))
        try:
            with self._lock:
                if entry not in self._created:
                    self.store.create_entry(entry)
                    self._created.add(entry)
                self.store.put_chunked(entry, _DELTA + _VERSION.pack(version),
                                       _encode(_DELTA, version, dirty, deleted))
                cached = self._cache.get(entry)
                if cached is not None and cached.version in (version - 1, version):
                    _apply(cached.state, dirty, deleted)
                    self._cache[entry] = cached = _Cached(version, cached.state)
                if version % self.snapshot_every == 0 and version > 0:
                    if cached is None or cached.version != version:
                        state = self._rebuild(entry, version)
                        self._cache[entry] = cached = _Cached(version, state)
                    self._snapshot(entry, version, cached.state)
        except BaseException:
            self.drop(entry)
            raise

    def _snapshot(self, entry: str, version: int, state: Mapping[bytes, bytes]) -> None:
        self.store.put_chunked(entry, _SNAPSHOT + _VERSION.pack(version),
                               _encode(_SNAPSHOT, version, state, ()))
        # Loading version-1 needs the last snapshot before this one and the deltas
        # after it; nothing older is needed by any load of version-1 or later.
        older = [v for v in _versions(self.store, entry, _SNAPSHOT) if v < version]
        if not older:
            return
        keep_from = older[-1]
        for v in older[:-1]:
            self.store.delete_chunked(entry, _SNAPSHOT + _VERSION.pack(v))
        for v in _versions(self.store, entry, _DELTA):
            if v <= keep_from:
                self.store.delete_chunked(entry, _DELTA + _VERSION.pack(v))

    # The cache -----------------------------------------------------------------------
    def drop(self, entry: str) -> None:
        """Forget the cached state of `entry` (its task failed: the dict may be half-changed)."""
        with self._lock:
            self._cache.pop(entry, None)

    def attach(self, entry: str, version: int, obj: Any) -> None:
        """Hang `obj` (e.g. the live operator) on the cache entry, valid at `version` only.

        The entry must be at `version` (after `load` or `commit` of it); the next
        commit, load of another version or drop detaches it.
        """
        with self._lock:
            cached = self._cache.get(entry)
            if cached is None or cached.version != version:
                held = None if cached is None else cached.version
                raise ValueError(f'Cannot attach to {entry!r} at version {version}: the '
                                 f'cache holds version {held}')
            cached.attached = obj

    def attached(self, entry: str, version: int) -> Any | None:
        """The object attached to `entry` at `version`, or None. Counts no load."""
        with self._lock:
            cached = self._cache.get(entry)
            if cached is None or cached.version != version:
                return None
            return cached.attached

    def cached_version(self, entry: str) -> int | None:
        """The version the cache holds for `entry`, or None."""
        cached = self._cache.get(entry)
        return None if cached is None else cached.version


class _Cached:
    __slots__ = ('attached', 'state', 'version')

    def __init__(self, version: int, state: dict[bytes, bytes]) -> None:
        self.version = version
        self.state = state
        self.attached: Any = None


# Store keys -----------------------------------------------------------------------------
def _versions(store: CheckpointStore, entry: str, kind: bytes) -> list[int]:
    """Versions of the deltas or snapshots present, ascending."""
    # A chunked value's chunks share its key as prefix; only the headers have
    # exactly the length of our keys.
    return [_VERSION.unpack_from(key, 1)[0] for key in store.keys(entry, prefix=kind)
            if len(key) == _KEY_LENGTH]


def _ranges(versions: Iterable[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7' (for error messages)."""
    spans: list[list[int]] = []
    for v in sorted(versions):
        if spans and spans[-1][1] == v - 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    text = ', '.join(str(a) if a == b else f'{a}-{b}' for a, b in spans)
    return f'[{text}]' if text else 'none'


# Payloads ---------------------------------------------------------------------------------
def _encode(kind: bytes, version: int, pairs: Mapping[bytes, bytes],
            deleted: Iterable[bytes]) -> bytes:
    items = sorted(pairs.items())
    deleted = sorted(deleted)
    lengths = [n for key, value in items for n in (len(key), len(value))]
    lengths += [len(key) for key in deleted]
    return b''.join([
        _PAYLOAD_HEADER.pack(kind, version, len(items), len(deleted)),
        struct.pack(f'<{len(lengths)}I', *lengths),
        *[part for item in items for part in item],
        *deleted,
    ])


def _decode(payload: bytes, kind: bytes, version: int,
            entry: str) -> tuple[dict[bytes, bytes], list[bytes]]:
    """(pairs, deleted keys) of a payload, checked to be the `kind` at `version`."""
    found_kind, found_version, n_pairs, n_deleted = _PAYLOAD_HEADER.unpack_from(payload)
    if (found_kind, found_version) != (kind, version):
        raise MissingStateError(
            f'The checkpoint store holds {found_kind!r}@{found_version} under the key of '
            f'{kind!r}@{version} in {entry!r}: the store is damaged; delete its checkpoint '
            'data and start the pipeline from scratch.')
    n_lengths = 2 * n_pairs + n_deleted
    lengths = struct.unpack_from(f'<{n_lengths}I', payload, _PAYLOAD_HEADER.size)
    start = _PAYLOAD_HEADER.size + 4 * n_lengths
    ends = list(accumulate(lengths, initial=start))
    parts = [payload[a:b] for a, b in pairwise(ends)]
    pairs = dict(zip(parts[0:2 * n_pairs:2], parts[1:2 * n_pairs:2], strict=True))
    return pairs, parts[2 * n_pairs:]


def _apply(state: dict[bytes, bytes], pairs: Mapping[bytes, bytes],
           deleted: Iterable[bytes]) -> None:
    state.update(pairs)
    for key in deleted:
        state.pop(key, None)
