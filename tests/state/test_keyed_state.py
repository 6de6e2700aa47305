"""Unit tests of `KeyedStateIndex` and of keyed state in a `KeyedStateBackend` (no Spark).

Checked against brute-force models (plain dicts of window sets and of cell
contents, filtered and sorted the slow way): the expiry index on its own; user
state cells as Beam's state protocol writes them (`PartitionStateHandler` over a
backend: bag, ordered-list and multimap cells); expiry by watermark with
allowed lateness and pinned keys; backends restored lazily, whose keys' values
stay encoded until first used; the layout of a key's persisted value.

The backend's contract with timers, holds and deltas is `test_backend.py`'s.
"""

from __future__ import annotations

import marshal
import pickle
import struct

from apache_beam.coders import coders
from apache_beam.portability.api import beam_fn_api_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from beam_streams_runner.state.backend import KeyedStateBackend, never_pinned
from beam_streams_runner.state.keyed_state import KeyedStateIndex
from beam_streams_runner.state.state_handler import PartitionStateHandler
from tests.state import test_state_handler as state_handler_tests
from tests.state.test_backend import decoded

KEY_POOL = [b'', b'a', b'b', b'ab', b'\x00', b'\xff', b'\xff\xff']
KEYS = st.sampled_from(KEY_POOL) | st.binary(max_size=3)
TIMESTAMPS = st.integers(min_value=-10, max_value=10)
CELLS = st.sampled_from([
    ('t1', 's1', b'w1'), ('t1', 's1', b'w2'), ('t1', 's2', b'w1'), ('t2', 's1', b'w1'),
])
# A cell is the namespace (transform id, state id, window) whatever its kind: a state
# id is a bag (or combining, set) or an ordered list, never both (Beam's specs).
ORDERED_CELLS = st.sampled_from([
    ('t1', 'o1', b'w1'), ('t1', 'o1', b'w2'), ('t1', 'o2', b'w1'), ('t2', 'o1', b'w1'),
])
DATA = st.binary(max_size=3)
SORT_KEYS = st.integers(min_value=-8, max_value=8)

StateKey = beam_fn_api_pb2.StateKey
ENTRY_CODER = coders.TupleCoder(
    [coders.VarIntCoder(), coders.LengthPrefixCoder(coders.BytesCoder())]).get_impl()


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


def test_index_records_window_changes_in_its_owners_set():
    index = KeyedStateIndex()
    index.add_window(b'before', 1)  # not tracking yet
    changed: set[bytes] = set()
    index.track_changes(changed)
    index.add_window(b'k', 5)
    index.add_window(b'j', 5)
    assert changed == {b'k', b'j'}
    changed.clear()
    index.add_window(b'k', 5)  # already known: no change
    index.remove_key(b'never added')
    index.restore_key(b'r', [3, 1])  # restoring is no change
    index.restore_keys([(b's', [2])])
    assert changed == set()
    index.add_window(b'k', 2)  # a new earliest window
    index.add_window(b'j', 9)  # a new latest one
    index.remove_key(b'before')
    assert changed == {b'k', b'j', b'before'}
    assert index.windows(b'r') == [1, 3] and index.windows(b'k') == [2, 5]


# Cells: Beam's state protocol over a backend -----------------------------------------

def bag_key(key: bytes, cell: tuple) -> StateKey:
    transform_id, state_id, window = cell
    return state_handler_tests.bag_key(key, window, state_id, transform_id)


def ordered_key(key: bytes, cell: tuple, start: int | None = None,
                end: int | None = None) -> StateKey:
    transform_id, state_id, window = cell
    return state_handler_tests.ordered_key(key, window, state_id, transform_id, start, end)


def multimap_key(key: bytes, cell: tuple, map_key: bytes) -> StateKey:
    transform_id, state_id, window = cell
    return StateKey(multimap_user_state=StateKey.MultimapUserState(
        transform_id=transform_id, user_state_id=state_id, window=window, key=key,
        map_key=map_key))


def multimap_keys_key(key: bytes, cell: tuple) -> StateKey:
    transform_id, state_id, window = cell
    return StateKey(multimap_keys_user_state=StateKey.MultimapKeysUserState(
        transform_id=transform_id, user_state_id=state_id, window=window, key=key))


class Cells:
    """Bag and ordered-list cells of a backend, through a `PartitionStateHandler`."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend
        self.handler = PartitionStateHandler(backend)

    def append(self, key, cell, data):
        self.handler.append_raw(bag_key(key, cell), data)

    def clear(self, key, cell):
        self.handler.clear(bag_key(key, cell))

    def get(self, key, cell) -> bytes:
        data, token = self.handler.get_raw(bag_key(key, cell))
        assert token is None
        return data

    def ordered_add(self, key, cell, sort_key, data):
        self.handler.append_raw(ordered_key(key, cell), ENTRY_CODER.encode((sort_key, data)))

    def ordered_range(self, key, cell, start, end) -> list[bytes]:
        data, token = self.handler.get_raw(ordered_key(key, cell, start, end))
        assert token is None
        return [value for _, value in ENTRY_CODER.decode_all(data)]

    def ordered_clear(self, key, cell, start, end):
        self.handler.clear(ordered_key(key, cell, start, end))


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


class KeyedCellsMachine(RuleBasedStateMachine):
    """Random bag, ordered-list, window and expiry operations against `StoreModel`."""

    def __init__(self):
        super().__init__()
        self.backend = KeyedStateBackend()
        self.cells = Cells(self.backend)
        self.model = StoreModel()

    @rule(key=KEYS, cell=CELLS, data=DATA)
    def append(self, key, cell, data):
        self.cells.append(key, cell, data)
        self.model.bags.setdefault((key, cell), []).append(data)

    @rule(key=KEYS, cell=CELLS)
    def clear(self, key, cell):
        self.cells.clear(key, cell)
        self.model.bags.pop((key, cell), None)

    @rule(key=KEYS, cell=CELLS)
    def get(self, key, cell):
        assert self.cells.get(key, cell) == b''.join(self.model.bags.get((key, cell), []))

    @rule(key=KEYS, cell=ORDERED_CELLS, sort_key=SORT_KEYS, data=DATA)
    def ordered_add(self, key, cell, sort_key, data):
        self.cells.ordered_add(key, cell, sort_key, data)
        self.model.ordered.setdefault((key, cell), []).append((sort_key, data))

    @rule(key=KEYS, cell=ORDERED_CELLS, start=SORT_KEYS, end=SORT_KEYS)
    def ordered_range(self, key, cell, start, end):
        assert (self.cells.ordered_range(key, cell, start, end)
                == self.model.ordered_range(key, cell, start, end))

    @rule(key=KEYS, cell=ORDERED_CELLS, start=SORT_KEYS, end=SORT_KEYS)
    def ordered_clear(self, key, cell, start, end):
        self.cells.ordered_clear(key, cell, start, end)
        self.model.ordered_clear(key, cell, start, end)

    @rule(key=KEYS, ts=TIMESTAMPS)
    def add_window(self, key, ts):
        self.backend.add_window(key, ts)
        self.model.windows.setdefault(key, set()).add(ts)

    @rule(
        watermark=st.integers(-15, 25),
        allowed_lateness=st.integers(0, 5),
        pinned=st.sets(KEYS, max_size=3),
    )
    def expire(self, watermark, allowed_lateness, pinned):
        keys_before = self.backend.keys()
        deleted = self.backend.expire(watermark, allowed_lateness, lambda key: key in pinned)
        assert len(deleted) == len(set(deleted))
        assert set(deleted) == self.model.expire(watermark, allowed_lateness, pinned)
        assert self.backend.keys() == keys_before - set(deleted)

    @invariant()
    def agrees_with_model(self):
        backend = self.backend
        assert backend.keys() == self.model.keys()
        assert backend.live_keys() == len(self.model.keys() | set(self.model.windows))
        assert len(backend.expiry) == len(self.model.windows)
        for key in backend.keys() | set(self.model.windows):
            ws = self.model.windows.get(key)
            assert backend.expiry.latest_window(key) == (max(ws) if ws else None)
        assert (set(backend.expiry.candidates(100))
                == brute_force_candidates(self.model.windows, 100))
        for (key, cell), chunks in self.model.bags.items():
            assert backend.get(key, cell) == chunks  # one cell: the chunks as appended


KeyedCellsMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None)
TestKeyedCellsStateful = KeyedCellsMachine.TestCase


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(st.tuples(SORT_KEYS, DATA), max_size=25),
    start=SORT_KEYS,
    end=SORT_KEYS,
)
def test_ordered_range_is_half_open_and_sorted(entries, start, end):
    cells = Cells(KeyedStateBackend())
    cell = ('t', 's', b'w')
    for sort_key, data in entries:
        cells.ordered_add(b'k', cell, sort_key, data)
    expected = [d for s, d in sorted(entries, key=lambda e: e[0]) if start <= s < end]
    assert cells.ordered_range(b'k', cell, start, end) == expected
    cells.ordered_clear(b'k', cell, start, end)
    remaining = [d for s, d in sorted(entries, key=lambda e: e[0]) if not start <= s < end]
    assert cells.ordered_range(b'k', cell, -100, 100) == remaining
    assert (b'k' in cells.backend.keys()) == bool(remaining)


def test_ordered_list_same_sort_key_keeps_insertion_order():
    cells = Cells(KeyedStateBackend())
    cell = ('t', 's', b'w')
    cells.ordered_add(b'k', cell, 5, b'x')
    cells.ordered_add(b'k', cell, 1, b'y')
    cells.ordered_add(b'k', cell, 5, b'z')
    assert cells.ordered_range(b'k', cell, 0, 10) == [b'y', b'x', b'z']
    assert cells.ordered_range(b'k', cell, 1, 5) == [b'y']
    assert cells.ordered_range(b'k', cell, 5, 5) == []
    # The cell is one value of the key: sort key -> encoded entries.
    assert dict(cells.backend.get(b'k', cell)) == {
        1: [ENTRY_CODER.encode((1, b'y'))],
        5: [ENTRY_CODER.encode((5, b'x')), ENTRY_CODER.encode((5, b'z'))]}
    cells.ordered_clear(b'k', cell, 5, 6)
    assert cells.ordered_range(b'k', cell, 0, 10) == [b'y']


def test_bag_cells_are_independent_and_clear_empties_the_key():
    cells = Cells(KeyedStateBackend())
    cells.append(b'k', ('t', 's1', b'w'), b'a')
    cells.append(b'k', ('t', 's1', b'w'), b'b')
    cells.append(b'k', ('t', 's2', b'w'), b'c')
    cells.append(b'j', ('t', 's1', b'w'), b'd')
    assert cells.backend.get(b'k', ('t', 's1', b'w')) == [b'a', b'b']
    assert cells.get(b'k', ('t', 's1', b'w')) == b'ab'
    assert cells.get(b'k', ('t', 's2', b'w')) == b'c'
    assert cells.get(b'k', ('t', 's1', b'other window')) == b''
    assert cells.backend.keys() == {b'k', b'j'}
    assert sorted(cells.backend.namespaces(b'k')) == [('t', 's1', b'w'), ('t', 's2', b'w')]
    cells.clear(b'k', ('t', 's1', b'w'))
    cells.clear(b'k', ('t', 's2', b'w'))
    cells.clear(b'absent', ('t', 's1', b'w'))
    assert cells.backend.keys() == {b'j'} and cells.backend.namespaces(b'k') == []


def test_multimap_keys_list_only_the_map_keys_of_their_cell():
    backend = KeyedStateBackend()
    handler = PartitionStateHandler(backend)
    cell = ('t', 's', b'w')
    handler.append_raw(multimap_key(b'k', cell, b'm1'), b'1')
    handler.append_raw(multimap_key(b'k', cell, b'm2'), b'2')
    handler.append_raw(multimap_key(b'k', ('t', 'other', b'w'), b'm3'), b'3')
    handler.append_raw(bag_key(b'k', cell), b'a bag of the same id')
    # A multimap entry is the namespace cell + (map key,).
    assert sorted(backend.namespaces(b'k'), key=repr) == sorted([
        ('t', 's', b'w'), ('t', 's', b'w', b'm1'), ('t', 's', b'w', b'm2'),
        ('t', 'other', b'w', b'm3')], key=repr)
    keys, _ = handler.get_raw(multimap_keys_key(b'k', cell))
    assert sorted([keys[:2], keys[2:]]) == [b'm1', b'm2']
    assert handler.get_raw(multimap_keys_key(b'absent', cell)) == (b'', None)
    handler.clear(multimap_keys_key(b'k', cell))
    assert sorted(backend.namespaces(b'k'), key=repr) == sorted(
        [('t', 's', b'w'), ('t', 'other', b'w', b'm3')], key=repr)


# Expiry -----------------------------------------------------------------------------

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
    backend = KeyedStateBackend()
    cells = Cells(backend)
    cell = ('t', 's', b'w')
    for key, ws in windows.items():
        cells.append(key, cell, b'v')
        cells.ordered_add(key, ('t', 'o', b'w'), 0, b'o')
        for ts in ws:
            backend.add_window(key, ts)
    for key in stateless_keys:  # state, but no window in the index: never expired
        cells.append(key, cell, b'v')

    deleted = backend.expire(watermark, allowed_lateness, lambda key: key in pinned)

    expected = {
        key for key, ws in windows.items()
        if max(ws) + allowed_lateness < watermark and key not in pinned
    }
    assert set(deleted) == expected and len(deleted) == len(expected)
    assert backend.keys() == (set(windows) | stateless_keys) - expected
    for key in expected:
        assert cells.get(key, cell) == b''
        assert cells.ordered_range(key, ('t', 'o', b'w'), -100, 100) == []
        assert backend.expiry.latest_window(key) is None
        assert key not in backend.all_keys()
    surviving = {key: ws for key, ws in windows.items() if key not in expected}
    assert set(backend.expiry.candidates(100)) == set(surviving)
    assert len(backend.expiry) == len(surviving)
    for key, ws in surviving.items():
        assert backend.expiry.latest_window(key) == max(ws)
        assert cells.get(key, cell) == b'v'


def test_expire_waits_for_the_latest_window_and_allowed_lateness():
    backend = KeyedStateBackend()
    backend.put(b'k', ('t', 's', b'w'), [b'v'])
    backend.add_window(b'k', 10)
    backend.add_window(b'k', 20)  # the key also holds a later window
    assert backend.expire(watermark=15, allowed_lateness=0, is_pinned=never_pinned) == []
    # latest + lateness == watermark is not yet past it
    assert backend.expire(watermark=25, allowed_lateness=5, is_pinned=never_pinned) == []
    assert backend.expire(watermark=26, allowed_lateness=5, is_pinned=lambda k: True) == []
    assert backend.keys() == {b'k'}
    assert backend.expire(watermark=26, allowed_lateness=5) == [b'k']  # none pinned
    assert backend.keys() == set() and backend.live_keys() == 0
    assert backend.expiry.candidates(10**9) == []


def test_live_keys_count_keys_whose_cleared_windows_are_not_collected_yet():
    backend = KeyedStateBackend()
    cells = Cells(backend)
    cells.append(b'a', ('t', 's', b'w'), b'x')
    backend.add_window(b'a', 10)
    cells.append(b'b', ('t', 's', b'w'), b'y')  # no window: never expired
    backend.add_window(b'c', 10)  # windows only
    assert backend.keys() == {b'a', b'b'} and backend.live_keys() == 3
    cells.clear(b'a', ('t', 's', b'w'))  # the DoFn cleared its state
    assert backend.keys() == {b'b'} and backend.live_keys() == 3
    assert sorted(backend.expire(11, 0, never_pinned)) == [b'a', b'c']
    assert backend.live_keys() == 1


# Persisted values, restored lazily ------------------------------------------------

# Few keys, so that operations after a restore keep meeting restored keys.
FEW_KEYS = st.sampled_from([b'', b'a', b'\xff'])
def touch_every_key(backend: KeyedStateBackend) -> None:
    """Decodes every restored key (reading is no change)."""
    for key in backend.keys():
        backend.namespaces(key)


class LazyRestoreMachine(RuleBasedStateMachine):
    """A backend, and backends restored from its snapshot at random points (one left
    lazy, one whose keys were all decoded at once), take the same random state
    requests and must stay indistinguishable: contents, keys, index, what they
    encode; and encoding changes nothing. (Restores from the sum of deltas:
    `test_state_deltas.py`.)"""

    def __init__(self):
        super().__init__()
        self.backends = [KeyedStateBackend(track_changes=True)]

    def each(self):
        return [Cells(backend) for backend in self.backends]

    @rule(key=FEW_KEYS, cell=CELLS, data=DATA)
    def append(self, key, cell, data):
        for cells in self.each():
            cells.append(key, cell, data)

    @rule(key=FEW_KEYS, cell=CELLS)
    def clear(self, key, cell):
        for cells in self.each():
            cells.clear(key, cell)

    @rule(key=FEW_KEYS, cell=ORDERED_CELLS, sort_key=SORT_KEYS, data=DATA)
    def ordered_add(self, key, cell, sort_key, data):
        for cells in self.each():
            cells.ordered_add(key, cell, sort_key, data)

    @rule(key=FEW_KEYS, cell=ORDERED_CELLS, start=SORT_KEYS, end=SORT_KEYS)
    def ordered_clear(self, key, cell, start, end):
        for cells in self.each():
            cells.ordered_clear(key, cell, start, end)

    @rule(key=FEW_KEYS, ts=TIMESTAMPS)
    def add_window(self, key, ts):
        for backend in self.backends:
            backend.add_window(key, ts)

    @rule(watermark=st.integers(-15, 25), pinned=st.sets(FEW_KEYS, max_size=2))
    def expire(self, watermark, pinned):
        deleted = [sorted(backend.expire(watermark, 1, pinned.__contains__))
                   for backend in self.backends]
        assert all(d == deleted[0] for d in deleted)

    @rule(key=FEW_KEYS, cell=CELLS, ordered=ORDERED_CELLS)
    def read(self, key, cell, ordered):
        seen = [(cells.get(key, cell), cells.ordered_range(key, ordered, -100, 100),
                 sorted(cells.backend.namespaces(key)))
                for cells in self.each()]
        assert all(s == seen[0] for s in seen)

    @rule()
    def restore(self):
        live = self.backends[0]
        snapshot = live.snapshot()
        lazy, decoded = (KeyedStateBackend(track_changes=True) for _ in range(2))
        lazy.restore(snapshot)
        decoded.restore(snapshot)
        touch_every_key(decoded)
        assert not decoded._raw and set(lazy._raw) <= live.keys()
        # Keep the live backend and the last two restored ones.
        self.backends = [live, lazy, decoded]

    @invariant()
    def indistinguishable(self):
        live = self.backends[0]
        changed = [set(backend._changed) for backend in self.backends]
        expected = decoded(live.snapshot(), dict)
        for backend in self.backends[1:]:
            assert backend.keys() == live.keys()
            assert backend.all_keys() == live.all_keys()
            assert backend.live_keys() == live.live_keys()
            assert set(backend.expiry.keys()) == set(live.expiry.keys())
            assert (sorted(backend.expiry.candidates(100))
                    == sorted(live.expiry.candidates(100)))
            assert decoded(backend.snapshot(), dict) == expected
        for backend, before in zip(self.backends, changed, strict=True):
            assert backend._changed == before  # encoding records no change


LazyRestoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None)
TestLazyRestore = LazyRestoreMachine.TestCase


def test_lazily_restored_keys_stay_encoded_until_used():
    backend = KeyedStateBackend()
    cells = Cells(backend)
    cell = ('t', 's', b'w')
    ordered = ('t', 'o', b'w')
    for key in (b'a', b'b', b'c'):
        cells.append(key, cell, key * 2)
        cells.ordered_add(key, ordered, 3, b'o')
        backend.add_window(key, 7)
    backend.add_window(b'c', 9)
    backend.add_window(b'only-window', 4)
    snapshot = backend.snapshot()

    lazy = KeyedStateBackend()
    lazy.restore(snapshot)
    lazy_cells = Cells(lazy)
    # Nothing decoded, but the index is complete and every key counts.
    assert set(lazy._raw) == {b'a', b'b', b'c'} and not lazy._values
    assert lazy.keys() == {b'a', b'b', b'c'} and lazy.live_keys() == 4
    assert b'a' in lazy and b'only-window' not in lazy
    assert sorted(lazy.expiry.candidates(7)) == [b'a', b'b', b'c', b'only-window']
    assert lazy.expiry.windows(b'c') == [7, 9]
    # Untouched keys encode to the very bytes they were restored from.
    assert lazy.snapshot() == snapshot
    # First use decodes only that key.
    assert lazy_cells.get(b'b', cell) == b'bb'
    assert set(lazy._raw) == {b'a', b'c'}
    lazy_cells.append(b'a', cell, b'x')
    assert lazy.get(b'a', cell) == [b'aa', b'x']
    assert lazy_cells.ordered_range(b'a', ordered, 0, 10) == [b'o']
    dirty, deleted = lazy.take_delta()
    assert set(dirty) == {b'ka', b'm'} and deleted == set()
    # A key changed only in its windows keeps its values encoded.
    lazy.add_window(b'c', 11)
    dirty, _ = lazy.take_delta()
    assert set(dirty) == {b'kc', b'm'} and b'c' in lazy._raw
    assert decoded(dirty, dict)[b'kc'] == (
        ([7, 9, 11], None, [], []),
        {cell: [b'cc'], ordered: {3: [ENTRY_CODER.encode((3, b'o'))]}})
    # Deleting an undecoded key drops its bytes and lists it deleted.
    lazy.delete_key(b'c')
    assert lazy.keys() == {b'a', b'b'} and b'c' not in lazy._raw
    dirty, deleted = lazy.take_delta()
    assert set(dirty) == {b'm'} and deleted == {b'kc'}


def test_a_value_is_its_header_then_the_codecs_encoding_of_its_values():
    backend = KeyedStateBackend()
    cells = Cells(backend)
    cells.append(b'k', ('t', 's', b'w'), b'v')
    cells.ordered_add(b'k', ('t', 'o', b'w'), 2, b'x')
    for ts in (5, -3, 2**62):
        backend.add_window(b'k', ts)
    value = backend.snapshot()[b'kk']
    # A length-prefixed marshal header: windows, hold, event and processing timers.
    (length,) = struct.unpack_from('<I', value)
    assert marshal.loads(value[4:4 + length]) == ([-3, 5, 2**62], None, [], [])
    values = pickle.loads(value[4 + length:])
    assert values[0] == (('t', 's', b'w'), [b'v'])
    assert values[1][0] == ('t', 'o', b'w')
    assert dict(values[1][1]) == {2: [ENTRY_CODER.encode((2, b'x'))]}
    # A key holding only windows has no values after its header, one holding
    # nothing is not in the state at all.
    backend.add_window(b'bare', 1)
    bare = backend.snapshot()[b'kbare']
    (length,) = struct.unpack_from('<I', bare)
    assert len(bare) == 4 + length and marshal.loads(bare[4:]) == ([1], None, [], [])
    assert set(backend.snapshot()) == {b'kk', b'kbare', b'm'}
