"""Tests of `VersionedStateCache` (no Spark).

Directed tests walk each load path ('hit', 'catch-up', 'snapshot', 'initial'),
retries and gaps, a reset to a cut (a branching lineage), fenced attempts and
what garbage collection keeps. A property test plays two Python workers (two
caches over one `LocalDirectoryStore`) taking the epochs of one partition at
random, with task failures, retries of committed epochs and worker restarts; a
state machine plays workers committing, resetting to kept cuts (with zombie
attempts) and loading, both against a dict model.
"""

from __future__ import annotations

import random
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from beam_streams_runner.state.versioned_state import (
    INITIAL_REVISION,
    MissingStateError,
    Revision,
    VersionedStateCache,
    _decode,
    _encode,
)
from beam_streams_runner.stores import CorruptCheckpointError, LocalDirectoryStore, MemoryStore
from beam_streams_runner.stores.base import CHUNK_INFIX

ENTRY = 'job/count/p3'


def delta_key(version: int, attempt: int = 0) -> bytes:
    return b'd' + version.to_bytes(8, 'big') + attempt.to_bytes(2, 'big')


def stored_revisions(store, kind: bytes) -> list[Revision]:
    return [Revision(int.from_bytes(key[1:9], 'big'), int.from_bytes(key[9:], 'big'))
            for key in store.keys(ENTRY, prefix=kind) if CHUNK_INFIX not in key]


def stored_versions(store, kind: bytes) -> list[int]:
    return [revision.version for revision in stored_revisions(store, kind)]


class CountingStore(MemoryStore):
    """Counts reads, and fails chunked writes on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.fail_writes = False

    def get(self, entry, key):
        self.reads += 1
        return super().get(entry, key)

    def put_chunked(self, entry, key, value, chunk_size=1 << 20):
        if self.fail_writes:
            raise OSError('disk full')
        super().put_chunked(entry, key, value, chunk_size)


def commit_counts(cache: VersionedStateCache, versions, entry: str = ENTRY,
                  keep=()) -> None:
    """Epoch v sets b'n' to v and b'k<v>' to b'x'; every third epoch deletes the previous."""
    for v in versions:
        deleted = [b'k%d' % (v - 1)] if v % 3 == 0 else []
        cache.commit(entry, v, {b'n': b'%d' % v, b'k%d' % v: b'x'}, deleted, keep=keep)


def expected_counts(version: int) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for v in range(version + 1):
        state.update({b'n': b'%d' % v, b'k%d' % v: b'x'})
        if v % 3 == 0:
            state.pop(b'k%d' % (v - 1), None)
    return state


# The four load paths -----------------------------------------------------------------------
def test_initial_load_is_empty_and_free():
    store = CountingStore()
    cache = VersionedStateCache(store)
    assert cache.load(ENTRY, -1) == ({}, 'initial')
    assert store.reads == 0
    assert cache.stats['initial'] == 1


def test_hit_returns_the_cached_dict_without_reading_the_store():
    store = CountingStore()
    cache = VersionedStateCache(store)
    state, _ = cache.load(ENTRY, -1)
    state[b'a'] = b'1'  # the operator changes the cache's dict in place ...
    cache.commit(ENTRY, 0, {b'a': b'1'}, [])  # ... and commits the same change
    reads = store.reads
    again, how = cache.load(ENTRY, 0)
    assert how == 'hit' and again is state and again == {b'a': b'1'}
    assert store.reads == reads


def test_catch_up_applies_only_the_missed_deltas():
    store = MemoryStore()
    worker_a, worker_b = VersionedStateCache(store), VersionedStateCache(store)
    worker_a.load(ENTRY, -1)
    commit_counts(worker_a, [0, 1])
    assert worker_b.load(ENTRY, 1) == (expected_counts(1), 'snapshot')  # no cache yet
    commit_counts(worker_b, [2, 3, 4])
    state, how = worker_a.load(ENTRY, 4)
    assert (state, how) == (expected_counts(4), 'catch-up')
    assert worker_a.stats['deltas_read'] == 3  # versions 2, 3 and 4
    assert worker_a.stats['catch-up'] == 1


def test_snapshot_path_and_garbage_collection():
    store = MemoryStore()
    writer = VersionedStateCache(store, snapshot_every=3)
    writer.load(ENTRY, -1)
    commit_counts(writer, range(8))
    # A snapshot when a chain reaches 3 deltas: at 2 (on 1, 0 and the initial state)
    # and 5 (on 4, 3 and snapshot 2). Loading 4 (the parent of 5) needs snapshot 2
    # and deltas 3-4; delta 5 and newer are never collected by the commit of 5.
    assert stored_versions(store, b's') == [2, 5]
    assert stored_versions(store, b'd') == [3, 4, 5, 6, 7]
    for version in (4, 5, 6, 7):
        reader = VersionedStateCache(store, snapshot_every=3)
        assert reader.load(ENTRY, version) == (expected_counts(version), 'snapshot')
    assert reader.stats['deltas_read'] == 2  # snapshot 5 plus deltas 6 and 7
    with pytest.raises(MissingStateError):  # collected: no load of 4 or later needs it
        VersionedStateCache(store).load(ENTRY, 1)
    store.delete_chunked(ENTRY, b's' + (5).to_bytes(8, 'big') + bytes(2))
    with pytest.raises(MissingStateError, match='its base, the snapshot at 5, is missing \\('):
        VersionedStateCache(store).load(ENTRY, 7)


def test_revisions_are_checked():
    cache = VersionedStateCache(MemoryStore())
    for bad in (-2, Revision(-1, 1), Revision(0, -1), Revision(0, 2**16)):
        with pytest.raises(ValueError, match='Not a revision'):
            cache.load(ENTRY, bad)
    for revision, parent in ((3, Revision(3)), (-1, None), (0, Revision(1))):
        with pytest.raises(ValueError, match='above their parent'):
            cache.commit(ENTRY, revision, {}, [], parent=parent)


def test_cache_ahead_of_the_expected_version_reloads():
    store = MemoryStore()
    cache = VersionedStateCache(store, snapshot_every=2)
    cache.load(ENTRY, -1)
    commit_counts(cache, range(5))
    # A retry of epoch 4 in the same worker asks for version 3 again.
    assert cache.load(ENTRY, 3) == (expected_counts(3), 'snapshot')


# Retries and failures ----------------------------------------------------------------------
@pytest.mark.parametrize('snapshot_every', [1, 2, 3, 20])
def test_previous_version_loads_after_another_worker_committed(snapshot_every):
    store = MemoryStore()
    committer = VersionedStateCache(store, snapshot_every=snapshot_every)
    committer.load(ENTRY, -1)
    for v in range(12):
        commit_counts(committer, [v])
        # A retry of epoch v, in a fresh worker, must see exactly version v-1.
        retry = VersionedStateCache(store, snapshot_every=snapshot_every)
        assert retry.load(ENTRY, v - 1)[0] == expected_counts(v - 1)


def test_committing_a_version_twice_is_idempotent():
    store = MemoryStore()
    first, second = VersionedStateCache(store, 4), VersionedStateCache(store, 4)
    first.load(ENTRY, -1)
    commit_counts(first, range(3))
    layout = store.keys(ENTRY)
    commit_counts(first, [2])  # the same worker again
    second.load(ENTRY, 1)
    commit_counts(second, [2])  # another worker (snapshot 3 is not due yet)
    commit_counts(first, [3])
    second.load(ENTRY, 2)
    commit_counts(second, [3])  # a retried snapshot version
    assert len(store.keys(ENTRY)) == len(layout) + 4  # delta 3 and snapshot 3, two keys each
    for cache in (first, second, VersionedStateCache(store)):
        assert cache.load(ENTRY, 3)[0] == expected_counts(3)


def test_failed_commit_drops_the_cache_entry():
    store = CountingStore()
    cache = VersionedStateCache(store)
    cache.load(ENTRY, -1)
    cache.commit(ENTRY, 0, {b'a': b'1'}, [])
    store.fail_writes = True
    with pytest.raises(OSError, match='disk full'):
        cache.commit(ENTRY, 1, {b'a': b'2'}, [])
    assert cache.cached_revision(ENTRY) is None
    store.fail_writes = False
    assert cache.load(ENTRY, 0) == ({b'a': b'1'}, 'snapshot')


def test_dropped_entry_is_reloaded():
    store = MemoryStore()
    cache = VersionedStateCache(store)
    state, _ = cache.load(ENTRY, -1)
    cache.commit(ENTRY, 0, {b'a': b'1'}, [])
    state, _ = cache.load(ENTRY, 0)
    state[b'half'] = b'done'  # the task fails half-way
    cache.drop(ENTRY)
    assert cache.load(ENTRY, 0) == ({b'a': b'1'}, 'snapshot')


# Gaps and damage ---------------------------------------------------------------------------
def test_a_gap_in_the_deltas_is_a_clear_error():
    store = MemoryStore()
    cache = VersionedStateCache(store)
    cache.load(ENTRY, -1)
    commit_counts(cache, range(5))
    stale = VersionedStateCache(store)
    stale.load(ENTRY, 1)
    store.delete_chunked(ENTRY, delta_key(3))
    for worker in (VersionedStateCache(store), stale):
        with pytest.raises(MissingStateError) as raised:
            worker.load(ENTRY, 4)
        message = str(raised.value)
        assert repr(ENTRY) in message and 'revision 4' in message
        assert 'deltas of revisions [3] after the initial state are missing' in message
        assert 'holds snapshots none and deltas [0-2, 4]' in message
        assert 'start the pipeline from scratch' in message
    assert stale.cached_revision(ENTRY) is None  # the failed catch-up dropped the entry
    with pytest.raises(MissingStateError, match='neither the delta nor a snapshot of '
                                                'revision 2 is there'):
        VersionedStateCache(MemoryStore()).load(ENTRY, 2)  # nothing was ever committed
    store.delete_chunked(ENTRY, delta_key(1))
    with pytest.raises(MissingStateError, match='the deltas of revisions \\[1, 3\\]'):
        VersionedStateCache(store).load(ENTRY, 4)


def test_a_damaged_delta_is_reported_as_corrupt():
    store = MemoryStore()
    cache = VersionedStateCache(store)
    cache.load(ENTRY, -1)
    commit_counts(cache, range(3))
    chunk = store.keys(ENTRY, prefix=delta_key(1) + CHUNK_INFIX)[0]
    store.put(ENTRY, chunk, b'garbage')
    with pytest.raises(CorruptCheckpointError, match='chunk 0'):
        VersionedStateCache(store).load(ENTRY, 2)


# Resets and fencing (design section 12) ----------------------------------------------------
@pytest.mark.parametrize('snapshot_every', [1, 3, 20])
def test_a_reset_continues_on_the_cut(snapshot_every):
    """Epoch 12 failed; the driver resets to the cut at 8: epoch 13 sits on 8, and the
    aborted deltas 9-12 are never loaded, then collected."""
    store = MemoryStore()
    cache = VersionedStateCache(store, snapshot_every)
    cache.load(ENTRY, -1)
    commit_counts(cache, range(9))
    commit_counts(cache, range(9, 13), keep=[Revision(8)])  # the driver retains the cut
    resetter = VersionedStateCache(store, snapshot_every)
    assert resetter.load(ENTRY, 8)[0] == expected_counts(8)
    resetter.commit(ENTRY, 13, {b'n': b'13'}, [b'k7'], parent=Revision(8), keep=[Revision(8)])
    model = {**expected_counts(8), b'n': b'13'}
    del model[b'k7']
    assert cache.cached_revision(ENTRY) == (12, 0)
    for reader in (VersionedStateCache(store, snapshot_every), cache):
        assert reader.load(ENTRY, 13) == (model, 'snapshot')
    assert resetter.load(ENTRY, 13) == (model, 'hit')
    at_8 = VersionedStateCache(store, snapshot_every)
    at_8.load(ENTRY, 8)
    # Catches up on delta 13 unless 13 has a snapshot of its own (a chain of 1 delta).
    assert at_8.load(ENTRY, 13) == (model, 'snapshot' if snapshot_every == 1 else 'catch-up')
    cache.load(ENTRY, 13)
    commit_counts(cache, range(14, 14 + 2 * snapshot_every))  # the cut at 8 retired
    assert not set(range(9, 13)) & {*stored_versions(store, b'd'), *stored_versions(store, b's')}


@pytest.mark.parametrize('zombie', ['first', 'after the winner', 'after the child'])
def test_attempts_are_fenced(zombie):
    """Attempts 0 (a zombie) and 1 of epoch 5 both commit; the driver names attempt 1,
    so it and its child load attempt 1's state whatever order the writes landed in."""
    store = MemoryStore()
    writer = VersionedStateCache(store, snapshot_every=3)
    writer.load(ENTRY, -1)
    commit_counts(writer, range(5))
    workers = [VersionedStateCache(store, snapshot_every=3) for _ in range(2)]

    def write_attempt(attempt: int) -> None:
        workers[attempt].load(ENTRY, 4)
        workers[attempt].commit(ENTRY, Revision(5, attempt), {b'who': b'%d' % attempt},
                                [b'n'], parent=Revision(4))

    def write_child() -> None:
        writer.load(ENTRY, Revision(5, 1))
        writer.commit(ENTRY, 6, {b'n': b'6'}, [], parent=Revision(5, 1))

    steps = {'first': [0, 1, 'child'], 'after the winner': [1, 0, 'child'],
             'after the child': [1, 'child', 0]}[zombie]
    for step in steps:
        write_child() if step == 'child' else write_attempt(step)
    # A chain of 3 deltas: both attempts wrote a snapshot, each under its own key.
    assert {(5, 0), (5, 1)} <= set(stored_revisions(store, b's'))
    winner = {**expected_counts(4), b'who': b'1'}
    del winner[b'n']
    zombie_process = workers[0]
    assert zombie_process.cached_revision(ENTRY) == (5, 0)
    for cache in (zombie_process, *workers, VersionedStateCache(store)):
        state, kind = cache.load(ENTRY, Revision(5, 1))
        assert state == winner and (kind == 'hit') == (cache is workers[1])
        assert cache.load(ENTRY, 6)[0] == {**winner, b'n': b'6'}


def test_collection_keeps_the_kept_cuts_and_deletes_aborted_lineages():
    store = MemoryStore()
    cache = VersionedStateCache(store, snapshot_every=2)  # a snapshot at every 2nd revision
    cache.load(ENTRY, -1)
    commit_counts(cache, range(3))
    commit_counts(cache, [3], keep=[Revision(2)])  # the cut at 2 is a delta on snapshot 1
    commit_counts(cache, [4], keep=[Revision(2), Revision(3)])
    zombie = VersionedStateCache(store, snapshot_every=2)
    zombie.load(ENTRY, 3)
    zombie.commit(ENTRY, Revision(4, 1), {b'zombie': b'!'}, [], parent=Revision(3))
    commit_counts(cache, [5], keep=[Revision(2), Revision(3)])
    # Epoch 6 failed: reset to the cut at 3; 4, (4, 1) and 5 are aborted.
    cache.load(ENTRY, 3)
    for v in range(6, 21):
        cache.commit(ENTRY, v, {b'n': b'%d' % v}, [], parent=Revision(v - 1 if v > 6 else 3),
                     keep=[Revision(2), Revision(3)])
    # Kept: the cut at 2 (delta 2 and its base, snapshot 1), the cut at 3 (a snapshot),
    # the parent of the last snapshot (19: delta 18 on snapshot 17), and 19 and later.
    assert stored_revisions(store, b's') == [(1, 0), (3, 0), (17, 0), (19, 0)]
    assert stored_revisions(store, b'd') == [(2, 0), (18, 0), (19, 0), (20, 0)]
    for cut in (2, 3):
        assert VersionedStateCache(store).load(ENTRY, cut)[0] == expected_counts(cut)
    for aborted in (Revision(4, 1), Revision(5)):
        with pytest.raises(MissingStateError, match='neither the delta nor a snapshot'):
            VersionedStateCache(store).load(ENTRY, aborted)
    cache.commit(ENTRY, 21, {}, [], keep=[Revision(3)])  # the cut at 2 retired
    assert stored_revisions(store, b's') == [(3, 0), (19, 0), (21, 0)]
    assert stored_revisions(store, b'd') == [(20, 0), (21, 0)]
    assert VersionedStateCache(store).load(ENTRY, 21)[0] == {**expected_counts(3), b'n': b'20'}


# Attached objects --------------------------------------------------------------------------
def test_attached_object_is_valid_at_its_version_only():
    store = MemoryStore()
    cache = VersionedStateCache(store)
    cache.load(ENTRY, -1)
    operator = object()
    cache.attach(ENTRY, -1, operator)
    assert cache.attached(ENTRY, -1) is operator
    assert cache.attached(ENTRY, 0) is None
    cache.commit(ENTRY, 0, {b'a': b'1'}, [])
    assert cache.attached(ENTRY, 0) is None  # a commit detaches: re-attach at the new version
    cache.attach(ENTRY, 0, operator)
    assert cache.load(ENTRY, 0)[1] == 'hit' and cache.attached(ENTRY, 0) is operator
    with pytest.raises(ValueError, match='holds revision 0'):
        cache.attach(ENTRY, 1, operator)
    cache.drop(ENTRY)
    assert cache.attached(ENTRY, 0) is None


# Encoding ----------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(pairs=st.dictionaries(st.binary(max_size=8), st.binary(max_size=20), max_size=20),
       deleted=st.sets(st.binary(max_size=8), max_size=5),
       revision=st.builds(Revision, st.integers(0, 2**62), st.integers(0, 2**16 - 1)),
       chain=st.lists(st.builds(Revision, st.integers(-1, 2**62), st.integers(0, 9)),
                      max_size=4))
def test_payloads_round_trip_and_are_deterministic(pairs, deleted, revision, chain):
    payload = _encode(b'd', revision, chain, pairs, deleted)
    shuffled = dict(reversed(list(pairs.items())))
    assert _encode(b'd', revision, chain, shuffled, list(reversed(sorted(deleted)))) == payload
    assert _decode(payload, b'd', revision, ENTRY) == (chain, pairs, sorted(deleted))
    with pytest.raises(MissingStateError, match='damaged'):
        _decode(payload, b's', revision, ENTRY)
    with pytest.raises(MissingStateError, match='damaged'):
        _decode(payload, b'd', revision._replace(attempt=revision.attempt ^ 1), ENTRY)


# Two workers, random assignment ------------------------------------------------------------
EPOCHS = 200
KEY_POOL = [b'k%d' % i for i in range(12)]
EVENTS = st.sampled_from(['ok'] * 6 + ['fail', 'retry', 'restart'])


@settings(max_examples=15, deadline=None)
@given(snapshot_every=st.integers(1, 9), ratio=st.sampled_from([0.0, 1.0, 2.0]),
       max_chain=st.integers(1, 30),
       workers=st.lists(st.integers(0, 1), min_size=EPOCHS, max_size=EPOCHS),
       events=st.lists(EVENTS, min_size=EPOCHS, max_size=EPOCHS),
       seed=st.integers(0, 2**32 - 1))
def test_two_workers_alternating_at_random_match_a_dict_model(
        snapshot_every, ratio, max_chain, workers, events, seed):
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as root:
        store = LocalDirectoryStore(root)

        def new_cache() -> VersionedStateCache:
            return VersionedStateCache(store, snapshot_every, ratio, max_chain)

        caches = [new_cache() for _ in range(2)]
        model: dict[int, dict[bytes, bytes]] = {-1: {}}

        def run_epoch(worker: int, epoch: int, changes, fail: bool = False) -> None:
            cache = caches[worker]
            held = cache.cached_revision(ENTRY)
            state, how = cache.load(ENTRY, epoch - 1)
            assert state == model[epoch - 1]
            if epoch == 0:
                assert how == 'initial'
            elif held == (epoch - 1, 0):
                assert how == 'hit'
            elif held is not None and held.version < epoch - 1:
                assert how in ('catch-up', 'snapshot')
            else:
                assert how == 'snapshot'
            dirty, deleted = changes
            state.update(dirty)  # the operator works on the cache's dict in place
            if fail:
                state[b'half-done'] = b'!'
                cache.drop(ENTRY)
                return
            for key in deleted:
                state.pop(key, None)
            cache.commit(ENTRY, epoch, dirty, deleted)
            assert cache.cached_revision(ENTRY) == (epoch, 0)

        for epoch in range(EPOCHS):
            dirty = {key: b'%d' % rng.randrange(1000)
                     for key in rng.sample(KEY_POOL, rng.randrange(4))}
            deleted = set(rng.sample(KEY_POOL, rng.randrange(3))) - set(dirty)
            changes = (dirty, deleted)
            worker, event = workers[epoch], events[epoch]
            if event == 'restart':  # the Python worker was replaced by a fresh one
                caches[worker] = new_cache()
            if event == 'fail':  # fails half-way, then Spark retries on any worker
                run_epoch(worker, epoch, changes, fail=True)
                worker = rng.randrange(2)
            run_epoch(worker, epoch, changes)
            model[epoch] = {**model[epoch - 1], **dirty}
            for key in deleted:
                model[epoch].pop(key, None)
            if event == 'retry':  # epoch re-run after it committed (e.g. lost shuffle output)
                run_epoch(rng.randrange(2), epoch, changes)

        fresh = VersionedStateCache(store, snapshot_every)
        assert fresh.load(ENTRY, EPOCHS - 1)[0] == model[EPOCHS - 1]
        # Garbage collection keeps the store bounded: at most two snapshots and
        # the deltas since the older one.
        assert len(stored_versions(store, b's')) <= 2
        assert len(stored_versions(store, b'd')) <= 2 * snapshot_every
        counts = caches[0].stats
        assert counts['hit'] + counts['catch-up'] + counts['snapshot'] + counts['initial'] > 0


# Workers, resets and zombies: a state machine ----------------------------------------------
MACHINE_KEYS = [b'a', b'b', b'c', b'd']
CHANGES = st.tuples(
    st.dictionaries(st.sampled_from(MACHINE_KEYS), st.binary(max_size=2), max_size=3),
    st.sets(st.sampled_from(MACHINE_KEYS), max_size=2))


def changed(state: dict[bytes, bytes], changes) -> dict[bytes, bytes]:
    dirty, deleted = changes
    after = {**state, **dirty}
    for key in deleted:
        after.pop(key, None)
    return after


class LineageMachine(RuleBasedStateMachine):
    """Two or three workers (caches over one store) run one partition: commits on the
    current lineage (sometimes with a zombie attempt of the same epoch), checkpoints,
    resets to a kept cut, loads and retired cuts. Loadable are the kept cuts, the head,
    and the last commit and its parent (a retried task reloads it)."""

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.model: dict[Revision, dict[bytes, bytes]] = {INITIAL_REVISION: {}}
        self.kept = {INITIAL_REVISION}
        self.head = INITIAL_REVISION  # the next commit's parent
        self.last = (INITIAL_REVISION, INITIAL_REVISION)
        self.next_version = 0

    @initialize(workers=st.integers(2, 3), snapshot_every=st.integers(1, 4))
    def start(self, workers: int, snapshot_every: int) -> None:
        self.snapshot_every = snapshot_every
        self.caches = [self.new_cache(worker) for worker in range(workers)]

    def new_cache(self, worker: int) -> VersionedStateCache:
        """Worker `worker`'s cache, fresh (its copies in its own memory)."""
        return VersionedStateCache(self.store, self.snapshot_every)

    def cache(self, worker: int) -> VersionedStateCache:
        return self.caches[worker % len(self.caches)]

    @rule(worker=st.integers(0, 2), attempt=st.integers(0, 3), changes=CHANGES,
          zombie=st.sampled_from([None, None, 'before', 'after']), zombie_worker=st.integers(0, 2),
          zombie_changes=CHANGES, warm=st.booleans())
    def commit(self, worker, attempt, changes, zombie, zombie_worker, zombie_changes, warm):
        parent, version = self.head, self.next_version
        self.next_version += 1
        writes = [(worker, Revision(version, attempt), changes)]
        zombie_write = (zombie_worker, Revision(version, (attempt + 1) % 4), zombie_changes)
        if zombie is not None:
            writes.insert(0 if zombie == 'before' else 1, zombie_write)
        for writer, revision, (dirty, deleted) in writes:
            cache = self.cache(writer)
            if warm:  # the task loads its base (and changes the cache's dict in place)
                state, _ = cache.load(ENTRY, parent)
                assert dict(state) == self.model[parent]
                if isinstance(state, dict):
                    state.update(dirty)
                    for key in deleted:
                        state.pop(key, None)
            cache.commit(ENTRY, revision, dirty, deleted, parent=parent, keep=sorted(self.kept))
        winner = writes[0 if zombie != 'before' else 1][1]
        self.model[winner] = changed(self.model[parent], changes)
        self.head, self.last = winner, (winner, parent)

    @rule()
    def checkpoint(self) -> None:
        self.kept.add(self.head)

    @precondition(lambda self: self.kept)
    @rule(data=st.data())
    def reset(self, data) -> None:
        self.head = data.draw(st.sampled_from(sorted(self.kept)))

    @precondition(lambda self: self.kept)
    @rule(data=st.data())
    def retire(self, data) -> None:
        self.kept.discard(data.draw(st.sampled_from(sorted(self.kept))))

    @rule(worker=st.integers(0, 2), data=st.data())
    def load(self, worker, data) -> None:
        revision = data.draw(st.sampled_from(sorted({*self.kept, self.head, *self.last})))
        cache = self.cache(worker)
        held = cache.cached_revision(ENTRY)
        state, kind = cache.load(ENTRY, revision)
        assert dict(state) == self.model[revision]
        if revision == INITIAL_REVISION:
            assert kind == 'initial'
        else:
            assert (kind == 'hit') == (held == revision)

    @rule(worker=st.integers(0, 2))
    def fail(self, worker) -> None:
        """A task loads the head, changes the cache's dict half-way and fails."""
        state, _ = self.cache(worker).load(ENTRY, self.head)
        if isinstance(state, dict):
            state[b'half-done'] = b'!'
        self.cache(worker).drop(ENTRY)

    @rule(worker=st.integers(0, 2))
    def restart(self, worker) -> None:
        self.caches[worker % len(self.caches)] = self.new_cache(worker % len(self.caches))

    @invariant()
    def the_head_loads_in_a_fresh_worker(self) -> None:
        fresh = VersionedStateCache(self.store, getattr(self, 'snapshot_every', 1))
        assert fresh.load(ENTRY, self.head)[0] == self.model[self.head]


TestLineageMachine = LineageMachine.TestCase
TestLineageMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def _task(cache: VersionedStateCache, epoch: int, dirty: dict[bytes, bytes]) -> None:
    """An epoch's task: loads its base, commits its changes."""
    cache.load(ENTRY, epoch - 1)
    cache.commit(ENTRY, epoch, dirty, ())


def test_a_large_state_that_changes_little_is_not_rewritten_every_few_revisions():
    """With a bytes ratio, a snapshot waits until the deltas since the last one hold
    that many times the state's bytes (a 1 MB value written once, then a few bytes an
    epoch), or until the chain reaches its longest."""
    store = MemoryStore()
    cache = VersionedStateCache(store, snapshot_every=5, snapshot_bytes_ratio=2.0,
                                max_chain=30)
    _task(cache, 0, {b'big': bytes(1 << 20)})
    for epoch in range(1, 40):
        _task(cache, epoch, {b'small': b'%d' % epoch})
    assert stored_versions(store, b's') == [29]  # at 30 revisions, not at 5, 10, ...
    reader = VersionedStateCache(store)
    assert reader.load(ENTRY, 39)[0] == {b'big': bytes(1 << 20), b'small': b'39'}


def test_a_state_rewritten_each_revision_is_snapshot_at_the_multiples():
    store = MemoryStore()
    cache = VersionedStateCache(store, snapshot_every=5, snapshot_bytes_ratio=2.0,
                                max_chain=100)
    for epoch in range(16):
        _task(cache, epoch, {b'k%d' % i: b'%d' % epoch * 100 for i in range(10)})
    # Each delta rewrites the whole state, so five of them hold five times its bytes.
    # At 4, 9 and 14; the one at 4 collected (9 still serves a reload of 14's parent).
    assert stored_versions(store, b's') == [9, 14]
    assert VersionedStateCache(store).load(ENTRY, 15) == (
        {b'k%d' % i: b'15' * 100 for i in range(10)}, 'snapshot')


def test_the_bytes_of_a_chain_survive_a_catch_up_and_a_rebuild():
    store = MemoryStore()
    writer = VersionedStateCache(store, snapshot_every=4, snapshot_bytes_ratio=2.0)
    other = VersionedStateCache(store, snapshot_every=4, snapshot_bytes_ratio=2.0)
    _task(writer, 0, {b'k': b'x' * 1000})
    other.load(ENTRY, 0)
    _task(writer, 1, {b'k': b'y' * 1000})
    _task(writer, 2, {b'k': b'z' * 1000})
    _task(other, 3, {b'k': b'w' * 1000})  # caught up on 1 and 2: it knows all 4 deltas
    assert stored_versions(store, b's') == [3]
    rebuilt = VersionedStateCache(store, snapshot_every=4, snapshot_bytes_ratio=2.0)
    for epoch in range(4, 8):  # 7 rebuilt from the snapshot at 3 and the deltas after it
        _task(rebuilt if epoch == 7 else writer, epoch, {b'k': b'v' * 1000})
    assert stored_versions(store, b's') == [3, 7]  # 3 still serves a reload of 6
