"""Tests of the host's live states (`state.host_state`): LMDB copies of partition states
that every Python worker of a host shares, and a keyed-state backend restored from one
(values read when a key is first used).

Real LMDB environments in temporary directories; "another worker" is another
`VersionedStateCache` over the same environment, or a real second process.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_versioned_state import ENTRY, LineageMachine

from beam_streams_runner.state.backend import KeyedStateBackend, head_length
from beam_streams_runner.state.host_state import (
    HostCopies,
    HostStateChanged,
    HostStateStore,
    entry_id,
)
from beam_streams_runner.state.versioned_state import (
    CachedState,
    Revision,
    VersionedStateCache,
)
from beam_streams_runner.stores import LocalDirectoryStore

LONG_KEY = b'L' * 700  # longer than LMDB's 511-byte keys


@pytest.fixture
def host(tmp_path):
    host = HostStateStore.at(str(tmp_path / 'host'))
    yield host
    host.close(remove=True)


def cached(revision: int, state: dict[bytes, bytes], parent: int | None = None) -> CachedState:
    return CachedState(Revision(revision), state, [], None if parent is None else
                       Revision(parent), 0)


# Values split after their first 2 bytes when longer than 3, or kept whole.
SPLITS = {'whole': {}, 'split': {'head_of': lambda key, value: 2, 'split_above': 3}}


@pytest.mark.parametrize('split', sorted(SPLITS))
def test_a_copy_round_trips_and_counts_its_bytes(host, split):
    copies = HostCopies(host, **SPLITS[split])
    state = {b'a': b'1', b'bb': b'22', LONG_KEY: b'long', b'': b'empty key'}
    copies.put(ENTRY, cached(3, dict(state)))
    copy = copies.get(ENTRY)
    assert copy.revision == (3, 0)
    assert dict(copy.state) == state and len(copy.state) == 4
    assert copy.state.nbytes == sum(len(k) + len(v) for k, v in state.items())
    assert copy.state[LONG_KEY] == b'long' and copy.state.fetch(b'nope') is None

    changes = [({b'a': b'111', b'c': b'3', LONG_KEY: b'longer'}, [b'bb']), ({}, [b'c'])]
    assert copies.advance(ENTRY, Revision(3), cached(4, {}, parent=3), changes)
    expected = {b'a': b'111', LONG_KEY: b'longer', b'': b'empty key'}
    copy = copies.get(ENTRY)
    assert (copy.revision, copy.parent) == ((4, 0), (3, 0))
    assert dict(copy.state) == expected and len(copy.state) == 3
    assert copy.state.nbytes == sum(len(k) + len(v) for k, v in expected.items())
    heads = {key: (bytes(head), more) for key, head, more in copy.state.scan()}
    assert heads[b'a'] == (b'111', 0)  # not longer than 3
    if split == 'split':
        assert heads[b''] == (b'em', 7) and heads[LONG_KEY] == (b'lo', 4)
    else:
        assert heads[b''] == (b'empty key', 0)
    copies.drop(ENTRY)
    with host.env().begin() as txn:
        assert txn.stat(host.tails)['entries'] == 0


def test_a_copy_advances_only_from_the_revision_it_holds(host):
    copies = HostCopies(host)
    assert not copies.advance(ENTRY, Revision(0), cached(1, {}), [({b'a': b'1'}, [])])
    copies.put(ENTRY, cached(1, {b'a': b'1'}))
    assert not copies.advance(ENTRY, Revision(0), cached(2, {}), [({b'a': b'2'}, [])])
    assert dict(copies.get(ENTRY).state) == {b'a': b'1'}
    copies.drop(ENTRY)
    assert copies.get(ENTRY) is None


def test_a_view_refuses_reads_once_its_copy_moved(host):
    """A task reading a copy that another attempt moved fails (Spark runs it again)."""
    copies = HostCopies(host)
    copies.put(ENTRY, cached(1, {b'a': b'1'}))
    view = copies.get(ENTRY).state
    assert view.fetch(b'a') == b'1'
    assert copies.advance(ENTRY, Revision(1), cached(2, {}), [({b'a': b'2'}, [])])
    with pytest.raises(HostStateChanged, match='moved from revision'):
        view.fetch(b'a')
    view.moved_to(Revision(2))  # its reader's own commit moved it
    assert view.fetch(b'a') == b'2'


def test_a_damaged_or_foreign_record_is_a_miss(host):
    copies = HostCopies(host)
    copies.put(ENTRY, cached(1, {b'a': b'1'}))
    with host.env().begin(write=True) as txn:
        txn.put(entry_id(ENTRY), b'\x00garbage')
    assert copies.get(ENTRY) is None


def test_another_process_of_the_host_reads_and_advances_the_copy(host):
    copies = HostCopies(host)
    copies.put(ENTRY, cached(1, {b'a': b'1', LONG_KEY: b'x'}))
    child = f'''
import pickle, sys
from beam_streams_runner.state.host_state import HostCopies, HostStateStore
from beam_streams_runner.state.versioned_state import CachedState, Revision
copies = HostCopies(HostStateStore.at({host.path!r}))
copy = copies.get({ENTRY!r})
seen = (tuple(copy.revision), dict(copy.state))
after = CachedState(Revision(2), {{}}, [], copy.revision, 0)
moved = copies.advance({ENTRY!r}, copy.revision, after, [({{b'b': b'2'}}, [b'a'])])
sys.stdout.buffer.write(pickle.dumps((seen, moved)))
'''
    out = subprocess.run([sys.executable, '-c', child], capture_output=True, check=True,
                         timeout=60).stdout
    seen, moved = pickle.loads(out)
    assert seen == ((1, 0), {b'a': b'1', LONG_KEY: b'x'}) and moved
    copy = copies.get(ENTRY)
    assert copy.revision == (2, 0) and dict(copy.state) == {b'b': b'2', LONG_KEY: b'x'}


def test_a_forked_child_leaves_the_copies_alone(host):
    """LMDB allows a forked child neither its parent's environment nor a new one: the
    child (a fault test's zombie task) sees no copies and changes none."""
    copies = HostCopies(host)
    copies.put(ENTRY, cached(1, {b'a': b'1'}))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            outcome = (copies.get(ENTRY) is None,
                       not copies.advance(ENTRY, Revision(1), cached(2, {}), [({}, [b'a'])]))
            copies.drop(ENTRY)
            os.write(write, pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, 'rb') as f:
        assert pickle.loads(f.read()) == (True, True)
    assert dict(copies.get(ENTRY).state) == {b'a': b'1'}


# A keyed-state backend over a copy ---------------------------------------------------
def sample_backend() -> KeyedStateBackend:
    backend = KeyedStateBackend(track_changes=True)
    for i in range(50):
        key = b'key-%d' % i
        backend.put(key, 'count', i)
        backend.put(key, ('bag', b'w'), [i, i + 1])
        backend.add_window(key, 1000 * (i % 7))
        if i % 3 == 0:
            backend.timers('event').set((key, 'end'), 1000 * (i % 7), b'payload', None)
    backend.put(LONG_KEY, 'count', 1)
    backend.watermark = 5
    return backend


def test_a_backend_restored_from_a_copy_reads_values_of_the_keys_it_uses(host):
    original = sample_backend()
    snapshot = original.snapshot()
    copies = HostCopies(host, head_length, split_above=0)  # every key's values apart
    copies.put(ENTRY, cached(1, dict(snapshot)))
    view = copies.get(ENTRY).state
    for name, head, more in view.scan():
        assert len(head) == head_length(name, snapshot[name])
        assert more == len(snapshot[name]) - len(head)
    fetched = []
    fetch = view.fetch
    view.fetch = lambda name: fetched.append(name) or fetch(name)

    backend = KeyedStateBackend(track_changes=True)
    backend.restore(view)
    assert fetched == []  # the headers of the scan index every key and timer
    assert backend.watermark == 5 and backend.timer_count() == original.timer_count()
    assert backend.live_keys() == original.live_keys()
    assert backend.get(b'key-7', 'count') == 7
    backend.put(b'key-8', 'count', 80)
    backend.timers('event').set((b'key-9', 'end'), 1, b'p', None)  # its header only
    assert fetched == [b'kkey-7', b'kkey-8']
    dirty, deleted = backend.take_delta()
    assert fetched == [b'kkey-7', b'kkey-8', b'kkey-9']  # key-9's values, to write it whole
    assert not deleted and set(dirty) == {b'm', b'kkey-8', b'kkey-9'}
    assert backend.snapshot() == {**snapshot, **dirty}


OPS = st.lists(st.tuples(st.sampled_from(['put', 'delete', 'delete_key', 'timer', 'get']),
                         st.integers(0, 60), st.integers(0, 9)), max_size=40)


@given(ops=OPS, split_above=st.sampled_from([0, 40, 4096]))
@settings(max_examples=40, deadline=None)
def test_a_backend_over_a_copy_behaves_as_one_over_the_whole_state(ops, split_above):
    """The same operations on a backend restored from a dict and on one restored from
    the host's copy of it give the same reads, deltas and snapshots."""
    original = sample_backend()
    snapshot = original.snapshot()
    root = tempfile.mkdtemp()
    try:
        host = HostStateStore.at(root)
        copies = HostCopies(host, head_length, split_above)
        copies.put(ENTRY, cached(1, dict(snapshot)))
        whole, paged = KeyedStateBackend(track_changes=True), KeyedStateBackend(
            track_changes=True)
        whole.restore(dict(snapshot))
        paged.restore(copies.get(ENTRY).state)
        for op, i, value in ops:
            key = b'key-%d' % i
            results = []
            for backend in (whole, paged):
                if op == 'put':
                    backend.put(key, 'count', value)
                elif op == 'delete':
                    backend.delete(key, ('bag', b'w'))
                elif op == 'delete_key':
                    backend.delete_key(key)
                elif op == 'timer':
                    backend.timers('event').set((key, 'end'), value, b'p', None)
                results.append((backend.get(key, 'count'), backend.namespaces(key)))
            assert results[0] == results[1]
        assert whole.take_delta() == paged.take_delta()
        assert whole.snapshot() == paged.snapshot()
    finally:
        HostStateStore.at(root).close(remove=True)
        shutil.rmtree(root, ignore_errors=True)


# Two hosts of workers over one checkpoint store: the lineage machine ------------------
class HostsLineageMachine(LineageMachine):
    """`LineageMachine` with workers on two hosts: worker w keeps its copies in host
    w % 2's live states (workers 0 and 2 share one), and a restarted worker finds its
    host's copies still there. Host 1 splits its values."""

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp()
        self.hosts = [HostStateStore.at(os.path.join(self.root, f'host-{h}')) for h in (0, 1)]

    def new_cache(self, worker: int) -> VersionedStateCache:
        return VersionedStateCache(self.store, self.snapshot_every,
                                   copies=HostCopies(self.hosts[worker % 2], **SPLITS[
                                       'split' if worker % 2 else 'whole']))

    def teardown(self) -> None:
        for host in self.hosts:
            host.close(remove=True)
        shutil.rmtree(self.root, ignore_errors=True)


TestHostsLineageMachine = HostsLineageMachine.TestCase
TestHostsLineageMachine.settings = settings(max_examples=40, stateful_step_count=40,
                                            deadline=None)


def test_workers_of_a_host_share_the_catch_up(tmp_path):
    """A worker that never held the state loads it from its host's copy once another
    worker of the host has it: no read of the checkpoint store."""
    store = LocalDirectoryStore(str(tmp_path / 'store'))
    host = HostStateStore.at(str(tmp_path / 'host'))
    first, second = (VersionedStateCache(store, 5, copies=HostCopies(host)) for _ in range(2))
    first.load(ENTRY, -1)
    first.commit(ENTRY, 0, {b'a': b'1'}, ())
    state, kind = second.load(ENTRY, 0)
    assert kind == 'hit' and dict(state) == {b'a': b'1'}
    assert second.stats['bytes_read'] == 0
    second.commit(ENTRY, 1, {b'b': b'2'}, ())
    assert first.load(ENTRY, 1)[1] == 'hit'
    host.close(remove=True)


def test_the_map_grows_when_full_and_other_workers_follow(tmp_path):
    """A copy larger than the environment's map doubles the map until it fits; a worker
    whose map another worker grew adopts the new size at its next transaction."""
    small = HostStateStore(str(tmp_path / 'host'), map_size=1 << 16)
    copies = HostCopies(small)
    copies.put(ENTRY, cached(1, {b'big': b'x' * (1 << 20)}))
    assert small.env().info()['map_size'] >= 1 << 20
    child = f'''
from beam_streams_runner.state.host_state import HostCopies, HostStateStore
from beam_streams_runner.state.versioned_state import CachedState, Revision
copies = HostCopies(HostStateStore({small.path!r}, map_size=1 << 16))
held = copies.get({ENTRY!r}).revision
after = CachedState(Revision(2), {{}}, [], held, 0)
assert copies.advance({ENTRY!r}, held, after, [({{b'bigger': b'y' * (8 << 20)}}, [])])
'''
    subprocess.run([sys.executable, '-c', child], check=True, timeout=60)
    copy = copies.get(ENTRY)
    assert copy.revision == (2, 0) and len(copy.state[b'bigger']) == 8 << 20
    small.close(remove=True)
