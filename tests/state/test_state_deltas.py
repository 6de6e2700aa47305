"""Per-key state deltas of the stateful structures and operators (no Spark).

Design section 8: a stateful operator partition hands out, each epoch, the keys
it changed (`state_delta`) and rebuilds itself from the sum of those deltas
(`restore_state`). Checked here:

* `KeyedStateStore` and `TimerQueue`: random operations with checkpoints; a
  store or queue rebuilt from the deltas so far equals the live one, ordered
  indexes and arrival numbers included;
* `StreamingGroupByKeyOperator` (several windowings and triggers) and a
  stateful `FusedStageOperator` (bag and value state, event- and processing-time
  timers, key expiry) run in-process: random epochs go through one live operator
  and through a chain where every epoch runs on a fresh operator restored from
  the deltas; outputs, watermarks, timers and deltas must be equal;
* the size of a delta follows the keys an epoch touches, not the state's size.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable, Mapping

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.state.keyed_state import KeyedStateStore
from beam_streams_runner.state.timers import TimerQueue
from beam_streams_runner.translators.group_by_key import (
    StreamingGroupByKeyOperator,
    _decode_key_state,
    _encode_key_state,
    _entry_body,
    _entry_header,
)
from beam_streams_runner.translators.par_do import FusedStageOperator
from beam_streams_runner.worker.partition_cache import PartitionOperatorCache

KEYS = st.sampled_from([b'', b'a', b'b', b'\xff'])
CELLS = st.sampled_from([('t1', 's1', b'w1'), ('t1', 's1', b'w2'), ('t2', 's1', b'w1')])
SORT_KEYS = st.integers(-5, 5)
TIMESTAMPS = st.integers(-10, 10)


def apply_delta(state: dict[bytes, bytes], delta: tuple[dict, set]) -> None:
    dirty, deleted = delta
    state.update(dirty)
    for key in deleted:
        state.pop(key, None)


# KeyedStateStore ---------------------------------------------------------------------

def store_delta(store: KeyedStateStore) -> tuple[dict, set]:
    dirty, deleted = {}, set()
    for key in store.take_changed():
        value = store.encode_key(key)
        if value is None:
            deleted.add(key)
        else:
            dirty[key] = value
    return dirty, deleted


def restored_store(state: Mapping[bytes, bytes]) -> KeyedStateStore:
    store = KeyedStateStore()
    for key, value in state.items():
        store.restore_key(key, value)
    store.track_changes()
    return store


def assert_same_store(store: KeyedStateStore, other: KeyedStateStore) -> None:
    assert store._cells == other._cells
    assert store._ordered == other._ordered
    assert store.index._windows_by_key == other.index._windows_by_key
    assert list(store.index._order) == list(other.index._order)


class KeyedStateDeltas(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.store = KeyedStateStore()
        self.store.track_changes()
        self.saved: dict[bytes, bytes] = {}

    @rule(key=KEYS, cell=CELLS, data=st.binary(max_size=2))
    def append(self, key, cell, data):
        self.store.append(key, cell, data)

    @rule(key=KEYS, cell=CELLS)
    def clear(self, key, cell):
        self.store.clear(key, cell)

    @rule(key=KEYS, cell=CELLS, sort_key=SORT_KEYS, data=st.binary(max_size=2))
    def ordered_add(self, key, cell, sort_key, data):
        self.store.ordered_add(key, cell, sort_key, data)

    @rule(key=KEYS, cell=CELLS, start=SORT_KEYS, end=SORT_KEYS)
    def ordered_clear(self, key, cell, start, end):
        self.store.ordered_clear(key, cell, start, end)

    @rule(key=KEYS, window=TIMESTAMPS)
    def add_window(self, key, window):
        self.store.index.add_window(key, window)

    @rule(watermark=TIMESTAMPS, pinned=st.sets(KEYS))
    def expire(self, watermark, pinned):
        self.store.expire(watermark, 2, pinned.__contains__)

    @rule()
    def checkpoint(self):
        apply_delta(self.saved, store_delta(self.store))
        assert_same_store(self.store, restored_store(self.saved))

    @invariant()
    def an_untaken_delta_completes_the_saved_state(self):
        saved = dict(self.saved)
        changed = set(self.store._changed)
        apply_delta(saved, store_delta(self.store))
        self.store._changed |= changed  # put the record back
        assert_same_store(self.store, restored_store(saved))


KeyedStateDeltas.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None)
TestKeyedStateDeltas = KeyedStateDeltas.TestCase


def test_keyed_state_tracks_nothing_until_asked():
    store = KeyedStateStore()
    store.append(b'k', ('t', 's', b'w'), b'x')
    with pytest.raises(RuntimeError, match='track_changes'):
        store.take_changed()
    store.track_changes()
    assert store.take_changed() == set()
    store.index.add_window(b'k', 5)
    assert store.take_changed() == {b'k'}
    store.index.add_window(b'k', 5)  # already known: no change
    store.clear(b'k', ('t', 's', b'other'))  # nothing to clear: no change
    assert store.take_changed() == set()


# TimerQueue --------------------------------------------------------------------------

def queue_delta(queue: TimerQueue) -> tuple[dict, set]:
    dirty, deleted = {}, set()
    for key in queue.take_changed():
        timers = queue.timers_of(key)
        if timers:
            dirty[key] = pickle.dumps([(seq, tuple(t)) for seq, t in timers])
        else:
            deleted.add(key)
    dirty[b'next'] = pickle.dumps(queue.next_seq)
    return dirty, deleted


def restored_queue(state: Mapping) -> TimerQueue:
    queue = TimerQueue()
    queue.restore([timer for key, value in state.items() if key != b'next'
                   for timer in pickle.loads(value)])
    queue.next_seq = pickle.loads(state[b'next']) if b'next' in state else 0
    queue.track_changes()
    return queue


def assert_same_queue(queue: TimerQueue, other: TimerQueue) -> None:
    assert queue._by_id == other._by_id
    assert list(queue._by_time) == list(other._by_time)
    assert list(queue._holds) == list(other._holds)
    assert queue._ids_by_key == other._ids_by_key
    assert queue.next_seq == other.next_seq


class TimerQueueDeltas(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.queue = TimerQueue()
        self.queue.track_changes()
        self.saved: dict = {}

    @rule(key=KEYS, name=st.sampled_from(['t1', 't2']), fire=TIMESTAMPS,
          hold=st.none() | TIMESTAMPS, payload=st.integers(0, 3))
    def set_timer(self, key, name, fire, hold, payload):
        self.queue.set((key, name), fire, payload, hold)

    @rule(key=KEYS, name=st.sampled_from(['t1', 't2']))
    def clear_timer(self, key, name):
        self.queue.clear((key, name))

    @rule(up_to=TIMESTAMPS)
    def pop_due(self, up_to):
        self.queue.pop_due(up_to)

    @rule()
    def checkpoint(self):
        apply_delta(self.saved, queue_delta(self.queue))
        restored = restored_queue(self.saved)
        assert_same_queue(self.queue, restored)
        # And both fire alike from here, arrival numbers included.
        for queue in (self.queue, restored):
            queue.set((b'a', 'later'), 3)
        assert self.queue.pop_due(10) == restored.pop_due(10)
        assert_same_queue(self.queue, restored)
        apply_delta(self.saved, queue_delta(self.queue))


TimerQueueDeltas.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None)
TestTimerQueueDeltas = TimerQueueDeltas.TestCase


# Operators: one live, one restored every epoch ----------------------------------------

def replay(make: Callable, run_epoch: Callable, epochs: list,
           decode: Callable = lambda name, value: pickle.loads(value)
           ) -> list[dict[bytes, bytes]]:
    """Runs `epochs` through one live operator and, each epoch, through a fresh one
    restored from the deltas so far; both must agree (their deltas compared as
    `decode(name, value)` gives them). Returns the state per epoch."""
    live = make()
    live.restore_state({})
    state: dict[bytes, bytes] = {}
    states = []
    for number, epoch in enumerate(epochs):
        restored = make()
        restored.restore_state(dict(state))
        assert run_epoch(restored, epoch) == run_epoch(live, epoch), f'epoch {number}'
        delta = live.state_delta()
        restored_delta = restored.state_delta()
        assert decoded(delta, decode) == decoded(restored_delta, decode), f'epoch {number}'
        apply_delta(state, delta)
        states.append(dict(state))
    return states


def decoded(delta: tuple[dict, set], decode: Callable) -> tuple[dict, set]:
    dirty, deleted = delta
    return {name: decode(name, value) for name, value in dirty.items()}, deleted


def grouping_value(name: bytes, value: bytes):
    """A GroupByKey state value: a key's index header and trigger state, or b'm'."""
    if name[:1] == b'k':
        return _entry_header(value), pickle.loads(_entry_body(value))
    return pickle.loads(value)


def seconds(t: float) -> int:
    return Timestamp(t).micros


# StreamingGroupByKeyOperator -----------------------------------------------------------

WINDOWINGS = {
    'fixed': Windowing(window.FixedWindows(10)),
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


def grouping_operator(windowing: Windowing) -> StreamingGroupByKeyOperator:
    window_coder = windowing.windowfn.get_window_coder()
    return StreamingGroupByKeyOperator(
        coders.WindowedValueCoder(coders.TupleCoder(
            [coders.StrUtf8Coder(), coders.VarIntCoder()]), window_coder).get_impl(),
        coders.WindowedValueCoder(coders.TupleCoder(
            [coders.StrUtf8Coder(), coders.IterableCoder(coders.VarIntCoder())]),
            window_coder).get_impl(),
        coders.StrUtf8Coder().get_impl(), windowing, 'out', 100,
        value_coder_impl=coders.VarIntCoder().get_impl())


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
    def run(op: StreamingGroupByKeyOperator, epoch):
        elements, watermark, now = epoch
        op.clock.micros = max(op.clock.micros, now)
        out = []
        if elements:
            out += op.process_bundle([('input', grouping_input(windowing, elements))])
        out += op.on_watermark('input', watermark)
        out += op.on_processing_time(now)
        return out, op.output_watermark(), op.next_processing_time(), len(op)
    return run


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


@pytest.mark.parametrize('name', sorted(WINDOWINGS))
@settings(max_examples=25, deadline=None)
@given(steps=EPOCHS)
def test_grouping_restored_every_epoch_equals_the_live_one(name, steps):
    windowing = WINDOWINGS[name]
    replay(lambda: grouping_operator(windowing), run_grouping_epoch(windowing),
           as_epochs(steps), grouping_value)


def test_grouping_delta_size_follows_the_keys_touched():
    windowing = WINDOWINGS['sessions-early-late']
    live = grouping_operator(windowing)
    live.restore_state({})
    run = run_grouping_epoch(windowing)
    run(live, ([(f'key-{i}', i % 7, 1) for i in range(5000)], seconds(0), seconds(0)))
    first = delta_size(live.state_delta())
    sizes = []
    for epoch in range(1, 6):
        run(live, ([(f'key-{epoch * 11 + i}', 1, 2) for i in range(10)], seconds(0),
                   seconds(epoch)))
        delta = live.state_delta()
        assert len(delta[0]) == 11  # the keys, and the watermark and clock
        sizes.append(delta_size(delta))
    assert max(sizes) * 100 < first, (first, sizes)


def delta_size(delta: tuple[dict, set]) -> int:
    dirty, deleted = delta
    return sum(len(k) + len(v) for k, v in dirty.items()) + sum(map(len, deleted))


# FusedStageOperator ------------------------------------------------------------------

class _CountPerKey(beam.DoFn):
    """Bag and value state, an event-time flush per window, a processing-time tick."""

    SEEN = userstate.BagStateSpec('seen', coders.VarIntCoder())
    TOTAL = userstate.ReadModifyWriteStateSpec('total', coders.VarIntCoder())
    FLUSH = userstate.TimerSpec('flush', TimeDomain.WATERMARK)
    TICK = userstate.TimerSpec('tick', TimeDomain.REAL_TIME)

    def process(self, element, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam,
                seen=beam.DoFn.StateParam(SEEN), total=beam.DoFn.StateParam(TOTAL),
                flush=beam.DoFn.TimerParam(FLUSH), tick=beam.DoFn.TimerParam(TICK)):
        seen.add(element[1])
        total.write((total.read() or 0) + element[1])
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
        if count % 2:  # once: a timer setting itself forever would never let time end
            total.write(count + 1)
            tick.set(ts + 7)


@pytest.fixture(scope='module')
def fused_stage(stateful_stage):
    """(make operator, encode elements) for the stateful stage of a small pipeline."""
    p = beam.Pipeline(options=PipelineOptions(['--streaming']))
    _ = (p | beam.Impulse()
         | beam.Map(lambda _: ('k', 0)).with_output_types(tuple[str, int])
         | beam.WindowInto(window.FixedWindows(10), allowed_lateness=5)
         | beam.ParDo(_CountPerKey()) | beam.Reshuffle())
    return stateful_stage(p)


def run_fused_epoch(encode):
    def run(op: FusedStageOperator, epoch):
        elements, watermark, now = epoch
        out = []
        for record in encode(elements):
            out += op.process_bundle([record])
        out += op.on_watermark('input', watermark)
        out += op.on_processing_time(now)
        return (out, op.output_watermark(), op.next_processing_time(), len(op.keyed_state),
                len(op.event_timers), len(op.processing_timers))
    return run


@settings(max_examples=25, deadline=None)
@given(steps=EPOCHS)
def test_stateful_stage_restored_every_epoch_equals_the_live_one(fused_stage, steps):
    make, encode = fused_stage
    replay(make, run_fused_epoch(encode), as_epochs(steps))


def test_stateful_stage_keys_expire_from_the_state(fused_stage):
    make, encode = fused_stage
    states = replay(make, run_fused_epoch(encode), [
        ([('a', 3, 1), ('b', 4, 2)], seconds(0), seconds(0)),
        ([('a', 6, 12)], seconds(5), seconds(40)),
        ([], seconds(100), seconds(40)),
        ([], MAX_WATERMARK, seconds(200)),
    ])
    assert sorted(states[0]) == [b'e\x01a', b'e\x01b', b'k\x01a', b'k\x01b', b'm', b'p\x01a']
    assert states[-1].keys() == {b'm'}


def test_stateful_stage_across_workers_through_the_cache(fused_stage, tmp_path, monkeypatch):
    """Many keys touched few at a time, each epoch in one of two workers at random:
    the outputs equal one live operator's, and each delta holds the keys touched."""
    make, encode = fused_stage
    run = run_fused_epoch(encode)
    rng = random.Random(5)
    workers: list[dict] = [{}, {}]
    state_dir = str(tmp_path)
    name = 'stage-1/partition-0'
    epochs = [([(f'key-{i}', i % 5, i % 9) for i in range(2000)], seconds(0), seconds(0))]
    for number in range(1, 9):
        touched = [(f'key-{rng.randrange(2000)}', rng.randrange(10), 9) for _ in range(10)]
        epochs.append((touched, seconds(0), seconds(number)))
    live = make()
    live.restore_state({})
    sizes = []
    for number, epoch in enumerate(epochs):
        monkeypatch.setattr(PartitionOperatorCache, '_caches', rng.choice(workers))
        operator = PartitionOperatorCache.load(state_dir, name, number - 1, make)
        assert run(operator, epoch) == run(live, epoch)
        PartitionOperatorCache.commit(state_dir, name, number, operator)
        store = PartitionOperatorCache.cache(state_dir).store
        sizes.append(len(store.get_chunked(name, b'd' + number.to_bytes(8, 'big'))))
    # Epoch 0 wrote 2000 keys' state and timers; later ones about 10 keys' worth.
    print(f'\ndelta bytes per epoch (2000 keys, then 10 touched per epoch): {sizes}')
    assert max(sizes[1:]) * 50 < sizes[0], sizes


def test_grouping_key_state_of_types_only_cloudpickle_carries():
    class Local:  # pickle cannot find a local class by name
        def __init__(self, n):
            self.n = n

        def __eq__(self, other):
            return isinstance(other, Local) and other.n == self.n

    state = trigger.InMemoryUnmergedState()
    state.add_state(window.GlobalWindow(), trigger._ListStateTag('values'), Local(3))
    state.set_timer(window.GlobalWindow(), 'end', TimeDomain.WATERMARK, Timestamp(5))
    key, restored = _decode_key_state(_encode_key_state(Local(1), state))
    assert key == Local(1)
    assert restored.state[window.GlobalWindow()]['values'] == [Local(3)]
    assert restored.timers == state.timers
