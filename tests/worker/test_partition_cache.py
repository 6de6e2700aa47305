"""Tests of `PartitionStateCache` (no Spark): live keyed-state backends over versioned
deltas.

A `DictBackend` (a `KeyedStateBackend` holding one byte value per byte key) stands
for a stateful operator's state. "Another Python worker" is played by swapping the
class's per-process caches, so every load path is walked: the live backend (hit), a
restore from the deltas this process holds or missed, a restore from the store
alone; plus retried epochs, failed tasks and the size of what a commit writes.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.state.backend import KeyedStateBackend
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


def run_epoch(state_dir: str, epoch: int, writes: dict[bytes, bytes | None],
              fail: bool = False) -> DictBackend:
    backend = PartitionStateCache.load(state_dir, NAME, epoch - 1, DictBackend)
    for key, value in writes.items():
        if value is None:
            backend.delete_value(key)
        else:
            backend.put_value(key, value)
    if fail:
        raise RuntimeError('the task failed before its commit')
    PartitionStateCache.commit(state_dir, NAME, epoch, backend)
    return backend


def test_hit_returns_the_live_backend(tmp_path, processes):
    state_dir = str(tmp_path)
    first = run_epoch(state_dir, 0, {b'a': b'1'})
    second = run_epoch(state_dir, 1, {b'b': b'2'})
    assert second is first
    assert second.values == {b'a': b'1', b'b': b'2'}
    stats = PartitionStateCache.cache(state_dir).stats
    assert (stats['initial'], stats['hit'], stats['snapshot']) == (1, 1, 0)


def test_another_worker_restores_from_the_store(tmp_path, processes):
    state_dir = str(tmp_path)
    run_epoch(state_dir, 0, {b'a': b'1', b'b': b'2'})
    run_epoch(state_dir, 1, {b'a': None, b'c': b'3'})
    processes.switch(1)  # a new worker: nothing cached
    backend = run_epoch(state_dir, 2, {b'd': b'4'})
    assert backend.restored
    assert backend.values == {b'b': b'2', b'c': b'3', b'd': b'4'}
    processes.switch(0)  # back on the first worker, which missed epoch 2: catches up
    backend = run_epoch(state_dir, 3, {})
    assert backend.values == {b'b': b'2', b'c': b'3', b'd': b'4'}
    assert PartitionStateCache.cache(state_dir).stats['catch-up'] == 1


def test_a_retried_epoch_loads_the_previous_version(tmp_path, processes):
    state_dir = str(tmp_path)
    run_epoch(state_dir, 0, {b'a': b'1'})
    run_epoch(state_dir, 1, {b'a': b'2', b'b': b'1'})
    # Epoch 1 committed, but Spark runs it again (a lost output, a speculative copy).
    for worker in (0, 1):
        processes.switch(worker)
        backend = PartitionStateCache.load(state_dir, NAME, 0, DictBackend)
        assert backend.values == {b'a': b'1'}
    backend.put_value(b'a', b'2')
    backend.put_value(b'b', b'1')
    PartitionStateCache.commit(state_dir, NAME, 1, backend)
    processes.restart(0)
    assert run_epoch(state_dir, 2, {}).values == {b'a': b'2', b'b': b'1'}


def test_a_failed_task_leaves_no_half_changed_backend(tmp_path, processes):
    state_dir = str(tmp_path)
    live = run_epoch(state_dir, 0, {b'a': b'1'})
    with pytest.raises(RuntimeError):
        run_epoch(state_dir, 1, {b'a': b'changed', b'z': b'26'}, fail=True)
    retried = run_epoch(state_dir, 1, {b'b': b'2'})
    assert retried is not live
    assert retried.values == {b'a': b'1', b'b': b'2'}


def test_retries_across_snapshots(tmp_path, processes, monkeypatch):
    monkeypatch.setattr(partition_cache, 'SNAPSHOT_EVERY', 2)
    state_dir = str(tmp_path)
    expected = {}
    for epoch in range(7):
        writes = {f'k{epoch}'.encode(): str(epoch).encode(), f'k{epoch - 2}'.encode(): None}
        run_epoch(state_dir, epoch, writes)
        processes.restart(1)
        previous = PartitionStateCache.load(state_dir, NAME, epoch - 1, DictBackend)
        assert previous.values == expected
        processes.switch(0)
        for key, value in writes.items():
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value


def test_a_missing_state_directory_is_a_clear_error(tmp_path, processes):
    state_dir = str(tmp_path / 'state')
    run_epoch(state_dir, 0, {b'a': b'1'})
    processes.switch(1)
    shutil.rmtree(state_dir)
    with pytest.raises(Exception, match='at version 0'):
        PartitionStateCache.load(state_dir, NAME, 0, DictBackend)


def test_caches_of_removed_state_directories_are_dropped(tmp_path, processes):
    old, new = str(tmp_path / 'run-1'), str(tmp_path / 'run-2')
    run_epoch(old, 0, {b'a': b'1'})
    shutil.rmtree(old)
    run_epoch(new, 0, {b'a': b'1'})
    assert set(PartitionStateCache._caches) == {new}


def test_delta_size_follows_the_keys_touched(tmp_path, processes):
    """A commit writes the keys changed (and the partition's small meta value), not the
    partition's whole state."""
    state_dir = str(tmp_path)
    value = b'v' * 100
    run_epoch(state_dir, 0, {b'%06d' % i: value for i in range(10_000)})
    sizes = {}
    for epoch in range(1, 4):
        run_epoch(state_dir, epoch, {b'%06d' % (epoch * 7 + i): value for i in range(10)})
        sizes[epoch] = delta_bytes(state_dir, epoch)
    assert delta_bytes(state_dir, 0) > 1_000_000
    per_key = persisted_bytes(b'000000', value)
    for size in sizes.values():
        assert 10 * per_key < size < 10 * per_key + 300, (per_key, sizes)


def persisted_bytes(key: bytes, value: bytes) -> int:
    """Bytes of the name and value one key holding `value` is persisted as."""
    backend = DictBackend()
    backend.put_value(key, value)
    return sum(len(name) + len(encoded) for name, encoded in backend.snapshot().items()
               if name != b'm')


def delta_bytes(state_dir: str, version: int) -> int:
    """Bytes of the delta of `version` in the store (its chunks, not their headers)."""
    store = PartitionStateCache.cache(state_dir).store
    return len(store.get_chunked(NAME, b'd' + version.to_bytes(8, 'big')))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), snapshot_every=st.integers(1, 5))
def test_random_workers_failures_and_retries_against_a_model(seed, snapshot_every,
                                                            tmp_path_factory):
    """Three workers take the epochs of one partition at random; tasks fail before or
    after their commit and are retried (with the same input), workers restart; every
    load equals the model."""
    rng = random.Random(seed)
    state_dir = str(tmp_path_factory.mktemp('state'))
    writes_by_epoch = [
        {bytes([rng.randrange(6)]): bytes([rng.randrange(256)]) if rng.random() < 0.7 else None
         for _ in range(rng.randrange(4))}
        for _ in range(12)]
    saved = partition_cache.SNAPSHOT_EVERY, PartitionStateCache._caches
    partition_cache.SNAPSHOT_EVERY = snapshot_every
    workers: dict[int, dict] = {0: {}, 1: {}, 2: {}}
    model: list[dict[bytes, bytes]] = []  # the state committed at each version
    try:
        epoch = 0
        while epoch < len(writes_by_epoch):
            worker = rng.randrange(3)
            if rng.random() < 0.1:
                workers[worker] = {}  # the worker restarted
            PartitionStateCache._caches = workers[worker]
            after = dict(model[epoch - 1]) if epoch else {}
            backend = PartitionStateCache.load(state_dir, NAME, epoch - 1, DictBackend)
            assert backend.values == after
            for key, value in writes_by_epoch[epoch].items():
                if value is None:
                    backend.delete_value(key)
                    after.pop(key, None)
                else:
                    backend.put_value(key, value)
                    after[key] = value
            outcome = rng.random()
            if outcome < 0.15:
                continue  # failed before its commit: run again
            PartitionStateCache.commit(state_dir, NAME, epoch, backend)
            if len(model) == epoch:
                model.append(after)
            assert model[epoch] == after
            if outcome < 0.3:
                continue  # failed after its commit: run again
            epoch += 1
    finally:
        partition_cache.SNAPSHOT_EVERY, PartitionStateCache._caches = saved
