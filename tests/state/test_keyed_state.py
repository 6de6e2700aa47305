"""Unit tests of `KeyedStateIndex` and `KeyedStateStore` (no Spark).

Both are checked against brute-force models: plain dicts of window sets and of
cell contents, filtered and sorted the slow way.
"""

from __future__ import annotations

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
