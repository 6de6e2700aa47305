"""Unit tests of `PartitionStateHandler`, Beam's state protocol over a partition (no Spark).

The handler serves user state from the partition's `KeyedStateBackend`: a cell is
the namespace `(transform id, state id, encoded window)` of the encoded user key,
holding a list of encoded chunks (an ordered list: a `SortedDict` from sort key to
entries; a multimap entry: the namespace `cell + (map key,)`). Requests are built
as `StateKey` protos, as the SDK harness sends them; the last tests go through
Beam's own `GlobalCachingStateHandler` and runtime state classes.
"""

from __future__ import annotations

import pytest
from apache_beam.coders import coders
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker import bundle_processor, sdk_worker, statecache
from apache_beam.utils.timestamp import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.state.state_handler import PartitionStateHandler

StateKey = beam_fn_api_pb2.StateKey
ENTRY_CODER = coders.TupleCoder(
    [coders.VarIntCoder(), coders.LengthPrefixCoder(coders.BytesCoder())]).get_impl()
RANGE_MIN = -(1 << 63)
RANGE_MAX = (1 << 63) - 1


def bag_key(key=b'k', window=b'w', state_id='s', transform_id='t'):
    return StateKey(bag_user_state=StateKey.BagUserState(
        transform_id=transform_id, user_state_id=state_id, window=window, key=key))


def ordered_key(key=b'k', window=b'w', state_id='s', transform_id='t', start=None, end=None):
    state_key = StateKey(ordered_list_user_state=StateKey.OrderedListUserState(
        transform_id=transform_id, user_state_id=state_id, window=window, key=key))
    if start is not None:
        state_key.ordered_list_user_state.range.start = start
        state_key.ordered_list_user_state.range.end = end
    return state_key


def read_ordered(handler, start=RANGE_MIN, end=RANGE_MAX, **kwargs):
    data, token = handler.get_raw(ordered_key(start=start, end=end, **kwargs))
    assert token is None
    return list(ENTRY_CODER.decode_all(data))


# Bag user state ------------------------------------------------------------------

def test_bag_append_twice_then_get_returns_the_concatenation():
    handler = PartitionStateHandler()
    handler.append_raw(bag_key(), b'abc')
    handler.append_raw(bag_key(), b'de')
    assert handler.get_raw(bag_key()) == (b'abcde', None)
    # Both chunks are kept in one cell of the backend under the encoded user key.
    assert handler.state.keys() == {b'k'}
    assert handler.state.namespaces(b'k') == [('t', 's', b'w')]
    assert handler.state.get(b'k', ('t', 's', b'w')) == [b'abc', b'de']


def test_bag_clear_empties_the_cell():
    handler = PartitionStateHandler()
    handler.append_raw(bag_key(), b'abc')
    handler.clear(bag_key())
    assert handler.get_raw(bag_key()) == (b'', None)
    assert handler.state.keys() == set()
    handler.append_raw(bag_key(), b'x')
    assert handler.get_raw(bag_key()) == (b'x', None)


def test_bag_cells_of_different_windows_keys_and_states_are_independent():
    handler = PartitionStateHandler()
    variants = [
        bag_key(),
        bag_key(key=b'other key'),
        bag_key(window=b'other window'),
        bag_key(state_id='other state'),
        bag_key(transform_id='other transform'),
    ]
    for i, state_key in enumerate(variants):
        handler.append_raw(state_key, b'%d' % i)
    for i, state_key in enumerate(variants):
        assert handler.get_raw(state_key) == (b'%d' % i, None)
    handler.clear(variants[0])
    assert handler.get_raw(variants[0]) == (b'', None)
    for i, state_key in enumerate(variants[1:], start=1):
        assert handler.get_raw(state_key) == (b'%d' % i, None)


def test_operations_return_completed_futures_and_lifecycle_is_a_no_op():
    handler = PartitionStateHandler()
    with handler.process_instruction_id('bundle-1'):
        assert handler.append_raw(bag_key(), b'a').get() is None
        assert handler.clear(bag_key()).get() is None
    handler.done()


def test_a_given_backend_is_used_not_copied():
    backend = KeyedStateBackend()
    backend.put(b'k', ('t', 's', b'w'), [b'already ', b'there'])
    handler = PartitionStateHandler(backend)
    assert handler.state is backend
    assert handler.get_raw(bag_key()) == (b'already there', None)
    handler.append_raw(bag_key(), b'!')
    assert backend.get(b'k', ('t', 's', b'w')) == [b'already ', b'there', b'!']
    assert isinstance(PartitionStateHandler().state, KeyedStateBackend)


def test_a_restored_backend_is_served_as_the_one_that_wrote_it():
    written = PartitionStateHandler()
    written.append_raw(bag_key(), b'bag')
    # (A state id is a bag or an ordered list, never both: the cell is one namespace.)
    written.append_raw(ordered_key(state_id='o'), ENTRY_CODER.encode_all([(2, b'b'), (1, b'a')]))
    backend = KeyedStateBackend()
    backend.restore(written.state.snapshot())
    handler = PartitionStateHandler(backend)
    assert handler.get_raw(bag_key()) == (b'bag', None)
    assert read_ordered(handler, state_id='o') == [(1, b'a'), (2, b'b')]
    handler.append_raw(ordered_key(state_id='o'), ENTRY_CODER.encode_all([(0, b'z')]))
    assert read_ordered(handler, state_id='o') == [(0, b'z'), (1, b'a'), (2, b'b')]


# Changes: every write marks its key for the epoch's delta --------------------------------

def changed_keys(backend: KeyedStateBackend) -> tuple[set[bytes], set[bytes]]:
    """The keys `take_delta` lists as written and as deleted."""
    dirty, deleted = backend.take_delta()
    assert dirty.pop(b'm') is not None  # the partition's own values, every delta
    return {name[1:] for name in dirty}, {name[1:] for name in deleted}


def test_every_write_marks_its_key_changed_and_reads_do_not():
    map_value = StateKey(multimap_user_state=StateKey.MultimapUserState(
        transform_id='t', user_state_id='m', window=b'w', key=b'map', map_key=b'mk'))
    map_keys = StateKey(multimap_keys_user_state=StateKey.MultimapKeysUserState(
        transform_id='t', user_state_id='m', window=b'w', key=b'map'))
    backend = KeyedStateBackend(track_changes=True)
    handler = PartitionStateHandler(backend)
    handler.append_raw(bag_key(key=b'bag'), b'a')
    handler.append_raw(ordered_key(key=b'list'), ENTRY_CODER.encode_all([(1, b'x')]))
    handler.append_raw(map_value, b'v')
    assert changed_keys(backend) == ({b'bag', b'list', b'map'}, set())
    # Appending to a chunk list or a sorted dict changes it in place: still a change.
    handler.append_raw(bag_key(key=b'bag'), b'b')
    handler.append_raw(ordered_key(key=b'list'), ENTRY_CODER.encode_all([(2, b'y')]))
    handler.append_raw(map_value, b'w')
    assert changed_keys(backend) == ({b'bag', b'list', b'map'}, set())
    handler.get_raw(bag_key(key=b'bag'))
    read_ordered(handler, key=b'list')
    handler.get_raw(map_keys)
    handler.clear(bag_key(key=b'absent'))
    handler.clear(ordered_key(key=b'list', start=5, end=9))  # nothing in that range
    assert changed_keys(backend) == (set(), set())
    handler.clear(ordered_key(key=b'list', start=2, end=3))  # part of the list
    assert changed_keys(backend) == ({b'list'}, set())
    assert backend.snapshot()[b'klist'] is not None
    handler.clear(bag_key(key=b'bag'))
    handler.clear(ordered_key(key=b'list', start=RANGE_MIN, end=RANGE_MAX))
    handler.clear(map_keys)
    assert changed_keys(backend) == (set(), {b'bag', b'list', b'map'})
    assert backend.keys() == set()


# Multimap user state ---------------------------------------------------------------

def test_multimap_user_state_values_keys_and_clear():
    def value_key(map_key):
        return StateKey(multimap_user_state=StateKey.MultimapUserState(
            transform_id='t', user_state_id='m', window=b'w', key=b'k', map_key=map_key))
    keys_key = StateKey(multimap_keys_user_state=StateKey.MultimapKeysUserState(
        transform_id='t', user_state_id='m', window=b'w', key=b'k'))
    handler = PartitionStateHandler()
    handler.append_raw(value_key(b'\x01a'), b'1')
    handler.append_raw(value_key(b'\x01a'), b'2')
    handler.append_raw(value_key(b'\x01b'), b'3')
    assert handler.get_raw(value_key(b'\x01a')) == (b'12', None)
    assert sorted(handler.get_raw(keys_key)[0]) == sorted(b'\x01a\x01b')
    handler.clear(value_key(b'\x01a'))
    assert handler.get_raw(value_key(b'\x01a')) == (b'', None)
    assert handler.get_raw(keys_key) == (b'\x01b', None)
    handler.clear(keys_key)
    assert handler.get_raw(keys_key) == (b'', None)
    assert handler.get_raw(value_key(b'\x01b')) == (b'', None)


# Ordered-list user state -----------------------------------------------------------

SORT_KEYS = st.integers(min_value=-6, max_value=6) | st.sampled_from(
    [RANGE_MIN, RANGE_MAX - 1, -(1 << 40), 1 << 40])
ENTRIES = st.tuples(SORT_KEYS, st.binary(max_size=4))
BOUNDS = st.integers(min_value=-8, max_value=8) | st.sampled_from([RANGE_MIN, RANGE_MAX])


def brute_force_range(entries, start, end):
    """The entries with start <= sort key < end, by sort key, then insertion order."""
    return [e for e in sorted(entries, key=lambda e: e[0]) if start <= e[0] < end]


@settings(max_examples=100, deadline=None)
@given(
    batches=st.lists(st.lists(ENTRIES, max_size=6), max_size=5),
    start=BOUNDS,
    end=BOUNDS,
)
def test_ordered_list_get_range_equals_brute_force(batches, start, end):
    handler = PartitionStateHandler()
    for batch in batches:
        handler.append_raw(ordered_key(), ENTRY_CODER.encode_all(batch))
    entries = [entry for batch in batches for entry in batch]
    assert read_ordered(handler, start, end) == brute_force_range(entries, start, end)
    assert read_ordered(handler) == brute_force_range(entries, RANGE_MIN, RANGE_MAX)
    # The raw bytes are exactly the encoded entries, concatenated.
    raw, _ = handler.get_raw(ordered_key(start=start, end=end))
    assert raw == ENTRY_CODER.encode_all(brute_force_range(entries, start, end))


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(ENTRIES, max_size=12),
    clears=st.lists(st.tuples(BOUNDS, BOUNDS), max_size=3),
)
def test_ordered_list_clear_range_removes_only_that_range(entries, clears):
    handler = PartitionStateHandler()
    handler.append_raw(ordered_key(), ENTRY_CODER.encode_all(entries))
    handler.append_raw(ordered_key(key=b'other'), ENTRY_CODER.encode_all(entries))
    remaining = list(entries)
    for start, end in clears:
        handler.clear(ordered_key(start=start, end=end))
        remaining = [e for e in remaining if not start <= e[0] < end]
        assert read_ordered(handler) == brute_force_range(remaining, RANGE_MIN, RANGE_MAX)
    # Another key's list is untouched.
    assert read_ordered(handler, key=b'other') == brute_force_range(
        entries, RANGE_MIN, RANGE_MAX)


def test_ordered_list_example():
    handler = PartitionStateHandler()
    handler.append_raw(ordered_key(), ENTRY_CODER.encode_all([(5, b'e'), (1, b'a')]))
    handler.append_raw(ordered_key(), ENTRY_CODER.encode_all([(3, b'c'), (5, b'f')]))
    assert read_ordered(handler) == [(1, b'a'), (3, b'c'), (5, b'e'), (5, b'f')]
    assert read_ordered(handler, 1, 5) == [(1, b'a'), (3, b'c')]
    assert read_ordered(handler, 3, 3) == []
    # A request without a range reads the empty range [0, 0).
    assert handler.get_raw(ordered_key()) == (b'', None)
    handler.clear(ordered_key(start=2, end=5))
    assert read_ordered(handler) == [(1, b'a'), (5, b'e'), (5, b'f')]
    assert read_ordered(handler, window=b'other window') == []
    handler.clear(ordered_key(start=RANGE_MIN, end=RANGE_MAX))
    assert read_ordered(handler) == []
    assert handler.state.keys() == set()


# Side inputs ------------------------------------------------------------------------

def test_side_inputs_are_served_from_the_encoded_map():
    iterable = StateKey(iterable_side_input=StateKey.IterableSideInput(
        transform_id='t', side_input_id='side', window=b'w'))
    multimap = StateKey(multimap_side_input=StateKey.MultimapSideInput(
        transform_id='t', side_input_id='side', window=b'w', key=b'mk'))
    multimap_keys = StateKey(multimap_keys_side_input=StateKey.MultimapKeysSideInput(
        transform_id='t', side_input_id='side', window=b'w'))
    side_inputs = {
        iterable.SerializeToString(): b'iterable values',
        multimap.SerializeToString(): b'multimap values',
        multimap_keys.SerializeToString(): b'multimap keys',
    }
    handler = PartitionStateHandler(side_inputs=side_inputs)
    assert handler.get_raw(iterable) == (b'iterable values', None)
    assert handler.get_raw(multimap) == (b'multimap values', None)
    assert handler.get_raw(multimap_keys) == (b'multimap keys', None)

    other_window = StateKey(iterable_side_input=StateKey.IterableSideInput(
        transform_id='t', side_input_id='side', window=b'other window'))
    other_key = StateKey(multimap_side_input=StateKey.MultimapSideInput(
        transform_id='t', side_input_id='side', window=b'w', key=b'missing'))
    assert handler.get_raw(other_window) == (b'', None)
    assert handler.get_raw(other_key) == (b'', None)
    assert PartitionStateHandler().get_raw(iterable) == (b'', None)


def test_side_inputs_are_read_only():
    iterable = StateKey(iterable_side_input=StateKey.IterableSideInput(
        transform_id='t', side_input_id='side', window=b'w'))
    handler = PartitionStateHandler(side_inputs={iterable.SerializeToString(): b'v'})
    with pytest.raises(NotImplementedError):
        handler.append_raw(iterable, b'x')
    with pytest.raises(NotImplementedError):
        handler.clear(iterable)
    assert handler.get_raw(iterable) == (b'v', None)


# Unsupported state types --------------------------------------------------------------

@pytest.mark.parametrize('state_key', [
    StateKey(runner=StateKey.Runner(key=b'r')),
    StateKey(multimap_entries_user_state=StateKey.MultimapEntriesUserState(
        transform_id='t', user_state_id='m', window=b'w', key=b'k')),
    StateKey(),
], ids=['runner', 'multimap_entries_user_state', 'no type'])
def test_unsupported_state_type_raises_not_implemented(state_key):
    handler = PartitionStateHandler()
    with pytest.raises(NotImplementedError):
        handler.get_raw(state_key)
    with pytest.raises(NotImplementedError):
        handler.append_raw(state_key, b'x')
    with pytest.raises(NotImplementedError):
        handler.clear(state_key)


# Window index -------------------------------------------------------------------------

def test_window_max_timestamp_feeds_the_expiry_index():
    window_ends = {b'w1': 100, b'w2': 300}
    calls = []

    def window_max_timestamp(transform_id, window):
        calls.append((transform_id, window))
        return window_ends[window]

    backend = KeyedStateBackend()
    handler = PartitionStateHandler(backend, window_max_timestamp=window_max_timestamp)
    handler.append_raw(bag_key(key=b'k1', window=b'w1'), b'a')
    handler.append_raw(
        ordered_key(key=b'k2', window=b'w2'), ENTRY_CODER.encode_all([(1, b'x')]))
    handler.append_raw(bag_key(key=b'k2', window=b'w1', transform_id='t2'), b'b')
    assert ('t2', b'w1') in calls

    assert backend.expiry.candidates(99) == []
    assert sorted(backend.expiry.candidates(100)) == [b'k1', b'k2']
    assert backend.expiry.latest_window(b'k1') == 100
    assert backend.expiry.latest_window(b'k2') == 300
    assert backend.expiry.windows(b'k2') == [100, 300]
    # Reads and clears add no window.
    handler.get_raw(bag_key(key=b'k3', window=b'w2'))
    handler.clear(bag_key(key=b'k3', window=b'w2'))
    assert b'k3' not in backend.expiry.keys()

    assert backend.expire(watermark=101, allowed_lateness=0, is_pinned=lambda k: False) == [b'k1']
    assert handler.get_raw(bag_key(key=b'k1', window=b'w1')) == (b'', None)
    assert handler.get_raw(bag_key(key=b'k2', window=b'w1', transform_id='t2')) == (b'b', None)


def test_without_window_max_timestamp_the_index_stays_empty():
    handler = PartitionStateHandler()
    handler.append_raw(bag_key(), b'a')
    assert len(handler.state.expiry) == 0
    assert handler.state.expiry.candidates(1 << 62) == []


# Through Beam's own caching handler and runtime state ------------------------------------

def caching_handler(handler):
    return sdk_worker.GlobalCachingStateHandler(statecache.StateCache(0), handler)


def test_beam_bag_runtime_state_round_trip():
    handler = PartitionStateHandler()
    caching = caching_handler(handler)
    with caching.process_instruction_id('bundle-1', []):
        state = bundle_processor.SynchronousBagRuntimeState(
            caching, bag_key(key=coders.StrUtf8Coder().encode_nested('user')),
            coders.VarIntCoder())
        state.add(1)
        state.add(2)
        state.commit()
    with caching.process_instruction_id('bundle-2', []):
        state = bundle_processor.SynchronousBagRuntimeState(
            caching, bag_key(key=coders.StrUtf8Coder().encode_nested('user')),
            coders.VarIntCoder())
        assert list(state.read()) == [1, 2]
        state.add(3)
        state.commit()
        state = bundle_processor.SynchronousBagRuntimeState(
            caching, bag_key(key=coders.StrUtf8Coder().encode_nested('user')),
            coders.VarIntCoder())
        assert list(state.read()) == [1, 2, 3]
        state.clear()
        state.commit()
        assert list(bundle_processor.SynchronousBagRuntimeState(
            caching, bag_key(key=coders.StrUtf8Coder().encode_nested('user')),
            coders.VarIntCoder()).read()) == []


def test_beam_ordered_list_runtime_state_round_trip():
    handler = PartitionStateHandler()
    caching = caching_handler(handler)
    value_coder = coders.StrUtf8Coder()

    def runtime_state():
        return bundle_processor.SynchronousOrderedListRuntimeState(
            caching, ordered_key(), value_coder)

    with caching.process_instruction_id('bundle-1', []):
        state = runtime_state()
        for micros, value in [(30, 'c'), (10, 'a'), (20, 'b'), (-5, 'neg')]:
            state.add((Timestamp(micros=micros), value))
        state.commit()
    with caching.process_instruction_id('bundle-2', []):
        state = runtime_state()
        assert [(t.micros, v) for t, v in state.read()] == [
            (-5, 'neg'), (10, 'a'), (20, 'b'), (30, 'c')]
        assert [v for _, v in state.read_range(Timestamp(micros=10), Timestamp(micros=30))] == [
            'a', 'b']
        state.clear_range(Timestamp(micros=0), Timestamp(micros=25))
        state.add((Timestamp(micros=15), 'new'))
        state.commit()
    with caching.process_instruction_id('bundle-3', []):
        assert [(t.micros, v) for t, v in runtime_state().read()] == [
            (-5, 'neg'), (15, 'new'), (30, 'c')]
