"""Tests of `PartitionStateCache` (no Spark): live keyed-state backends over versioned
deltas.

A `DictBackend` (a `KeyedStateBackend` holding one byte value per byte key) stands
for a stateful operator's state. "Another Python worker" is played by swapping the
class's per-process caches, so every load path is walked: the live backend (hit), a
restore from the deltas this process holds or missed, a restore from the store
alone; plus retried epochs, failed tasks, a reset to a cut, a zombie attempt's live
backend, the bound on stores cached and the size of what a commit writes.
"""

from __future__ import annotations

import collections
import random
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.errors import StoreNotSharedError
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.state.versioned_state import (
    INITIAL_REVISION,
    MissingStateError,
    Revision,
)
from beam_streams_runner.stores import LocalDirectoryStore
from beam_streams_runner.worker import partition_cache
from beam_streams_runner.worker.partition_cache import PartitionStateCache

NAME = 'stage-3/partition-1'
VALUE = 'value'  # the namespace of a key's one value


class DictBackend(KeyedStateBackend):
    """A keyed-state backend used as a dict of byte keys to byte values; tells whether
    it was restored (else the cache handed back the live one)."""

    def __init__(self) -> None:
        super().__init__(track_changes=True)
        self.restored = False

    def restore(self, state: Mapping[bytes, bytes]) -> None:
        super().restore(state)
        self.restored = True

    @property
    def values(self) -> dict[bytes, bytes]:
        return {key: self.get(key, VALUE) for key in self.keys()}

    def put_value(self, key: bytes, value: bytes) -> None:
        self.put(key, VALUE, value)

    def delete_value(self, key: bytes) -> None:
        self.delete(key, VALUE)


@pytest.fixture(autouse=True)
def state_per_process(monkeypatch):
    """The simulated workers keep their copies of the states in their own memory, as
    workers of different hosts do (the host's shared live states: the tests at the end)."""
    monkeypatch.setenv(partition_cache.LIVE_STATE_ENV, 'process')


@pytest.fixture
def processes(monkeypatch):
    """`processes.switch(i)` makes the cache look like Python worker i's."""
    class Processes:
        def __init__(self) -> None:
            self._caches: dict[int, dict] = {}

        def switch(self, worker: int) -> None:
            monkeypatch.setattr(PartitionStateCache, '_caches',
                                self._caches.setdefault(worker, {}))

        def restart(self, worker: int) -> None:
            self._caches[worker] = {}
            self.switch(worker)

    processes = Processes()
    processes.switch(0)
    return processes


class Run:
    """A run's checkpoint store (a local directory) and its id."""

    def __init__(self, path: Path, run_id: str = 'run-1') -> None:
        self.path = path
        self.store = LocalDirectoryStore(str(path))
        self.id = run_id

    def load(self, base: Revision) -> DictBackend:
        return PartitionStateCache.load(self.store, self.id, NAME, base, DictBackend)

    def commit(self, revision: Revision, parent: Revision, backend: DictBackend,
               keep=()) -> int:
        return PartitionStateCache.commit(self.store, self.id, NAME, revision, parent,
                                          backend, keep)

    def stats(self) -> dict[str, int]:
        return PartitionStateCache.cache(self.store, self.id).stats


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path / 'state')


def run_epoch(run: Run, epoch: int, writes: dict[bytes, bytes | None], fail: bool = False,
              parent: Revision | None = None, attempt: int = 0, keep=()) -> DictBackend:
    """Epoch `epoch` on `parent` (default: epoch-1), committed as (epoch, attempt)."""
    parent = Revision(epoch - 1) if parent is None else parent
    backend = run.load(parent)
    write(backend, writes)
    if fail:
        raise RuntimeError('the task failed before its commit')
    run.commit(Revision(epoch, attempt), parent, backend, keep)
    return backend


def write(backend: DictBackend, writes: dict[bytes, bytes | None]) -> None:
    for key, value in writes.items():
        if value is None:
            backend.delete_value(key)
        else:
            backend.put_value(key, value)


def test_hit_returns_the_live_backend(run, processes):
    first = run_epoch(run, 0, {b'a': b'1'})
    second = run_epoch(run, 1, {b'b': b'2'})
    assert second is first
    assert second.values == {b'a': b'1', b'b': b'2'}
    stats = run.stats()
    assert (stats['initial'], stats['hit'], stats['snapshot']) == (1, 1, 0)


def test_another_worker_restores_from_the_store(run, processes):
    run_epoch(run, 0, {b'a': b'1', b'b': b'2'})
    run_epoch(run, 1, {b'a': None, b'c': b'3'})
    processes.switch(1)  # a new worker: nothing cached
    backend = run_epoch(run, 2, {b'd': b'4'})
    assert backend.restored
    assert backend.values == {b'b': b'2', b'c': b'3', b'd': b'4'}
    processes.switch(0)  # back on the first worker, which missed epoch 2: catches up
    backend = run_epoch(run, 3, {})
    assert backend.values == {b'b': b'2', b'c': b'3', b'd': b'4'}
    assert run.stats()['catch-up'] == 1


def test_a_retried_epoch_loads_the_previous_revision(run, processes):
    run_epoch(run, 0, {b'a': b'1'})
    run_epoch(run, 1, {b'a': b'2', b'b': b'1'})
    # Epoch 1 committed, but Spark runs it again (a lost output, a speculative copy).
    for worker in (0, 1):
        processes.switch(worker)
        backend = run.load(Revision(0))
        assert backend.values == {b'a': b'1'}
    write(backend, {b'a': b'2', b'b': b'1'})
    run.commit(Revision(1, 1), Revision(0), backend)
    processes.restart(0)
    assert run_epoch(run, 2, {}, parent=Revision(1, 1)).values == {b'a': b'2', b'b': b'1'}


def test_a_failed_task_leaves_no_half_changed_backend(run, processes):
    live = run_epoch(run, 0, {b'a': b'1'})
    with pytest.raises(RuntimeError):
        run_epoch(run, 1, {b'a': b'changed', b'z': b'26'}, fail=True)
    retried = run_epoch(run, 1, {b'b': b'2'}, attempt=1)
    assert retried is not live
    assert retried.values == {b'a': b'1', b'b': b'2'}


def test_a_zombie_attempts_live_backend_is_not_handed_out(run, processes):
    """Attempts 0 (a zombie, in worker 0) and 1 (in worker 1) of epoch 1 commit; the next
    epoch in worker 0 loads attempt 1, not the live backend of attempt 0."""
    run_epoch(run, 0, {b'a': b'1'})
    zombie = run_epoch(run, 1, {b'a': b'zombie'}, attempt=0)
    processes.switch(1)
    run_epoch(run, 1, {b'a': b'winner'}, attempt=1)
    processes.switch(0)
    backend = run_epoch(run, 2, {b'b': b'2'}, parent=Revision(1, 1))
    assert backend is not zombie and backend.restored
    assert backend.values == {b'a': b'winner', b'b': b'2'}
    assert run_epoch(run, 3, {}).values == {b'a': b'winner', b'b': b'2'}  # live again: a hit
    assert run.stats()['hit'] == 2


def test_a_reset_to_a_cut_loads_the_cut(run, processes, monkeypatch):
    monkeypatch.setattr(partition_cache, 'SNAPSHOT_EVERY', 2)
    monkeypatch.setattr(partition_cache, 'SNAPSHOT_BYTES_RATIO', 0.0)  # whatever the bytes
    cut = Revision(1)
    run_epoch(run, 0, {b'a': b'0'})
    run_epoch(run, 1, {b'b': b'1'})
    live = run_epoch(run, 2, {b'a': None, b'c': b'2'}, keep=[cut])
    run_epoch(run, 3, {b'd': b'3'}, keep=[cut])  # then epoch 4 fails: reset to the cut
    backend = run_epoch(run, 5, {b'e': b'5'}, parent=cut, keep=[cut])
    assert backend is not live and backend.restored
    assert backend.values == {b'a': b'0', b'b': b'1', b'e': b'5'}
    for epoch in range(6, 10):
        run_epoch(run, epoch, {})  # the cut retired: the aborted epochs 2 and 3 are collected
    processes.switch(1)
    assert run.load(Revision(9)).values == {b'a': b'0', b'b': b'1', b'e': b'5'}
    with pytest.raises(MissingStateError, match='at revision 3'):
        run.load(Revision(3))


def test_retries_across_snapshots(run, processes, monkeypatch):
    monkeypatch.setattr(partition_cache, 'SNAPSHOT_EVERY', 2)
    monkeypatch.setattr(partition_cache, 'SNAPSHOT_BYTES_RATIO', 0.0)  # whatever the bytes
    expected = {}
    for epoch in range(7):
        writes = {f'k{epoch}'.encode(): str(epoch).encode(), f'k{epoch - 2}'.encode(): None}
        run_epoch(run, epoch, writes)
        processes.restart(1)
        previous = run.load(Revision(epoch - 1))
        assert previous.values == expected
        processes.switch(0)
        for key, value in writes.items():
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value


def test_a_missing_state_directory_is_a_clear_error(run, processes):
    run_epoch(run, 0, {b'a': b'1'})
    processes.switch(1)
    shutil.rmtree(run.path)
    with pytest.raises(Exception, match='at revision 0'):
        run.load(Revision(0))


def test_only_the_stores_used_last_are_cached(tmp_path, processes):
    runs = [Run(tmp_path / f'run-{i}', f'run-{i}') for i in range(6)]
    for each in runs:
        run_epoch(each, 0, {b'a': b'1'})
        runs[0].stats()  # run 0 is used again: it stays among those used last
    assert partition_cache.CACHED_STORES == 4
    assert set(PartitionStateCache._caches) == {'run-0', 'run-3', 'run-4', 'run-5'}
    assert run_epoch(runs[1], 1, {}).values == {b'a': b'1'}  # forgotten: restored
    assert runs[1].stats()['snapshot'] == 1


def test_delta_size_follows_the_keys_touched(run, processes):
    """A commit writes the keys changed (and the partition's small meta value), not the
    partition's whole state."""
    value = b'v' * 100
    run_epoch(run, 0, {b'%06d' % i: value for i in range(10_000)})
    sizes = {}
    for epoch in range(1, 4):
        run_epoch(run, epoch, {b'%06d' % (epoch * 7 + i): value for i in range(10)})
        sizes[epoch] = delta_bytes(run, epoch)
    assert delta_bytes(run, 0) > 1_000_000
    per_key = persisted_bytes(b'000000', value)
    for size in sizes.values():
        assert 10 * per_key < size < 10 * per_key + 300, (per_key, sizes)


def persisted_bytes(key: bytes, value: bytes) -> int:
    """Bytes of the name and value one key holding `value` is persisted as."""
    backend = DictBackend()
    backend.put_value(key, value)
    return sum(len(name) + len(encoded) for name, encoded in backend.snapshot().items()
               if name != b'm')


def delta_bytes(run: Run, version: int) -> int:
    """Bytes of the delta of `version` in the store (its chunks, not their headers)."""
    key = b'd' + version.to_bytes(8, 'big') + bytes(2)  # attempt 0
    return len(run.store.get_chunked(NAME, key))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), snapshot_every=st.integers(1, 5),
       ratio=st.sampled_from([0.0, 0.5, 2.0]), max_chain=st.integers(1, 12))
def test_random_workers_failures_retries_and_resets_against_a_model(
        seed, snapshot_every, ratio, max_chain, tmp_path_factory):
    """Three workers take the epochs of one partition at random; tasks fail before or
    after their commit and are retried as a new attempt (with the same input), workers
    restart, the driver resets to the last cut now and then; every load equals the
    model."""
    rng = random.Random(seed)
    run = Run(tmp_path_factory.mktemp('state'))
    writes_by_epoch = [
        {bytes([rng.randrange(6)]): bytes([rng.randrange(256)]) if rng.random() < 0.7 else None
         for _ in range(rng.randrange(4))}
        for _ in range(16)]
    saved = (partition_cache.SNAPSHOT_EVERY, partition_cache.SNAPSHOT_BYTES_RATIO,
             partition_cache.MAX_CHAIN, PartitionStateCache._caches)
    partition_cache.SNAPSHOT_EVERY = snapshot_every
    partition_cache.SNAPSHOT_BYTES_RATIO = ratio
    partition_cache.MAX_CHAIN = max_chain
    workers: dict[int, dict] = {0: {}, 1: {}, 2: {}}
    model = {INITIAL_REVISION: {}}  # the state committed at each revision
    base = cut = INITIAL_REVISION
    try:
        epoch, attempt = 0, 0
        while epoch < len(writes_by_epoch):
            worker = rng.randrange(3)
            if rng.random() < 0.1:
                workers[worker] = {}  # the worker restarted
            PartitionStateCache._caches = workers[worker]
            backend = run.load(base)
            assert backend.values == model[base]
            write(backend, writes_by_epoch[epoch])
            after = dict(model[base])
            for key, value in writes_by_epoch[epoch].items():
                if value is None:
                    after.pop(key, None)
                else:
                    after[key] = value
            outcome = rng.random()
            if outcome < 0.15:
                attempt += 1
                continue  # failed before its commit: run again
            revision = Revision(epoch, attempt)
            run.commit(revision, base, backend, keep=[cut])
            model[revision] = after
            attempt += 1
            if outcome < 0.3:
                continue  # failed after its commit (its report lost): run again
            epoch, attempt, base = epoch + 1, 0, revision
            if outcome < 0.4:
                cut = base  # a checkpoint
            elif outcome > 0.93:
                base = cut  # a failure: reset to the last cut
    finally:
        (partition_cache.SNAPSHOT_EVERY, partition_cache.SNAPSHOT_BYTES_RATIO,
         partition_cache.MAX_CHAIN, PartitionStateCache._caches) = saved


def test_state_moves_make_every_load_come_from_the_store(run, processes, monkeypatch):
    """With the cluster tests' knob set, a worker keeps nothing it committed: its next
    task of the partition loads the state from the store, as one on another host."""
    monkeypatch.setenv(partition_cache.STATE_MOVES_ENV, '1')
    kinds = collections.Counter()
    backend = None
    for epoch in range(4):
        parent = Revision(epoch - 1) if epoch else INITIAL_REVISION
        loaded = PartitionStateCache.load(run.store, run.id, NAME, parent, DictBackend, kinds)
        assert loaded is not backend
        write(loaded, {f'k{epoch}'.encode(): b'v'})
        run.commit(Revision(epoch), parent, loaded)
        backend = loaded
    assert backend.values == {b'k0': b'v', b'k1': b'v', b'k2': b'v', b'k3': b'v'}
    assert kinds == {'initial': 1, 'snapshot': 3}


def test_a_task_that_does_not_see_the_drivers_store_fails_clearly(tmp_path, monkeypatch):
    """The driver marks the run's store; a worker whose store is another directory (a
    directory local to another host) refuses to run on it."""
    monkeypatch.setattr(partition_cache, '_MARKS_SEEN', set())
    driver_side = LocalDirectoryStore(str(tmp_path / 'driver-host'))
    partition_cache.mark_run(driver_side, 'runs/r1/', 'r1')
    partition_cache.check_run_mark(driver_side, 'runs/r1/', 'r1')  # the same store: fine
    monkeypatch.setenv('SPARK_LOCAL_IP', '127.0.0.3')
    other_host = LocalDirectoryStore(str(tmp_path / 'other-host'))
    with pytest.raises(StoreNotSharedError, match=r'on host 127\.0\.0\.3.*redis://'):
        partition_cache.check_run_mark(other_host, 'runs/r2/', 'r2')
    partition_cache.mark_run(other_host, 'runs/r2/', 'r1')  # another run's mark
    with pytest.raises(StoreNotSharedError):
        partition_cache.check_run_mark(other_host, 'runs/r2/', 'r2')


# The host's live states ------------------------------------------------------------------
@pytest.fixture
def on_one_host(monkeypatch, tmp_path):
    """Workers keep their copies in the host's live states, under `tmp_path`/host."""
    monkeypatch.delenv(partition_cache.LIVE_STATE_ENV)
    monkeypatch.setattr(partition_cache, 'host_state_root', lambda: str(tmp_path / 'host'))
    return tmp_path / 'host'


def test_another_worker_of_the_host_reads_the_hosts_copy(run, processes, on_one_host):
    """The worker that never held the partition loads it from the host's copy ('hit'),
    without reading the store; the first worker, back, takes the second's revision the
    same way; a worker of another host (in-memory copies) catches up from the store."""
    kinds = collections.Counter()

    def epoch(number: int, writes: dict) -> DictBackend:
        parent = Revision(number - 1) if number else INITIAL_REVISION
        backend = PartitionStateCache.load(run.store, run.id, NAME, parent, DictBackend, kinds)
        write(backend, writes)
        run.commit(Revision(number), parent, backend)
        return backend

    first = epoch(0, {b'a': b'1', b'b': b'2'})
    assert epoch(1, {b'c': b'3'}) is first
    processes.switch(1)
    second = epoch(2, {b'a': None})
    assert second.restored and second.values == {b'b': b'2', b'c': b'3'}
    processes.switch(0)
    assert epoch(3, {b'd': b'4'}).values == {b'b': b'2', b'c': b'3', b'd': b'4'}
    assert kinds == {'initial': 1, 'live': 1, 'hit': 2}
    assert all(cache.stats['bytes_read'] == 0 for cache in PartitionStateCache._caches.values())
    assert any(on_one_host.iterdir())


def test_a_forgotten_runs_host_copies_are_deleted(tmp_path, processes, on_one_host):
    runs = [Run(tmp_path / f'state-{i}', f'run-{i}') for i in range(5)]
    for each in runs:
        run_epoch(each, 0, {b'a': b'1'})
    assert sorted(p.name for p in on_one_host.iterdir()) == ['run-1', 'run-2', 'run-3',
                                                             'run-4']
