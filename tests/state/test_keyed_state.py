"""Unit tests of `KeyedStateIndex` and `KeyedStateStore` (no Spark).

Both are checked against brute-force models: plain dicts of window sets and of
cell contents, filtered and sorted the slow way.
"""

from __future__ import annotations

import pickle
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from beam_streams_runner.state.keyed_state import KeyedStateIndex, KeyedStateStore

KEY_POOL = [b'', b'a', b'b', b'ab', b'\x00', b'\xff', b'\xff\xff']
KEYS = st.sampled_from(KEY_POOL) | st.binary(max_size=3)
TIMESTAMPS = st.integers(min_value=-10, max_value=10)
CELLS = st.sampled_from([
    ('t1', 's1', b'w1'), ('t1', 's1', b'w2'), ('t1', 's2', b'w1'), ('t2', 's1', b'w1'),
])
DATA = st.binary(max_size=3)
SORT_KEYS = st.integers(min_value=-8, max_value=8)


def brute_force_candidates(windows, up_to):
    return {key for key, ws in windows.items() if ws and min(ws) <= up_to}


# KeyedStateIndex ---------------------------------------------------------------

index_ops = st.lists(
    st.one_of(
        st.tuples(st.just('add'), KEYS, TIMESTAMPS),
        st.tuples(st.just('remove'), KEYS, st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(ops=index_ops, queries=st.lists(st.integers(-12, 12), min_size=1, max_size=6))
def test_index_candidates_equal_brute_force_filter(ops, queries):
    index = KeyedStateIndex()
    windows = {}
    for op, key, ts in ops:
        if op == 'add':
            index.add_window(key, ts)
            windows.setdefault(key, set()).add(ts)
        else:
            index.remove_key(key)
            windows.pop(key, None)
    assert len(index) == len(windows)
    for key in set(KEY_POOL) | set(windows):
        expected_latest = max(windows[key]) if key in windows else None
        assert index.latest_window(key) == expected_latest
    for up_to in queries:
        candidates = index.candidates(up_to)
        assert len(candidates) == len(set(candidates)), 'no key listed twice'
        assert set(candidates) == brute_force_candidates(windows, up_to)
        # A range scan over the order of earliest windows.
        earliest = [min(windows[key]) for key in candidates]
        assert earliest == sorted(earliest)


def test_index_orders_keys_by_earliest_window():
    index = KeyedStateIndex()
    index.add_window(b'k1', 50)
    index.add_window(b'k2', 30)
    index.add_window(b'k1', 10)  # k1's earliest window moves down
    index.add_window(b'k2', 30)  # a window already known
    index.add_window(b'k3', 70)
    assert index.candidates(9) == []
    assert index.candidates(10) == [b'k1']
    assert index.candidates(30) == [b'k1', b'k2']
    assert index.candidates(100) == [b'k1', b'k2', b'k3']
    assert index.latest_window(b'k1') == 50
    index.remove_key(b'k1')
    index.remove_key(b'never added')
    assert index.candidates(100) == [b'k2', b'k3']
    assert index.latest_window(b'k1') is None
    assert len(index) == 2


def test_index_candidates_include_long_keys_at_the_boundary():
    """Encoded user keys are arbitrary bytes: the bound must not depend on key length.

    `candidates` bounds its range scan with `(up_to, b'\\xff' * 64)`, so a key that
    sorts after 64 0xff bytes is missed when its earliest window is exactly `up_to`.
    """
    index = KeyedStateIndex()
    long_key = b'\xff' * 65
    index.add_window(long_key, 5)
    index.add_window(b'short', 5)
    assert sorted(index.candidates(5)) == sorted([b'short', long_key])


# KeyedStateStore: cells --------------------------------------------------------

class StoreModel:
    def __init__(self):
        self.bags = {}  # (key, cell) -> list of chunks; present iff appended since clear
        self.ordered = {}  # (key, cell) -> list of (sort key, data), in insertion order
        self.windows = {}  # key -> set of window max timestamps

    def keys(self):
        return ({key for key, _ in self.bags}
                | {key for (key, _), entries in self.ordered.items() if entries})

    def ordered_range(self, key, cell, start, end):
        entries = sorted(self.ordered.get((key, cell), []), key=lambda e: e[0])  # stable
        return [data for sort_key, data in entries if start <= sort_key < end]

    def ordered_clear(self, key, cell, start, end):
        entries = self.ordered.get((key, cell), [])
        self.ordered[(key, cell)] = [e for e in entries if not start <= e[0] < end]

    def expire(self, watermark, allowed_lateness, pinned):
        deleted = {
            key for key, ws in self.windows.items()
            if max(ws) + allowed_lateness < watermark and key not in pinned
        }
        for key in deleted:
            del self.windows[key]
            self.bags = {k: v for k, v in self.bags.items() if k[0] != key}
            self.ordered = {k: v for k, v in self.ordered.items() if k[0] != key}
        return deleted


class KeyedStateStoreMachine(RuleBasedStateMachine):
    """Random bag, ordered-list, window and expiry operations against `StoreModel`."""

    def __init__(self):
        super().__init__()
        self.store = KeyedStateStore()
        self.model = StoreModel()

    @rule(key=KEYS, cell=CELLS, data=DATA)
    def append(self, key, cell, data):
        self.store.append(key, cell, data)
        self.model.bags.setdefault((key, cell), []).append(data)

    @rule(key=KEYS, cell=CELLS)
    def clear(self, key, cell):
        self.store.clear(key, cell)
        self.model.bags.pop((key, cell), None)

    @rule(key=KEYS, cell=CELLS)
    def get(self, key, cell):
        assert self.store.get(key, cell) == self.model.bags.get((key, cell), [])

    @rule(key=KEYS, cell=CELLS, sort_key=SORT_KEYS, data=DATA)
    def ordered_add(self, key, cell, sort_key, data):
        self.store.ordered_add(key, cell, sort_key, data)
        self.model.ordered.setdefault((key, cell), []).append((sort_key, data))

    @rule(key=KEYS, cell=CELLS, start=SORT_KEYS, end=SORT_KEYS)
    def ordered_range(self, key, cell, start, end):
        assert (self.store.ordered_range(key, cell, start, end)
                == self.model.ordered_range(key, cell, start, end))

    @rule(key=KEYS, cell=CELLS, start=SORT_KEYS, end=SORT_KEYS)
    def ordered_clear(self, key, cell, start, end):
        self.store.ordered_clear(key, cell, start, end)
        self.model.ordered_clear(key, cell, start, end)

    @rule(key=KEYS, ts=TIMESTAMPS)
    def add_window(self, key, ts):
        self.store.index.add_window(key, ts)
        self.model.windows.setdefault(key, set()).add(ts)

    @rule(
        watermark=st.integers(-15, 25),
        allowed_lateness=st.integers(0, 5),
        pinned=st.sets(KEYS, max_size=3),
    )
    def expire(self, watermark, allowed_lateness, pinned):
        keys_before = self.store.keys()
        deleted = self.store.expire(watermark, allowed_lateness, lambda key: key in pinned)
        assert len(deleted) == len(set(deleted))
        assert set(deleted) == self.model.expire(watermark, allowed_lateness, pinned)
        assert self.store.keys() == keys_before - set(deleted)

    @invariant()
    def agrees_with_model(self):
        assert self.store.keys() == self.model.keys()
        assert len(self.store) == len(self.model.keys())
        assert self.store.live_keys() == len(self.model.keys() | set(self.model.windows))
        assert len(self.store.index) == len(self.model.windows)
        for key in self.store.keys() | set(self.model.windows):
            ws = self.model.windows.get(key)
            assert self.store.index.latest_window(key) == (max(ws) if ws else None)
        assert (set(self.store.index.candidates(100))
                == brute_force_candidates(self.model.windows, 100))
        for (key, cell), chunks in self.model.bags.items():
            assert self.store.get(key, cell) == chunks


KeyedStateStoreMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None)
TestKeyedStateStoreStateful = KeyedStateStoreMachine.TestCase


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(st.tuples(SORT_KEYS, DATA), max_size=25),
    start=SORT_KEYS,
    end=SORT_KEYS,
)
def test_ordered_range_is_half_open_and_sorted(entries, start, end):
    store = KeyedStateStore()
    cell = ('t', 's', b'w')
    for sort_key, data in entries:
        store.ordered_add(b'k', cell, sort_key, data)
    expected = [d for s, d in sorted(entries, key=lambda e: e[0]) if start <= s < end]
    assert store.ordered_range(b'k', cell, start, end) == expected
    store.ordered_clear(b'k', cell, start, end)
    remaining = [d for s, d in sorted(entries, key=lambda e: e[0]) if not start <= s < end]
    assert store.ordered_range(b'k', cell, -100, 100) == remaining
    keys = store.keys()
    assert (b'k' in keys) == bool(remaining)


# KeyedStateStore: expiry ---------------------------------------------------------

key_windows = st.dictionaries(
    st.binary(max_size=2), st.sets(TIMESTAMPS, min_size=1, max_size=4), max_size=10)


@settings(max_examples=100, deadline=None)
@given(
    windows=key_windows,
    stateless_keys=st.sets(st.binary(min_size=3, max_size=3), max_size=3),
    pinned=st.sets(st.binary(max_size=2), max_size=4),
    watermark=st.integers(-15, 25),
    allowed_lateness=st.integers(0, 8),
)
def test_expire_deletes_exactly_the_expired_unpinned_keys(
        windows, stateless_keys, pinned, watermark, allowed_lateness):
    store = KeyedStateStore()
    cell = ('t', 's', b'w')
    for key, ws in windows.items():
        store.append(key, cell, b'v')
        store.ordered_add(key, cell, 0, b'o')
        for ts in ws:
            store.index.add_window(key, ts)
    for key in stateless_keys:  # state, but no window in the index: never expired
        store.append(key, cell, b'v')

    deleted = store.expire(watermark, allowed_lateness, lambda key: key in pinned)

    expected = {
        key for key, ws in windows.items()
        if max(ws) + allowed_lateness < watermark and key not in pinned
    }
    assert set(deleted) == expected and len(deleted) == len(expected)
    assert store.keys() == (set(windows) | stateless_keys) - expected
    for key in expected:
        assert store.get(key, cell) == []
        assert store.ordered_range(key, cell, -100, 100) == []
        assert store.index.latest_window(key) is None
    surviving = {key: ws for key, ws in windows.items() if key not in expected}
    assert set(store.index.candidates(100)) == set(surviving)
    assert len(store.index) == len(surviving)
    for key, ws in surviving.items():
        assert store.index.latest_window(key) == max(ws)
        assert store.get(key, cell) == [b'v']


def test_expire_waits_for_the_latest_window_and_allowed_lateness():
    store = KeyedStateStore()
    cell = ('t', 's', b'w')
    store.append(b'k', cell, b'v')
    store.index.add_window(b'k', 10)
    store.index.add_window(b'k', 20)  # the key also holds a later window
    assert store.expire(watermark=15, allowed_lateness=0, is_pinned=lambda k: False) == []
    # latest + lateness == watermark is not yet past it
    assert store.expire(watermark=25, allowed_lateness=5, is_pinned=lambda k: False) == []
    assert store.expire(watermark=26, allowed_lateness=5, is_pinned=lambda k: True) == []
    assert store.keys() == {b'k'}
    assert store.expire(watermark=26, allowed_lateness=5, is_pinned=lambda k: False) == [b'k']
    assert store.keys() == set() and len(store) == 0
    assert store.index.candidates(10**9) == []


def test_bag_cells_are_independent_and_clear_empties_the_key():
    store = KeyedStateStore()
    store.append(b'k', ('t', 's1', b'w'), b'a')
    store.append(b'k', ('t', 's1', b'w'), b'b')
    store.append(b'k', ('t', 's2', b'w'), b'c')
    store.append(b'j', ('t', 's1', b'w'), b'd')
    assert store.get(b'k', ('t', 's1', b'w')) == [b'a', b'b']
    assert store.get(b'k', ('t', 's2', b'w')) == [b'c']
    assert store.get(b'k', ('t', 's1', b'other window')) == []
    assert store.keys() == {b'k', b'j'}
    store.clear(b'k', ('t', 's1', b'w'))
    store.clear(b'k', ('t', 's2', b'w'))
    store.clear(b'absent', ('t', 's1', b'w'))
    assert store.keys() == {b'j'} and len(store) == 1


def test_cells_with_prefix_lists_the_map_keys_of_a_cell():
    store = KeyedStateStore()
    store.append(b'k', ('t', 's', b'w', b'm1'), b'1')
    store.append(b'k', ('t', 's', b'w', b'm2'), b'2')
    store.append(b'k', ('t', 'other', b'w', b'm3'), b'3')
    assert sorted(store.cells_with_prefix(b'k', ('t', 's', b'w'))) == [
        ('t', 's', b'w', b'm1'), ('t', 's', b'w', b'm2')]
    assert list(store.cells_with_prefix(b'absent', ('t', 's', b'w'))) == []


def test_ordered_list_same_sort_key_keeps_insertion_order():
    store = KeyedStateStore()
    cell = ('t', 's', b'w')
    store.ordered_add(b'k', cell, 5, b'x')
    store.ordered_add(b'k', cell, 1, b'y')
    store.ordered_add(b'k', cell, 5, b'z')
    assert store.ordered_range(b'k', cell, 0, 10) == [b'y', b'x', b'z']
    assert store.ordered_range(b'k', cell, 1, 5) == [b'y']
    assert store.ordered_range(b'k', cell, 5, 5) == []
    store.ordered_clear(b'k', cell, 5, 6)
    assert store.ordered_range(b'k', cell, 0, 10) == [b'y']


# KeyedStateStore: encoded keys, restored eagerly and lazily ----------------------

# Few keys, so that operations after a restore keep meeting restored keys.
FEW_KEYS = st.sampled_from([b'', b'a', b'\xff'])


def encoded_store(store: KeyedStateStore) -> dict[bytes, bytes]:
    """Every key's value as `encode_key` gives it (keys holding nothing left out)."""
    values = {key: store.encode_key(key) for key in store.keys() | set(store.index.keys())}
    return {key: value for key, value in values.items() if value is not None}


def decoded_value(value: bytes):
    """(cells, ordered cells, windows) of an `encode_key` value."""
    restored = KeyedStateStore()
    restored.restore_key(b'k', value)
    return (restored._cells.get(b'k'), restored._ordered.get(b'k'),
            restored.index.windows(b'k'))


class LazyRestoreMachine(RuleBasedStateMachine):
    """A store, and the stores restored from its encoding eagerly (`restore_key`) and
    lazily (`restore_keys`) at random points, take the same random operations and
    must stay indistinguishable: contents, keys, index, and what they encode."""

    def __init__(self):
        super().__init__()
        self.stores = [KeyedStateStore()]
        for store in self.stores:
            store.track_changes()

    @rule(key=FEW_KEYS, cell=CELLS, data=DATA)
    def append(self, key, cell, data):
        for store in self.stores:
            store.append(key, cell, data)

    @rule(key=FEW_KEYS, cell=CELLS)
    def clear(self, key, cell):
        for store in self.stores:
            store.clear(key, cell)

    @rule(key=FEW_KEYS, cell=CELLS, sort_key=SORT_KEYS, data=DATA)
    def ordered_add(self, key, cell, sort_key, data):
        for store in self.stores:
            store.ordered_add(key, cell, sort_key, data)

    @rule(key=FEW_KEYS, cell=CELLS, start=SORT_KEYS, end=SORT_KEYS)
    def ordered_clear(self, key, cell, start, end):
        for store in self.stores:
            store.ordered_clear(key, cell, start, end)

    @rule(key=FEW_KEYS, ts=TIMESTAMPS)
    def add_window(self, key, ts):
        for store in self.stores:
            store.index.add_window(key, ts)

    @rule(watermark=st.integers(-15, 25), pinned=st.sets(FEW_KEYS, max_size=2))
    def expire(self, watermark, pinned):
        deleted = [sorted(store.expire(watermark, 1, pinned.__contains__))
                   for store in self.stores]
        assert all(d == deleted[0] for d in deleted)

    @rule(key=FEW_KEYS, cell=CELLS)
    def read(self, key, cell):
        seen = [(store.get(key, cell), store.ordered_range(key, cell, -100, 100),
                 sorted(store.cells_with_prefix(key, cell[:2])))
                for store in self.stores]
        assert all(s == seen[0] for s in seen)

    @rule()
    def restore(self):
        values = encoded_store(self.stores[0])
        eager, lazy = KeyedStateStore(), KeyedStateStore()
        for key, value in values.items():
            eager.restore_key(key, value)
        lazy.restore_keys(values.items())
        for store in (eager, lazy):
            store.track_changes()
        # Keep at most the live store and the last two restored ones.
        self.stores = [self.stores[0], eager, lazy]

    @invariant()
    def indistinguishable(self):
        live = self.stores[0]
        changed = [set(store._changed) for store in self.stores]
        for store in self.stores[1:]:
            assert store.keys() == live.keys()
            assert len(store) == len(live)
            assert store.live_keys() == live.live_keys()
            assert set(store.index.keys()) == set(live.index.keys())
            assert sorted(store.index.candidates(100)) == sorted(live.index.candidates(100))
            assert ({key: decoded_value(value) for key, value in encoded_store(store).items()}
                    == {key: decoded_value(value)
                        for key, value in encoded_store(live).items()})
        for store, before in zip(self.stores, changed, strict=True):
            assert store._changed == before  # encoding records no change


LazyRestoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None)
TestLazyRestore = LazyRestoreMachine.TestCase


def test_lazily_restored_keys_stay_encoded_until_used():
    store = KeyedStateStore()
    cell = ('t', 's', b'w')
    for key in (b'a', b'b', b'c'):
        store.append(key, cell, key * 2)
        store.ordered_add(key, cell, 3, b'o')
        store.index.add_window(key, 7)
    store.index.add_window(b'c', 9)
    store.index.add_window(b'only-window', 4)
    values = encoded_store(store)

    lazy = KeyedStateStore()
    lazy.restore_keys(values.items())
    lazy.track_changes()
    # Nothing decoded, but the index is complete and every key counts.
    assert set(lazy._raw) == {b'a', b'b', b'c'} and not lazy._cells and not lazy._ordered
    assert lazy.keys() == {b'a', b'b', b'c'} and lazy.live_keys() == 4
    assert sorted(lazy.index.candidates(7)) == [b'a', b'b', b'c', b'only-window']
    assert lazy.index.windows(b'c') == [7, 9]
    # An untouched key encodes to the very bytes it was restored from.
    assert {key: lazy.encode_key(key) for key in values} == values
    # First use decodes only that key.
    assert lazy.get(b'b', cell) == [b'bb']
    assert set(lazy._raw) == {b'a', b'c'}
    lazy.append(b'a', cell, b'x')
    assert lazy.get(b'a', cell) == [b'aa', b'x']
    assert lazy.ordered_range(b'a', cell, 0, 10) == [b'o']
    assert lazy.take_changed() == {b'a'}
    # Deleting an undecoded key drops its bytes and reports the change.
    lazy.delete_key(b'c')
    assert lazy.keys() == {b'a', b'b'} and lazy.encode_key(b'c') is None
    assert lazy.take_changed() == {b'c'}


def test_a_value_unpickles_to_the_cells_and_ends_with_the_windows():
    store = KeyedStateStore()
    store.append(b'k', ('t', 's', b'w'), b'v')
    store.ordered_add(b'k', ('t', 'o', b'w'), 2, b'x')
    for ts in (5, -3, 2**62):
        store.index.add_window(b'k', ts)
    value = store.encode_key(b'k')
    cells, ordered = pickle.loads(value)  # the windows trail the pickle
    assert cells == [(('t', 's', b'w'), [b'v'])]
    assert ordered == [(('t', 'o', b'w'), [(2, [b'x'])])]
    assert value.endswith(struct.pack('<3qI', -3, 5, 2**62, 3))
    assert decoded_value(value)[2] == [-3, 5, 2**62]
    # A key holding only windows, and one holding nothing.
    store.index.add_window(b'bare', 1)
    assert pickle.loads(store.encode_key(b'bare')) == ([], [])
    assert store.encode_key(b'absent') is None
