"""Tests of `VersionedStateCache` (no Spark).

Directed tests walk each load path ('hit', 'catch-up', 'snapshot', 'initial'),
retries and gaps; a property test plays two Python workers (two caches over one
`LocalDirectoryStore`) taking the epochs of one partition at random, with task
failures, retries of committed epochs and worker restarts, against a dict model.
"""

from __future__ import annotations

import random
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.state.versioned_state import (
    MissingStateError,
    VersionedStateCache,
    _decode,
    _encode,
)
from beam_streams_runner.stores import CorruptCheckpointError, LocalDirectoryStore, MemoryStore
from beam_streams_runner.stores.base import CHUNK_INFIX

ENTRY = 'job/count/p3'


def delta_key(version: int) -> bytes:
    return b'd' + version.to_bytes(8, 'big')


def snapshot_key(version: int) -> bytes:
    return b's' + version.to_bytes(8, 'big')


def stored_versions(store, kind: bytes) -> list[int]:
    return [int.from_bytes(key[1:], 'big') for key in store.keys(ENTRY, prefix=kind)
            if CHUNK_INFIX not in key]


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


def commit_counts(cache: VersionedStateCache, versions, entry: str = ENTRY) -> None:
    """Epoch v sets b'n' to v and b'k<v>' to b'x'; every third epoch deletes the previous."""
    for v in versions:
        deleted = [b'k%d' % (v - 1)] if v % 3 == 0 else []
        cache.commit(entry, v, {b'n': b'%d' % v, b'k%d' % v: b'x'}, deleted)


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
    # Loading 5 (= version-1 of the last snapshot, 6) needs snapshot 3 and deltas 4-5.
    assert stored_versions(store, b's') == [3, 6]
    assert stored_versions(store, b'd') == [4, 5, 6, 7]
    for version in (5, 6, 7):
        reader = VersionedStateCache(store, snapshot_every=3)
        assert reader.load(ENTRY, version) == (expected_counts(version), 'snapshot')
    assert reader.stats['deltas_read'] == 1  # snapshot 6 plus delta 7
    with pytest.raises(MissingStateError):  # collected: no load of 5 or later needs it
        VersionedStateCache(store).load(ENTRY, 2)


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
    commit_counts(first, range(4))
    layout = store.keys(ENTRY)
    commit_counts(first, [3])  # the same worker again
    second.load(ENTRY, 2)
    commit_counts(second, [3])  # another worker (snapshot 4 is not due yet)
    commit_counts(first, [4])
    second.load(ENTRY, 3)
    commit_counts(second, [4])  # a retried snapshot version
    assert len(store.keys(ENTRY)) == len(layout) + 4  # delta 4 and snapshot 4, two keys each
    for cache in (first, second, VersionedStateCache(store)):
        assert cache.load(ENTRY, 4)[0] == expected_counts(4)


def test_failed_commit_drops_the_cache_entry():
    store = CountingStore()
    cache = VersionedStateCache(store)
    cache.load(ENTRY, -1)
    cache.commit(ENTRY, 0, {b'a': b'1'}, [])
    store.fail_writes = True
    with pytest.raises(OSError, match='disk full'):
        cache.commit(ENTRY, 1, {b'a': b'2'}, [])
    assert cache.cached_version(ENTRY) is None
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
        assert repr(ENTRY) in message and 'version 4' in message
        assert 'deltas of versions [3] after the initial state are missing' in message
        assert 'start the pipeline from scratch' in message
    assert stale.cached_version(ENTRY) is None  # the failed catch-up dropped the entry
    with pytest.raises(MissingStateError, match='deltas of versions \\[0-2\\]'):
        VersionedStateCache(MemoryStore()).load(ENTRY, 2)  # nothing was ever committed


def test_a_damaged_delta_is_reported_as_corrupt():
    store = MemoryStore()
    cache = VersionedStateCache(store)
    cache.load(ENTRY, -1)
    commit_counts(cache, range(3))
    chunk = store.keys(ENTRY, prefix=delta_key(1) + CHUNK_INFIX)[0]
    store.put(ENTRY, chunk, b'garbage')
    with pytest.raises(CorruptCheckpointError, match='chunk 0'):
        VersionedStateCache(store).load(ENTRY, 2)


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
    with pytest.raises(ValueError, match='holds version 0'):
        cache.attach(ENTRY, 1, operator)
    cache.drop(ENTRY)
    assert cache.attached(ENTRY, 0) is None


# Encoding ----------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(pairs=st.dictionaries(st.binary(max_size=8), st.binary(max_size=20), max_size=20),
       deleted=st.sets(st.binary(max_size=8), max_size=5),
       version=st.integers(0, 2**62))
def test_payloads_round_trip_and_are_deterministic(pairs, deleted, version):
    payload = _encode(b'd', version, pairs, deleted)
    shuffled = dict(reversed(list(pairs.items())))
    assert _encode(b'd', version, shuffled, list(reversed(sorted(deleted)))) == payload
    assert _decode(payload, b'd', version, ENTRY) == (pairs, sorted(deleted))
    with pytest.raises(MissingStateError, match='damaged'):
        _decode(payload, b's', version, ENTRY)


# Two workers, random assignment ------------------------------------------------------------
EPOCHS = 200
KEY_POOL = [b'k%d' % i for i in range(12)]
EVENTS = st.sampled_from(['ok'] * 6 + ['fail', 'retry', 'restart'])


@settings(max_examples=15, deadline=None)
@given(snapshot_every=st.integers(1, 9),
       workers=st.lists(st.integers(0, 1), min_size=EPOCHS, max_size=EPOCHS),
       events=st.lists(EVENTS, min_size=EPOCHS, max_size=EPOCHS),
       seed=st.integers(0, 2**32 - 1))
def test_two_workers_alternating_at_random_match_a_dict_model(
        snapshot_every, workers, events, seed):
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as root:
        store = LocalDirectoryStore(root)
        caches = [VersionedStateCache(store, snapshot_every) for _ in range(2)]
        model: dict[int, dict[bytes, bytes]] = {-1: {}}

        def run_epoch(worker: int, epoch: int, changes, fail: bool = False) -> None:
            cache = caches[worker]
            held = cache.cached_version(ENTRY)
            state, how = cache.load(ENTRY, epoch - 1)
            assert state == model[epoch - 1]
            if epoch == 0:
                assert how == 'initial'
            elif held == epoch - 1:
                assert how == 'hit'
            elif held is not None and held < epoch - 1:
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
            assert cache.cached_version(ENTRY) == epoch

        for epoch in range(EPOCHS):
            dirty = {key: b'%d' % rng.randrange(1000)
                     for key in rng.sample(KEY_POOL, rng.randrange(4))}
            deleted = set(rng.sample(KEY_POOL, rng.randrange(3))) - set(dirty)
            changes = (dirty, deleted)
            worker, event = workers[epoch], events[epoch]
            if event == 'restart':  # the Python worker was replaced by a fresh one
                caches[worker] = VersionedStateCache(store, snapshot_every)
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
        assert len(stored_versions(store, b'd')) <= 2 * snapshot_every + 1
        counts = caches[0].stats
        assert counts['hit'] + counts['catch-up'] + counts['snapshot'] + counts['initial'] > 0
