"""Per-key state deltas of stateful operators over their keyed-state backend (no Spark).

Design section 8: every stateful operator keeps its state in the partition's
`KeyedStateBackend`, which hands out, each epoch, the keys changed since the last
one (`take_delta`) and rebuilds itself from the sum of those deltas (`restore`);
the worker builds the operators afresh every epoch over the restored backend.
The backend's own contract (values, windows, timers, holds, deltas, restores) is
`test_backend.py`'s. Checked here:

* user state cells written in place through Beam's state protocol
  (`PartitionStateHandler`: chunks appended to a list, entries to a sorted dict)
  with checkpoints at random points: a backend restored from the deltas so far
  serves the same state as the live one, and the deltas sum to its snapshot;
* `StreamingGroupByKeyOperator` (several windowings and triggers) and a
  stateful `FusedStageOperator` (bag and value state, event- and processing-time
  timers, key expiry) run in-process: random epochs go through one live operator
  over one backend and through a chain where every epoch builds a fresh operator
  over a fresh backend restored from the deltas so far; outputs, holds,
  watermarks, timers, sizes and deltas must be equal;
* the size of a delta follows the keys an epoch touches, not the state's size.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.state.backend import PICKLE_CODEC, KeyedStateBackend
from beam_streams_runner.state.state_handler import PartitionStateHandler
from beam_streams_runner.state.versioned_state import Revision
from beam_streams_runner.stores.local_directory import LocalDirectoryStore
from beam_streams_runner.translators.beam_trigger_panes import TRIGGER, TRIGGER_STATE_CODEC
from beam_streams_runner.translators.group_by_key import GroupingCoders
from beam_streams_runner.translators.streaming_group_by_key import StreamingGroupByKeyOperator
from beam_streams_runner.worker import partition_cache
from beam_streams_runner.worker.partition_cache import PartitionStateCache
from tests.state.test_backend import apply_delta, decoded, observe, plain_trigger_state

KEY_POOL = [b'', b'a', b'b', b'\xff']
BAG_CELLS = [('t1', 's1', b'w1'), ('t1', 's1', b'w2'), ('t2', 's1', b'w1')]
LIST_CELLS = [('t1', 'o1', b'w1'), ('t2', 'o1', b'w1')]
MAP_CELLS = [('t1', 'm1', b'w1'), ('t1', 'm2', b'w1')]
KEYS = st.sampled_from(KEY_POOL)
BAGS = st.sampled_from(BAG_CELLS)
LISTS = st.sampled_from(LIST_CELLS)
MAPS = st.sampled_from(MAP_CELLS)
MAP_KEYS = st.sampled_from([b'x', b'y'])
SORT_KEYS = st.integers(-5, 5)
TIMESTAMPS = st.integers(-10, 10)

StateKey = beam_fn_api_pb2.StateKey
ENTRY_CODER = coders.TupleCoder(
    [coders.VarIntCoder(), coders.LengthPrefixCoder(coders.BytesCoder())]).get_impl()
def decoded_delta(delta: tuple[dict, set]) -> tuple[dict, set]:
    dirty, deleted = delta
    return decoded(dirty), deleted


# Cells written in place ----------------------------------------------------------------

class CellDeltas(RuleBasedStateMachine):
    """State requests as the SDK harness sends them, over a tracked backend, with
    checkpoints; the next epoch sometimes runs on the restored backend."""

    def __init__(self):
        super().__init__()
        self.backend = KeyedStateBackend(track_changes=True)
        self.handler = PartitionStateHandler(self.backend)
        self.saved: dict[bytes, bytes] = {}

    @rule(key=KEYS, cell=BAGS, data=st.binary(max_size=2))
    def append(self, key, cell, data):
        self.handler.append_raw(bag_key(key, cell), data)

    @rule(key=KEYS, cell=BAGS)
    def clear(self, key, cell):
        self.handler.clear(bag_key(key, cell))

    @rule(key=KEYS, cell=LISTS, entries=st.lists(
        st.tuples(SORT_KEYS, st.binary(max_size=2)), min_size=1, max_size=3))
    def ordered_add(self, key, cell, entries):
        self.handler.append_raw(ordered_key(key, cell), ENTRY_CODER.encode_all(entries))

    @rule(key=KEYS, cell=LISTS, start=SORT_KEYS, end=SORT_KEYS)
    def ordered_clear(self, key, cell, start, end):
        self.handler.clear(ordered_key(key, cell, start, end))

    @rule(key=KEYS, cell=MAPS, map_key=MAP_KEYS, data=st.binary(max_size=2))
    def map_put(self, key, cell, map_key, data):
        self.handler.append_raw(map_key_of(key, cell, map_key), data)

    @rule(key=KEYS, cell=MAPS, map_key=st.none() | MAP_KEYS)
    def map_clear(self, key, cell, map_key):
        if map_key is None:  # the whole map
            self.handler.clear(map_keys_of(key, cell))
        else:
            self.handler.clear(map_key_of(key, cell, map_key))

    @rule(key=KEYS, window_end=TIMESTAMPS)
    def add_window(self, key, window_end):
        self.backend.add_window(key, window_end)

    @rule(watermark=TIMESTAMPS, pinned=st.sets(KEYS))
    def expire(self, watermark, pinned):
        self.backend.expire(watermark, 2, pinned.__contains__)

    @rule()
    def checkpoint(self):
        apply_delta(self.saved, self.backend.take_delta())
        assert decoded(self.saved) == decoded(self.backend.snapshot())
        restored = KeyedStateBackend()
        restored.restore(self.saved)
        assert observe(restored) == observe(self.backend)
        # And every cell reads alike through the protocol.
        handler = PartitionStateHandler(restored)
        requests = [state_key for key in KEY_POOL for state_key in (
            *(bag_key(key, cell) for cell in BAG_CELLS),
            *(ordered_key(key, cell, -10, 10) for cell in LIST_CELLS),
            *(map_keys_of(key, cell) for cell in MAP_CELLS),
            *(map_key_of(key, cell, b'x') for cell in MAP_CELLS))]
        for state_key in requests:
            assert handler.get_raw(state_key) == self.handler.get_raw(state_key)

    @precondition(lambda self: self.saved)
    @rule()
    def continue_on_the_restored_backend(self):
        self.checkpoint()
        self.backend = KeyedStateBackend(track_changes=True)
        self.backend.restore(self.saved)
        self.handler = PartitionStateHandler(self.backend)


CellDeltas.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestCellDeltas = CellDeltas.TestCase


def bag_key(key: bytes, cell: tuple) -> StateKey:
    return StateKey(bag_user_state=StateKey.BagUserState(
        transform_id=cell[0], user_state_id=cell[1], window=cell[2], key=key))


def ordered_key(key: bytes, cell: tuple, start: int | None = None,
                end: int | None = None) -> StateKey:
    state_key = StateKey(ordered_list_user_state=StateKey.OrderedListUserState(
        transform_id=cell[0], user_state_id=cell[1], window=cell[2], key=key))
    if start is not None:
        state_key.ordered_list_user_state.range.start = start
        state_key.ordered_list_user_state.range.end = end
    return state_key


def map_key_of(key: bytes, cell: tuple, map_key: bytes) -> StateKey:
    return StateKey(multimap_user_state=StateKey.MultimapUserState(
        transform_id=cell[0], user_state_id=cell[1], window=cell[2], key=key,
        map_key=map_key))


def map_keys_of(key: bytes, cell: tuple) -> StateKey:
    return StateKey(multimap_keys_user_state=StateKey.MultimapKeysUserState(
        transform_id=cell[0], user_state_id=cell[1], window=cell[2], key=key))


def test_the_backend_tracks_nothing_until_asked():
    backend = KeyedStateBackend()
    backend.put(b'k', ('t', 's', b'w'), [b'x'])
    with pytest.raises(RuntimeError, match='track_changes'):
        backend.take_delta()
    backend.restore(backend.snapshot())  # a restored backend tracks from there
    assert backend.take_delta() == ({b'm': backend.snapshot()[b'm']}, set())
    backend.add_window(b'k', 5)
    assert set(backend.take_delta()[0]) == {b'kk', b'm'}
    backend.add_window(b'k', 5)  # already known: no change
    backend.delete(b'k', ('t', 's', b'other'))  # nothing to delete: no change
    backend.set_hold(b'k', None)  # no hold to release: no change
    backend.event_timers.clear((b'k', 'absent'))
    assert set(backend.take_delta()[0]) == {b'm'}


# Operators: one live, one restored every epoch ----------------------------------------

def replay(make: Callable[[KeyedStateBackend], object],
           new_backend: Callable[[], KeyedStateBackend], run_epoch: Callable, epochs: list,
           plain: Callable = lambda value: value) -> list[dict[bytes, bytes]]:
    """Runs `epochs` through one live operator over one backend and, each epoch, through
    a fresh operator over a fresh backend restored from the deltas so far; both must
    agree: what `run_epoch` returns, their deltas, and what their backends hold (values
    compared as `plain` gives them). Returns the state after each epoch."""
    live_backend = new_backend()
    live = make(live_backend)
    state: dict[bytes, bytes] = {}
    states = []
    for number, epoch in enumerate(epochs):
        backend = new_backend()
        backend.restore(dict(state))
        restored = make(backend)
        assert run_epoch(restored, epoch) == run_epoch(live, epoch), f'epoch {number}'
        delta = live_backend.take_delta()
        assert decoded_delta(backend.take_delta()) == decoded_delta(delta), f'epoch {number}'
        assert observe(backend, plain) == observe(live_backend, plain), f'epoch {number}'
        apply_delta(state, delta)
        assert decoded(state) == decoded(live_backend.snapshot()), f'epoch {number}'
        states.append(dict(state))
    return states


def seconds(t: float) -> int:
    return Timestamp(t).micros


EPOCHS = st.lists(
    st.tuples(
        st.lists(st.tuples(st.sampled_from('abcde'), st.integers(0, 9), st.integers(0, 60)),
                 max_size=6),
        st.integers(0, 8),  # watermark advance, seconds
        st.integers(0, 4),  # processing time advance, seconds
    ),
    min_size=1, max_size=10)


def as_epochs(steps) -> list:
    watermark, now, epochs = 0, 0, []
    for elements, advance, tick in steps:
        watermark += advance
        now += tick
        epochs.append((elements, seconds(watermark), seconds(now)))
    last_now = seconds(now + 100)
    epochs.append(([], MAX_WATERMARK, last_now))
    return epochs


# StreamingGroupByKeyOperator -----------------------------------------------------------

WINDOWINGS = {
    'fixed': Windowing(window.FixedWindows(10)),
    'sliding-earliest-late': Windowing(
        window.SlidingWindows(10, 5), triggerfn=trigger.DefaultTrigger(),
        accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
        timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST, allowed_lateness=5),
    'sessions-early-late': Windowing(
        window.Sessions(5),
        triggerfn=trigger.AfterWatermark(early=trigger.AfterCount(1),
                                         late=trigger.AfterCount(1)),
        accumulation_mode=trigger.AccumulationMode.ACCUMULATING, allowed_lateness=20),
    'sliding-processing-time': Windowing(
        window.SlidingWindows(10, 5),
        triggerfn=trigger.AfterWatermark(early=trigger.AfterProcessingTime(3)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING, allowed_lateness=5),
    'global-repeated': Windowing(
        window.GlobalWindows(),
        triggerfn=trigger.Repeatedly(trigger.AfterProcessingTime(5)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING),
}


def grouping_backend() -> KeyedStateBackend:
    return KeyedStateBackend(TRIGGER_STATE_CODEC, track_changes=True)


def grouping_operator(windowing: Windowing):
    window_coder = windowing.windowfn.get_window_coder()
    grouping_coders = GroupingCoders(
        input=coders.WindowedValueCoder(coders.TupleCoder(
            [coders.StrUtf8Coder(), coders.VarIntCoder()]), window_coder).get_impl(),
        output=coders.WindowedValueCoder(coders.TupleCoder(
            [coders.StrUtf8Coder(), coders.IterableCoder(coders.VarIntCoder())]),
            window_coder).get_impl(),
        key=coders.StrUtf8Coder().get_impl(),
        value=coders.VarIntCoder().get_impl())

    def make(state: KeyedStateBackend) -> StreamingGroupByKeyOperator:
        return StreamingGroupByKeyOperator(grouping_coders, windowing, 'out', 100, state)
    return make


def grouping_input(windowing: Windowing, elements) -> bytes:
    coder = coders.WindowedValueCoder(
        coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()]),
        windowing.windowfn.get_window_coder()).get_impl()
    out = []
    for key, value, t in elements:
        windows = windowing.windowfn.assign(
            window.WindowFn.AssignContext(Timestamp(t), element=(key, value)))
        out.append(coder.encode_nested(WindowedValue((key, value), Timestamp(t), windows)))
    return b''.join(out)


def run_grouping_epoch(windowing: Windowing):
    """An epoch as a partition runs it: the bundle, then the watermark and clock."""
    def run(op: StreamingGroupByKeyOperator, epoch):
        elements, watermark, now = epoch
        out = []
        if elements:
            out += op.process_bundle([('input', grouping_input(windowing, elements))])
        out += op.advance(watermark, now)
        return out, op.hold(), op.next_processing_time(), op.sizes()
    return run


@pytest.mark.parametrize('name', sorted(WINDOWINGS))
@settings(max_examples=25, deadline=None)
@given(steps=EPOCHS)
def test_grouping_restored_every_epoch_equals_the_live_one(name, steps):
    windowing = WINDOWINGS[name]
    replay(grouping_operator(windowing), grouping_backend, run_grouping_epoch(windowing),
           as_epochs(steps), plain_trigger_state)


def test_grouping_delta_size_follows_the_keys_touched():
    windowing = WINDOWINGS['sessions-early-late']
    live = grouping_operator(windowing)(backend := grouping_backend())
    run = run_grouping_epoch(windowing)
    run(live, ([(f'key-{i}', i % 7, 1) for i in range(5000)], seconds(0), seconds(0)))
    first = delta_size(backend.take_delta())
    sizes = []
    for epoch in range(1, 6):
        run(live, ([(f'key-{epoch * 11 + i}', 1, 2) for i in range(10)], seconds(0),
                   seconds(epoch)))
        delta = backend.take_delta()
        assert len(delta[0]) == 11  # the keys, and the partition's watermark and clock
        sizes.append(delta_size(delta))
    assert max(sizes) * 100 < first, (first, sizes)


def delta_size(delta: tuple[dict, set]) -> int:
    dirty, deleted = delta
    return sum(len(k) + len(v) for k, v in dirty.items()) + sum(map(len, deleted))


def test_grouping_key_state_of_types_only_cloudpickle_carries():
    class Local:  # pickle cannot find a local class by name
        def __init__(self, n):
            self.n = n

        def __eq__(self, other):
            return isinstance(other, Local) and other.n == self.n

    state = trigger.InMemoryUnmergedState()
    state.add_state(window.GlobalWindow(), trigger._ListStateTag('values'), Local(3))
    state.set_timer(window.GlobalWindow(), 'end', TimeDomain.WATERMARK, Timestamp(5))
    (namespace, (key, restored)), = TRIGGER_STATE_CODEC.decode(
        TRIGGER_STATE_CODEC.encode([(TRIGGER, (Local(1), state))]))
    assert namespace == TRIGGER and key == Local(1)
    assert restored.state[window.GlobalWindow()]['values'] == [Local(3)]
    assert restored.timers == state.timers
    # And through a backend's delta into a restored one.
    backend = grouping_backend()
    backend.put(b'k', TRIGGER, (Local(1), state))
    again = grouping_backend()
    again.restore(backend.take_delta()[0])
    key, restored = again.get(b'k', TRIGGER)
    assert key == Local(1) and restored.timers == state.timers


# FusedStageOperator ------------------------------------------------------------------

class _CountPerKey(beam.DoFn):
    """Bag and value state, an event-time flush per window, a processing-time tick.

    Only even values change the total and only the first element of a window (since
    its last flush) sets the flush: an odd value's epoch may hold its key in the
    delta only because a bag was appended to in place."""

    SEEN = userstate.BagStateSpec('seen', coders.VarIntCoder())
    TOTAL = userstate.ReadModifyWriteStateSpec('total', coders.VarIntCoder())
    FLUSH = userstate.TimerSpec('flush', TimeDomain.WATERMARK)
    TICK = userstate.TimerSpec('tick', TimeDomain.REAL_TIME)

    def process(self, element, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam,
                seen=beam.DoFn.StateParam(SEEN), total=beam.DoFn.StateParam(TOTAL),
                flush=beam.DoFn.TimerParam(FLUSH), tick=beam.DoFn.TimerParam(TICK)):
        first = next(iter(seen.read()), None) is None
        seen.add(element[1])
        if element[1] % 2 == 0:
            total.write((total.read() or 0) + element[1])
        if first:
            flush.set(w.max_timestamp())
        if element[1] % 3 == 0:
            tick.set(ts + 30)
        elif element[1] % 3 == 1:
            tick.clear()

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, seen=beam.DoFn.StateParam(SEEN),
                 total=beam.DoFn.StateParam(TOTAL)):
        yield key, ('flush', sorted(seen.read()), total.read())
        seen.clear()

    @userstate.on_timer(TICK)
    def on_tick(self, key=beam.DoFn.KeyParam, total=beam.DoFn.StateParam(TOTAL),
                tick=beam.DoFn.TimerParam(TICK), ts=beam.DoFn.TimestampParam):
        count = total.read() or 0
        yield key, ('tick', count)
        if count % 4 == 2:  # once: a timer setting itself forever would never let time end
            total.write(count + 1)
            tick.set(ts + 7)


@pytest.fixture(scope='module')
def fused_stage(stateful_stage):
    """(make operator over a backend, encode elements) for the stateful stage of a
    small pipeline."""
    p = beam.Pipeline(options=PipelineOptions(['--streaming']))
    _ = (p | beam.Impulse()
         | beam.Map(lambda _: ('k', 0)).with_output_types(tuple[str, int])
         | beam.WindowInto(window.FixedWindows(10), allowed_lateness=5)
         | beam.ParDo(_CountPerKey()) | beam.Reshuffle())
    return stateful_stage(p)


def fused_backend() -> KeyedStateBackend:
    return KeyedStateBackend(PICKLE_CODEC, track_changes=True)


def checkpointed(cell) -> bytes:
    """A user state cell as a checkpoint holds it, its chunks joined (a cell the DoFn
    used this epoch is decoded, one restored and not used is still encoded)."""
    return b''.join(pickle.loads(pickle.dumps(cell)))


def run_fused_epoch(encode):
    """An epoch as a partition runs it: the bundles, the watermark and clock, the end."""
    def run(op, epoch):
        elements, watermark, now = epoch
        out = []
        for record in encode(elements):
            out += op.process_bundle([record])
        out += op.advance(watermark, now)
        out += op.finish_task()
        return out, op.hold(), op.next_processing_time(), op.sizes()
    return run


@settings(max_examples=25, deadline=None)
@given(steps=EPOCHS)
def test_stateful_stage_restored_every_epoch_equals_the_live_one(fused_stage, steps):
    make, encode = fused_stage
    replay(make, fused_backend, run_fused_epoch(encode), as_epochs(steps), checkpointed)


def test_stateful_stage_keys_expire_from_the_state(fused_stage):
    make, encode = fused_stage
    states = replay(make, fused_backend, run_fused_epoch(encode), [
        ([('a', 6, 1), ('b', 4, 2)], seconds(0), seconds(0)),
        ([('a', 3, 12)], seconds(5), seconds(40)),
        ([], seconds(100), seconds(40)),
        ([], MAX_WATERMARK, seconds(200)),
    ], checkpointed)
    # One value per key (b'k' + the encoded user key), and the partition's b'm'.
    assert sorted(states[0]) == [b'k\x01a', b'k\x01b', b'm']
    (windows, hold, event, processing), cells = decoded(states[0])[b'k\x01a']
    assert windows == [seconds(10) - 1] and hold is None
    assert len(event) == 1 and len(processing) == 1  # the flush, the tick
    assert {cell[1] for cell, _ in cells} == {'seen', 'total'}
    (_, _, event, processing), _ = decoded(states[0])[b'k\x01b']
    assert len(event) == 1 and processing == []  # 4 % 3 == 1 cleared the tick
    assert states[-1].keys() == {b'm'}


@pytest.mark.parametrize('live_state', ['process', 'host'])
def test_stateful_stage_across_workers_through_the_cache(fused_stage, tmp_path, monkeypatch,
                                                          live_state):
    """Many keys touched few at a time, each epoch in one of two workers at random (a
    fresh operator over the backend the worker's cache loads): the outputs equal one
    live operator's, and each delta holds the keys touched. With the host's live
    states the other worker reads the host's copy, values on first use, never the
    checkpoint store; with copies in each worker's memory it catches up from the store."""
    monkeypatch.setenv(partition_cache.LIVE_STATE_ENV, live_state)
    monkeypatch.setattr(partition_cache, 'host_state_root', lambda: str(tmp_path / 'host'))
    make, encode = fused_stage
    run = run_fused_epoch(encode)
    rng = random.Random(5)
    workers: list[dict] = [{}, {}]
    store = LocalDirectoryStore(str(tmp_path / 'store'))
    name = 'stage-1/partition-0'
    epochs = [([(f'key-{i}', i % 5, i % 9) for i in range(2000)], seconds(0), seconds(0))]
    for number in range(1, 9):
        touched = [(f'key-{rng.randrange(2000)}', rng.randrange(10), 9) for _ in range(10)]
        epochs.append((touched, seconds(0), seconds(number)))
    live = make(fused_backend())
    sizes = []
    for number, epoch in enumerate(epochs):
        monkeypatch.setattr(PartitionStateCache, '_caches', rng.choice(workers))
        parent = Revision(number - 1, 0)
        backend = PartitionStateCache.load(store, 'run', name, parent, fused_backend)
        assert run(make(backend), epoch) == run(live, epoch), f'epoch {number}'
        sizes.append(PartitionStateCache.commit(store, 'run', name, Revision(number, 0), parent,
                                                backend))
    loads = [cache.stats for worker in workers for cache in worker.values()]
    assert len(loads) == 2 and all(stats['hit'] for stats in loads)
    from_store = sum(stats['catch-up'] + stats['snapshot'] for stats in loads)
    assert (from_store > 0) == (live_state == 'process'), loads
    # Epoch 0 wrote 2000 keys' state and timers; later ones about 10 keys' worth.
    print(f'\ndelta bytes per epoch (2000 keys, then 10 touched per epoch): {sizes}')
    assert max(sizes[1:]) * 50 < sizes[0], sizes
