"""Versioned partition state: a process-local cache over deltas and snapshots.

Design section 8, first half, and section 12 (consistent regions). PySpark gives
no task-to-process affinity, so the state of one (operator, partition) is
versioned. The operator's state is a mapping of byte keys to byte values (the
operator decides what a key is). A state is named by a `Revision`: the epoch
that committed it (its version) and the number of the task attempt that wrote
it. Every epoch's task

1. `load`s the state at the revision the driver names (its base): from this
   process's cache if it holds that revision ('hit', no I/O, no copy), else by
   applying the deltas the cache missed ('catch-up'), else from a snapshot plus
   the deltas after it ('snapshot');
2. `commit`s the delta of what it changed (dirty and deleted keys) as revision
   (epoch, attempt) on top of its base (the delta's *parent*) to the checkpoint
   store *before* updating the cache, and only then reports success; a task
   that fails `drop`s its cache entry.

Revisions form a tree, not a line. A reset to a consistent cut (section 12)
makes the next epoch's parent the cut's revision, say 8 after a failure in
epoch 12: epoch 13's delta sits on 8, and deltas 9-12 are an aborted lineage
no load ever reads again (epoch numbers are never reused). Fencing: two
attempts of one task (a Spark retry, a zombie) write under different keys, and
the driver names the one that succeeded as the next base, so a late write of
another attempt can never change what a load reads.

Store layout, in the entry the caller names (one per operator partition): the
delta of revision r under b'd' + r and the snapshot (the full state) at r under
b's' + r, r as its version (8 big-endian bytes, so keys sort by version) and
attempt (2 big-endian bytes); both are written with `put_chunked`. A delta
records its *chain*: the revisions from its parent back to its base, the
nearest ancestor with a snapshot (or the initial state), so one read of a delta
says what else a load of it needs. When a chain reaches `snapshot_every`
revisions (and, with a `snapshot_bytes_ratio`, its deltas hold that many times the
state's bytes; or in any case at `max_chain` revisions), the commit also writes a
snapshot and collects what no load needs:
the commit's revision, its parent (a retried task reloads it) and the revisions
the caller keeps (the driver's retained cuts) stay loadable with their chains;
other deltas and snapshots older than the commit go (aborted lineages, failed
attempts, old history).

Payload encoding (compact, deterministic, not pickle): a header (kind, version,
attempt, chain length, pair count, deletion count), the chain's versions and
attempts, then all lengths as little-endian uint32s in one block, then the keys
and values, sorted by key. One `struct.unpack_from` reads every length, so
decoding costs a slice per item.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Mapping
from itertools import accumulate, pairwise
from typing import Any, NamedTuple, Protocol

from beam_streams_runner.errors import StreamsSparkRunnerError
from beam_streams_runner.stores.base import CheckpointStore


class Revision(NamedTuple):
    """A committed state: the epoch that committed it and the task attempt that wrote it."""

    version: int
    attempt: int = 0


INITIAL_REVISION = Revision(-1, 0)
LOAD_KINDS = ('hit', 'catch-up', 'snapshot', 'initial')

_DELTA = b'd'
_SNAPSHOT = b's'
_REVISION = struct.Struct('>QH')
_KEY_LENGTH = 1 + _REVISION.size
_MAX_VERSION = 2**63 - 1  # payloads hold versions as signed 8-byte integers
_MAX_ATTEMPT = 2**16 - 1
# kind, version, attempt, chain length, number of (key, value) pairs, of deleted keys
_PAYLOAD_HEADER = struct.Struct('<cqHIII')


class MissingStateError(StreamsSparkRunnerError):
    """The checkpoint store lacks a delta or snapshot needed to rebuild a state."""


def as_revision(value: Revision | tuple[int, int] | int) -> Revision:
    """`value` as a checked `Revision` (an int v means Revision(v, 0))."""
    revision = Revision(value, 0) if isinstance(value, int) else Revision(*value)
    version, attempt = revision
    if not (isinstance(version, int) and isinstance(attempt, int)
            and -1 <= version <= _MAX_VERSION and 0 <= attempt <= _MAX_ATTEMPT
            and (version >= 0 or attempt == 0)):
        raise ValueError(f'Not a revision: {value!r} (versions start at -1, the initial '
                         f'state, attempts at 0 and below {_MAX_ATTEMPT + 1})')
    return revision


class VersionedStateCache:
    """Process-local cache of partition states over a CheckpointStore.

    One instance per process and store serves every partition the process runs.
    Each cache entry holds a revision, the decoded state dict at it, and
    optionally one object the caller attached (the live operator at that
    revision). One lock guards the cache; PySpark runs one task per Python
    worker at a time, so it is never contended in practice.
    """

    def __init__(self, store: CheckpointStore, snapshot_every: int = 20,
                 snapshot_bytes_ratio: float = 0.0, max_chain: int | None = None,
                 copies: StateCopies | None = None) -> None:
        """A snapshot is written when a chain reaches a multiple of `snapshot_every`
        revisions and its deltas hold at least `snapshot_bytes_ratio` times the bytes
        of the state (0: always), and at `max_chain` revisions (default: ten times
        `snapshot_every`) whatever the bytes. A snapshot is compaction: it bounds what
        a full load reads, and rewrites the whole state to do it, so a large state that
        changes little is better loaded from its deltas."""
        if snapshot_every < 1:
            raise ValueError(f'snapshot_every must be at least 1, got {snapshot_every}')
        if snapshot_bytes_ratio < 0:
            raise ValueError('snapshot_bytes_ratio must not be negative, got '
                             f'{snapshot_bytes_ratio}')
        self.store = store
        self.snapshot_every = snapshot_every
        self.snapshot_bytes_ratio = snapshot_bytes_ratio
        self.max_chain = max(snapshot_every, max_chain or 10 * snapshot_every)
        # Where the full states go: this process's memory, or the host's live states
        # (`host_state.HostCopies`) shared by every worker of the host.
        self._copies = copies if copies is not None else MemoryCopies()
        self._attached: dict[str, tuple[Revision, Any]] = {}  # always this process's
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
    def load(self, entry: str, base: Revision | int) -> tuple[dict[bytes, bytes], str]:
        """The state of `entry` at revision `base` (an int v: Revision(v, 0); -1: the
        initial, empty state), and how it was obtained: 'hit', 'catch-up', 'snapshot'
        or 'initial'.

        The mapping returned is the cache's own copy (a hit copies nothing): a dict in
        this process, or a `host_state.HostStateView` of the host's copy, to read only.
        Raises `MissingStateError` when the store lacks a delta or snapshot needed.
        """
        target = as_revision(base)
        with self._lock:
            cached = self._copies.get(entry)
            if target == INITIAL_REVISION:
                kind, cached = 'initial', CachedState(target, {}, [], None, 0)
                self._copies.put(entry, cached)
            elif cached is not None and cached.revision == target:
                kind = 'hit'
            else:
                try:
                    kind, cached = self._read(entry, cached, target)
                except BaseException:
                    # A catch-up may have half-changed the cached dict.
                    self.drop(entry)
                    raise
            if kind != 'hit':
                self._attached.pop(entry, None)
            self._counts[kind] += 1
            return cached.state, kind

    def _read(self, entry: str, cached: CachedState | None,
              target: Revision) -> tuple[str, CachedState]:
        """The state at `target` (not INITIAL_REVISION) from the store, and how."""
        snapshots = set(_revisions(self.store, entry, _SNAPSHOT))
        if target in snapshots:
            payload = self.store.get_chunked(entry, _key(_SNAPSHOT, target))
            if payload is not None:  # else collected since listed: try the delta
                self._bytes_read += len(payload)
                _, state, _ = _decode(payload, _SNAPSHOT, target, entry)
                found = CachedState(target, state, [], None, 0)
                self._copies.put(entry, found)
                return 'snapshot', found
        payload = self.store.get_chunked(entry, _key(_DELTA, target))
        if payload is None:
            raise MissingStateError(self._gap_message(entry, target, None))
        chain, pairs, deleted = _decode(payload, _DELTA, target, entry)
        found = CachedState(target, {}, chain, chain[0], None)
        if cached is not None and cached.revision in chain:
            # The deltas after the cached revision, oldest first.
            missed = self._read_deltas(entry, chain[:chain.index(cached.revision)])
            if missed is not None:
                if cached.chain_bytes is not None:  # the same base: its chain is ours
                    found.chain_bytes = cached.chain_bytes + missed[1] + len(payload)
                changes = [*missed[0], (pairs, deleted)]
                if self._copies.advance(entry, cached.revision, found, changes):
                    self._count_applied(changes, len(payload))
                    return 'catch-up', found
                # Else another worker moved the copy meanwhile: rebuild, as below.
            # Some were collected after a newer snapshot: start from the chain's base.
        found.state, chain_bytes = self._rebuild(entry, target, chain, snapshots)
        found.chain_bytes = chain_bytes + len(payload)
        _apply(found.state, pairs, deleted)
        self._count_applied([(pairs, deleted)], len(payload))
        self._copies.put(entry, found)
        return 'snapshot', found

    def _rebuild(self, entry: str, target: Revision, chain: list[Revision],
                 snapshots: set[Revision]) -> tuple[dict[bytes, bytes], int]:
        """The state at `chain[0]` (the parent of `target`): the nearest snapshot on
        the chain (or the initial state) plus the deltas after it; and their bytes."""
        for depth, ancestor in enumerate(chain):
            if ancestor == INITIAL_REVISION:
                state: dict[bytes, bytes] = {}
            elif ancestor in snapshots:
                payload = self.store.get_chunked(entry, _key(_SNAPSHOT, ancestor))
                if payload is None:
                    continue  # collected since listed: an older base may remain
                self._bytes_read += len(payload)
                _, state, _ = _decode(payload, _SNAPSHOT, ancestor, entry)
            else:
                continue
            deltas = self._read_deltas(entry, chain[:depth])
            if deltas is None:
                break
            for pairs, deleted in deltas[0]:
                _apply(state, pairs, deleted)
            self._count_applied(deltas[0], 0)
            return state, deltas[1]
        raise MissingStateError(self._gap_message(entry, target, chain))

    def _read_deltas(self, entry: str, newest_first: list[Revision]
                     ) -> tuple[list[tuple[dict[bytes, bytes], list[bytes]]], int] | None:
        """The changes of these deltas, oldest first, and their payloads' bytes; or None
        if one is missing (all are read before any is applied, so a gap leaves the
        state unchanged)."""
        deltas = []
        size = 0
        for revision in reversed(newest_first):
            payload = self.store.get_chunked(entry, _key(_DELTA, revision))
            if payload is None:
                return None
            size += len(payload)
            deltas.append(_decode(payload, _DELTA, revision, entry)[1:])
        self._bytes_read += size
        return deltas, size

    def _count_applied(self, deltas: list, payload_bytes: int) -> None:
        self._deltas_read += len(deltas)
        self._bytes_read += payload_bytes

    def _gap_message(self, entry: str, target: Revision, chain: list[Revision] | None) -> str:
        snapshots = _revisions(self.store, entry, _SNAPSHOT)
        deltas = set(_revisions(self.store, entry, _DELTA))
        where = (f'Cannot load the state of {entry!r} at revision {_label(target)} from '
                 f'{self.store!r}: ')
        if chain is None:
            what = f'neither the delta nor a snapshot of revision {_label(target)} is there'
        else:
            depth = next((d for d, a in enumerate(chain)
                          if a == INITIAL_REVISION or a in snapshots), None)
            # Without a base on the chain, its last revision should have had a snapshot.
            needed = chain[:depth] if depth is not None else chain[:-1]
            missing = [a for a in needed if a not in deltas]
            if depth is None:
                what = (f'its base, the snapshot at {_label(chain[-1])}, is missing'
                        + (f' and so are the deltas of revisions {_ranges(missing)}'
                           if missing else ''))
            elif missing:
                base = chain[depth]
                after = ('the initial state' if base == INITIAL_REVISION
                         else f'the snapshot at {_label(base)}')
                what = f'the deltas of revisions {_ranges(missing)} after {after} are missing'
            else:
                return (where + 'its deltas and snapshots were collected while it was '
                        'loaded (is another run of this job writing to the same store?)')
        return (
            where + f'{what} (the store holds snapshots {_ranges(snapshots)} and deltas '
            f'{_ranges(deltas)}). The store was cleared, the revision was collected (no '
            'commit since kept it), or the store belongs to another job: point '
            "--checkpoint_store at this job's store, or delete its checkpoint data and "
            'start the pipeline from scratch.')

    # Committing ----------------------------------------------------------------------
    def commit(self, entry: str, revision: Revision | int, dirty: Mapping[bytes, bytes],
               deleted: Iterable[bytes], parent: Revision | None = None,
               keep: Iterable[Revision] = ()) -> None:
        """Record the changes made on `parent`'s state as `revision` (keys in both `dirty`
        and `deleted` end up deleted): the delta goes to the store first, then into the
        cache. When its chain reaches `snapshot_every` revisions a snapshot is written
        too, and what neither `revision`, `parent` nor the revisions in `keep` (the cuts
        the driver retains) need is collected.

        `parent` None means Revision(revision.version - 1, 0) (an int revision v is
        Revision(v, 0)). Committing the same revision again (a retried task) with the
        same parent and changes is harmless. If this raises, the cache entry is dropped.
        """
        revision = as_revision(revision)
        parent = Revision(revision.version - 1, 0) if parent is None else as_revision(parent)
        if revision.version < 0 or parent.version >= revision.version:
            raise ValueError(f'Cannot commit revision {revision} on parent {parent}: '
                             'committed versions start at 0, above their parent\'s')
        deleted = sorted(set(deleted))
        try:
            with self._lock:
                if entry not in self._created:
                    self.store.create_entry(entry)
                    self._created.add(entry)
                cached = self._copies.get(entry)
                self._attached.pop(entry, None)
                chain = [parent, *self._lineage(entry, parent, cached)]
                payload = _encode(_DELTA, revision, chain, dirty, deleted)
                self.store.put_chunked(entry, _key(_DELTA, revision), payload)
                self._advance(entry, cached, revision, chain, dirty, deleted, len(payload))
                if self._wants_snapshot(entry, revision, chain):
                    self._snapshot(entry, revision, chain, keep)
        except BaseException:
            self.drop(entry)
            raise

    def _lineage(self, entry: str, revision: Revision,
                 cached: CachedState | None) -> list[Revision]:
        """The chain a child of `revision` extends: [] for the initial state or a
        revision with a snapshot, else the chain of its delta."""
        if revision == INITIAL_REVISION:
            return []
        if cached is not None and cached.revision == revision:
            return cached.chain
        if self.store.exists(entry, _key(_SNAPSHOT, revision)):
            return []
        payload = self.store.get_chunked(entry, _key(_DELTA, revision))
        if payload is None:
            raise MissingStateError(self._gap_message(entry, revision, None))
        return _header(payload, _DELTA, revision, entry)[0]

    def _advance(self, entry: str, cached: CachedState | None, revision: Revision,
                 chain: list[Revision], dirty: Mapping[bytes, bytes],
                 deleted: list[bytes], size: int) -> None:
        """Moves the cache entry to `revision` if it holds the parent (or `revision`
        itself, committed on the same parent: a retry applies the same changes again).
        `size`: the bytes of the delta's payload."""
        if cached is None:
            return
        parent = chain[0]
        if cached.revision == parent or (cached.revision, cached.parent) == (revision, parent):
            chain_bytes = cached.chain_bytes
            if cached.revision == parent and chain_bytes is not None:
                chain_bytes += size
            advanced = CachedState(revision, cached.state, chain, parent, chain_bytes)
            if not self._copies.advance(entry, cached.revision, advanced, [(dirty, deleted)]):
                self.drop(entry)  # another worker moved the copy meanwhile
        elif cached.revision == revision:
            self.drop(entry)  # on another parent: the changes do not apply to it
        # Else the entry holds another revision, still valid as it is.

    def _wants_snapshot(self, entry: str, revision: Revision, chain: list[Revision]) -> bool:
        if len(chain) >= self.max_chain:
            return True
        if len(chain) < self.snapshot_every or not self.snapshot_bytes_ratio:
            return len(chain) >= self.snapshot_every
        if len(chain) % self.snapshot_every:
            return False
        cached = self._copies.get(entry)
        if cached is None or cached.revision != revision or cached.chain_bytes is None:
            return False  # judged again at max_chain
        return cached.chain_bytes >= self.snapshot_bytes_ratio * _state_bytes(cached.state)

    def _snapshot(self, entry: str, revision: Revision, chain: list[Revision],
                  keep: Iterable[Revision]) -> None:
        cached = self._copies.get(entry)
        if cached is None or cached.revision != revision:
            _, cached = self._read(entry, None, revision)
        self.store.put_chunked(entry, _key(_SNAPSHOT, revision),
                               _encode(_SNAPSHOT, revision, [], cached.state, ()))
        # Its lineage now starts here; its values are unchanged.
        self._copies.advance(entry, revision,
                             CachedState(revision, cached.state, [], cached.parent, 0), ())
        self._collect(entry, revision, chain, keep)

    def _collect(self, entry: str, revision: Revision, chain: list[Revision],
                 keep: Iterable[Revision]) -> None:
        """Deletes the deltas and snapshots older than `revision` that no load of it, of
        its parent (`chain[0]`) or of a revision in `keep` needs."""
        snapshots = set(_revisions(self.store, entry, _SNAPSHOT))
        deltas = set(_revisions(self.store, entry, _DELTA))
        needed: set[tuple[bytes, Revision]] = set()

        def walk(path: Iterable[Revision]) -> None:
            # What loading path[0] needs, as `_read` loads it: up to the nearest snapshot.
            for ancestor in path:
                if ancestor == INITIAL_REVISION:
                    return
                if ancestor in snapshots:
                    needed.add((_SNAPSHOT, ancestor))
                    return
                needed.add((_DELTA, ancestor))

        walk(chain)  # `revision` itself has a snapshot and is never collected
        for kept in {as_revision(k) for k in keep} - {revision, chain[0]}:
            if kept in snapshots or kept == INITIAL_REVISION:
                walk([kept])
                continue
            payload = self.store.get_chunked(entry, _key(_DELTA, kept)) if kept in deltas else None
            # A kept revision already gone (or never written) has nothing left to keep.
            if payload is not None:
                walk([kept, *_header(payload, _DELTA, kept, entry)[0]])
        for kind, present in ((_SNAPSHOT, snapshots), (_DELTA, deltas)):
            for old in sorted(present):
                # Newer revisions (another attempt of this epoch, a racing commit)
                # are not this commit's to judge.
                if old.version < revision.version and (kind, old) not in needed:
                    self.store.delete_chunked(entry, _key(kind, old))

    # The cache -----------------------------------------------------------------------
    def drop(self, entry: str) -> None:
        """Forget the cached state of `entry` (its task failed: the dict may be half-changed)."""
        with self._lock:
            self._attached.pop(entry, None)
            self._copies.drop(entry)

    def attach(self, entry: str, revision: Revision | int, obj: Any) -> None:
        """Hang `obj` (e.g. the live operator) on the cache entry, valid at `revision` only.

        The entry must be at `revision` (after `load` or `commit` of it); the next
        commit, load of another revision or drop detaches it.
        """
        revision = as_revision(revision)
        with self._lock:
            cached = self._copies.get(entry)
            if cached is None or cached.revision != revision:
                held = None if cached is None else _label(cached.revision)
                raise ValueError(f'Cannot attach to {entry!r} at revision {_label(revision)}: '
                                 f'the cache holds revision {held}')
            self._attached[entry] = (revision, obj)

    def attached(self, entry: str, revision: Revision | int) -> Any | None:
        """The object attached to `entry` at `revision`, or None. Counts no load."""
        revision = as_revision(revision)
        with self._lock:
            attached = self._attached.get(entry)
            if attached is None or attached[0] != revision:
                return None
            cached = self._copies.get(entry)  # another worker of the host may have moved it
            return attached[1] if cached is not None and cached.revision == revision else None

    def cached_revision(self, entry: str) -> Revision | None:
        """The revision the cache holds for `entry`, or None."""
        cached = self._copies.get(entry)
        return None if cached is None else cached.revision


class CachedState:
    """A cache entry: `chain` is what a child's chain extends ([] when `revision` has a
    snapshot); `parent` is known when the entry came from a delta, else None;
    `chain_bytes`, when known, the bytes of the deltas a full load of `revision` reads
    after its base."""

    __slots__ = ('chain', 'chain_bytes', 'parent', 'revision', 'state')

    def __init__(self, revision: Revision, state: Mapping[bytes, bytes],
                 chain: list[Revision], parent: Revision | None,
                 chain_bytes: int | None) -> None:
        self.revision = revision
        self.state = state
        self.chain = chain
        self.parent = parent
        self.chain_bytes = chain_bytes


class StateCopies(Protocol):
    """Where a `VersionedStateCache` keeps the full state of each entry it holds, with
    its revision and lineage: this process's memory (`MemoryCopies`) or the host's
    live states, shared by its workers (`host_state.HostCopies`)."""

    def get(self, entry: str) -> CachedState | None:
        """The copy of `entry` (its `state` a mapping to read only), or None."""

    def put(self, entry: str, cached: CachedState) -> None:
        """Makes `cached` (its `state` a full dict) the copy of `entry`; `cached.state`
        may become the copy's own mapping."""

    def advance(self, entry: str, held: Revision, cached: CachedState,
                changes: Iterable[tuple[Mapping[bytes, bytes], Iterable[bytes]]]) -> bool:
        """If the copy of `entry` is at revision `held`: applies `changes` (pairs set,
        keys deleted, in order) to it, gives it `cached`'s revision and lineage, sets
        `cached.state` to its state, and returns True. Else changes nothing: False."""

    def drop(self, entry: str) -> None:
        """Forgets the copy of `entry`."""


class MemoryCopies:
    """The copies as dicts in this process's memory."""

    def __init__(self) -> None:
        self._copies: dict[str, CachedState] = {}

    def get(self, entry: str) -> CachedState | None:
        return self._copies.get(entry)

    def put(self, entry: str, cached: CachedState) -> None:
        self._copies[entry] = cached

    def advance(self, entry: str, held: Revision, cached: CachedState,
                changes: Iterable[tuple[Mapping[bytes, bytes], Iterable[bytes]]]) -> bool:
        copy = self._copies.get(entry)
        if copy is None or copy.revision != held:
            return False
        for pairs, deleted in changes:
            _apply(copy.state, pairs, deleted)
        cached.state = copy.state
        self._copies[entry] = cached
        return True

    def drop(self, entry: str) -> None:
        self._copies.pop(entry, None)


# Store keys -----------------------------------------------------------------------------
def _key(kind: bytes, revision: Revision) -> bytes:
    return kind + _REVISION.pack(*revision)


def _revisions(store: CheckpointStore, entry: str, kind: bytes) -> list[Revision]:
    """Revisions of the deltas or snapshots present, ascending."""
    # A chunked value's chunks share its key as prefix; only the headers have
    # exactly the length of our keys.
    return [Revision(*_REVISION.unpack_from(key, 1))
            for key in store.keys(entry, prefix=kind) if len(key) == _KEY_LENGTH]


def _label(revision: Revision) -> str:
    version, attempt = revision
    return str(version) if attempt == 0 else f'{version} (attempt {attempt})'


def _ranges(revisions: Iterable[Revision]) -> str:
    """[1, 2, 3, 7, (8, 1)] -> '1-3, 7, 8 (attempt 1)' (for error messages)."""
    spans: list[list[Revision]] = []
    for revision in sorted(revisions):
        last = spans[-1][1] if spans else None
        if (last is not None and revision.attempt == last.attempt == 0
                and revision.version == last.version + 1):
            spans[-1][1] = revision
        else:
            spans.append([revision, revision])
    text = ', '.join(_label(a) if a == b else f'{a.version}-{b.version}' for a, b in spans)
    return f'[{text}]' if text else 'none'


# Payloads ---------------------------------------------------------------------------------
def _encode(kind: bytes, revision: Revision, chain: list[Revision],
            pairs: Mapping[bytes, bytes], deleted: Iterable[bytes]) -> bytes:
    items = sorted(pairs.items())
    deleted = sorted(deleted)
    lengths = [n for key, value in items for n in (len(key), len(value))]
    lengths += [len(key) for key in deleted]
    n = len(chain)
    return b''.join([
        _PAYLOAD_HEADER.pack(kind, *revision, n, len(items), len(deleted)),
        struct.pack(f'<{n}q{n}H', *(r.version for r in chain), *(r.attempt for r in chain)),
        struct.pack(f'<{len(lengths)}I', *lengths),
        *[part for item in items for part in item],
        *deleted,
    ])


def _header(payload: bytes, kind: bytes, revision: Revision,
            entry: str) -> tuple[list[Revision], int, int, int]:
    """(chain, pair count, deletion count, offset of the lengths) of a payload checked
    to be the `kind` of `revision`."""
    found_kind, version, attempt, n, n_pairs, n_deleted = _PAYLOAD_HEADER.unpack_from(payload)
    if (found_kind, (version, attempt)) != (kind, revision):
        raise MissingStateError(
            f'The checkpoint store holds {found_kind!r}@{_label(Revision(version, attempt))} '
            f'under the key of {kind!r}@{_label(revision)} in {entry!r}: the store is '
            'damaged; delete its checkpoint data and start the pipeline from scratch.')
    fields = struct.unpack_from(f'<{n}q{n}H', payload, _PAYLOAD_HEADER.size)
    chain = [Revision(v, a) for v, a in zip(fields[:n], fields[n:], strict=True)]
    return chain, n_pairs, n_deleted, _PAYLOAD_HEADER.size + struct.calcsize(f'<{n}q{n}H')


def _decode(payload: bytes, kind: bytes, revision: Revision,
            entry: str) -> tuple[list[Revision], dict[bytes, bytes], list[bytes]]:
    """(chain, pairs, deleted keys) of a payload, checked to be the `kind` of `revision`."""
    chain, n_pairs, n_deleted, offset = _header(payload, kind, revision, entry)
    n_lengths = 2 * n_pairs + n_deleted
    lengths = struct.unpack_from(f'<{n_lengths}I', payload, offset)
    ends = list(accumulate(lengths, initial=offset + 4 * n_lengths))
    parts = [payload[a:b] for a, b in pairwise(ends)]
    pairs = dict(zip(parts[0:2 * n_pairs:2], parts[1:2 * n_pairs:2], strict=True))
    return chain, pairs, parts[2 * n_pairs:]


def _state_bytes(state: Mapping[bytes, bytes]) -> int:
    known = getattr(state, 'nbytes', None)  # a host copy counts its bytes as it changes
    if known is not None:
        return known
    return sum(map(len, state)) + sum(map(len, state.values()))


def _apply(state: dict[bytes, bytes], pairs: Mapping[bytes, bytes],
           deleted: Iterable[bytes]) -> None:
    state.update(pairs)
    for key in deleted:
        state.pop(key, None)
