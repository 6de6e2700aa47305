"""A stateful fused stage's own state machinery, in process (no Spark).

* `TimerReader` splits a stream of timers in Beam's encoding into the parts the
  timer queues keep (encoded key, encoded tag and windows, firing and hold
  micros, the timer's encoding) exactly as Beam's `TimerCoderImpl` reads them;
* `CheapCombiningStateContext` gives every combining state a fresh CombineFn by
  unpickling, and falls back to Beam's deep copy when pickle cannot do it;
* a `FusedStageOperator` over a restored `KeyedStateBackend` is lazy (untouched
  keys stay encoded, no timer is decoded) and a stage built afresh over a backend
  restored every epoch behaves as a live one, with combining state, event-time
  timers at the window end and dynamic timers.
"""

from __future__ import annotations

import copy
import pickle
import random

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms import combiners, userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.state.beam_timers import TimerReader
from beam_streams_runner.state.beam_user_state import (
    CheapCombiningStateContext,
    _pickled_or_none,
)
from beam_streams_runner.translators.par_do import FusedStageOperator
from tests.state.test_backend import decoded

# TimerReader --------------------------------------------------------------------------

KEY_CODERS = {
    'varint': (coders.VarIntCoder(), st.integers(-2**63, 2**63 - 1)),
    'str': (coders.StrUtf8Coder(), st.text(max_size=5)),
    'bytes': (coders.BytesCoder(), st.binary(max_size=5)),
    'tuple': (coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()]),
              st.tuples(st.text(max_size=3), st.integers(-5, 5))),
}
MILLIS = st.one_of(
    st.integers(-10**9, 10**9),
    st.sampled_from([MIN_TIMESTAMP.micros // 1000, MAX_TIMESTAMP.micros // 1000, 0, -1]))
PANES = st.sampled_from([
    PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0),
    PaneInfo(True, False, PaneInfoTiming.EARLY, 0, -1),
    PaneInfo(False, False, PaneInfoTiming.EARLY, 3, -1),
    PaneInfo(False, True, PaneInfoTiming.ON_TIME, 4, 4),
    PaneInfo(False, False, PaneInfoTiming.LATE, 7, 2),
])
INTERVAL_WINDOWS = st.builds(
    lambda start, size: window.IntervalWindow(Timestamp(micros=start * 1000),
                                              Timestamp(micros=(start + size) * 1000)),
    st.integers(-10**6, 10**6), st.integers(1, 10**6))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), key_coder=st.sampled_from(sorted(KEY_CODERS)),
       global_windows=st.booleans())
def test_timer_reader_splits_timers_as_beam_reads_them(data, key_coder, global_windows):
    key_coder, keys = KEY_CODERS[key_coder]
    window_coder = (coders.GlobalWindowCoder() if global_windows
                    else coders.IntervalWindowCoder())
    windows = (st.just((window.GlobalWindow(),)) if global_windows
               else st.lists(INTERVAL_WINDOWS, min_size=1, max_size=2).map(tuple))
    timers = data.draw(st.lists(st.builds(
        lambda key, tag, ws, clear, fire, hold, pane: userstate.Timer(
            user_key=key, dynamic_timer_tag=tag, windows=ws, clear_bit=clear,
            fire_timestamp=None if clear else Timestamp(micros=fire * 1000),
            hold_timestamp=None if clear else Timestamp(micros=hold * 1000),
            paneinfo=None if clear else pane),
        keys, st.text(max_size=3), windows, st.booleans(), MILLIS, MILLIS, PANES),
        max_size=6))
    timer_impl = coders._TimerCoder(key_coder, window_coder).get_impl()
    key_impl = key_coder.get_impl()
    ident_coder = coders.TupleCoder([
        coders.StrUtf8Coder(), coders.TupleSequenceCoder(window_coder)]).get_impl()
    encoded = [timer_impl.encode_nested(timer) for timer in timers]

    read = list(TimerReader(key_impl, window_coder).read(b''.join(encoded)))

    assert len(read) == len(timers)
    for (key, ident, fire, hold, whole), timer, raw in zip(read, timers, encoded, strict=True):
        assert key == key_impl.encode_nested(timer.user_key)
        assert ident == ident_coder.encode_nested((timer.dynamic_timer_tag, timer.windows))
        if timer.clear_bit:
            assert (fire, hold, whole) == (None, None, None)
        else:
            decoded = timer_impl.decode_nested(raw)
            assert fire == decoded.fire_timestamp.micros
            assert hold == decoded.hold_timestamp.micros
            assert whole == raw


# CheapCombiningStateContext -----------------------------------------------------------

class _Unpicklable(beam.CombineFn):
    """A sum holding a lambda: pickle cannot copy it, Beam's deep copy can."""

    def __init__(self):
        self.add = lambda a, b: a + b

    def create_accumulator(self):
        return 0

    def add_input(self, acc, value):
        return self.add(acc, value)

    def merge_accumulators(self, accs):
        return sum(accs)

    def extract_output(self, acc):
        return acc


class _OwnDeepCopy(combiners.CountCombineFn):
    copies = 0

    def __deepcopy__(self, memo):
        type(self).copies += 1
        return _OwnDeepCopy()


def test_combine_fns_are_pickled_once_unless_pickle_cannot_copy_them():
    assert pickle.loads(_pickled_or_none(combiners.CountCombineFn())).__class__ is (
        combiners.CountCombineFn)
    assert _pickled_or_none(_Unpicklable()) is None
    assert _pickled_or_none(_OwnDeepCopy()) is None


def test_each_combining_state_gets_a_fresh_combine_fn():
    spec = userstate.CombiningValueStateSpec('count', combiners.CountCombineFn())
    fallback = userstate.CombiningValueStateSpec('sum', _Unpicklable())
    own = userstate.CombiningValueStateSpec('own', _OwnDeepCopy())
    context = CheapCombiningStateContext(None, 'transform', coders.StrUtf8Coder(),
                                coders.GlobalWindowCoder())
    beam_context = bundle_processor.FnApiUserStateContext(
        None, 'transform', coders.StrUtf8Coder(), coders.GlobalWindowCoder())
    copies_before = _OwnDeepCopy.copies
    for state_spec in (spec, fallback, own):
        states = [context.get_state(state_spec, key, window.GlobalWindow())
                  for key in ('a', 'b')]
        fns = [state._combinefn for state in states]
        assert fns[0] is not fns[1] and state_spec.combine_fn not in fns
        assert all(type(fn) is type(state_spec.combine_fn) for fn in fns)
        theirs = beam_context.get_state(state_spec, 'a', window.GlobalWindow())
        ours = states[0]
        assert (ours._underlying_bag_state._state_key
                == theirs._underlying_bag_state._state_key)
        assert vars(ours._combinefn).keys() == vars(theirs._combinefn).keys()
    assert _OwnDeepCopy.copies - copies_before == 3  # two of ours, one of Beam's
    assert fallback.combine_fn.add(2, 3) == 5


# FusedStageOperator -------------------------------------------------------------------

class _CountAndFlush(beam.DoFn):
    """A count per key and window in combining state (flushed with the window end, as
    the keyed-state benchmark's DoFn), a sum in a combining state pickle cannot copy,
    and a dynamic timer per element value."""

    COUNT = userstate.CombiningValueStateSpec('count', coders.VarIntCoder(),
                                              combiners.CountCombineFn())
    SUM = userstate.CombiningValueStateSpec('sum', coders.VarIntCoder(), _Unpicklable())
    END = userstate.TimerSpec('end', TimeDomain.WATERMARK)
    TAGGED = userstate.TimerSpec('tagged', TimeDomain.WATERMARK)

    def process(self, element, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam,
                count=beam.DoFn.StateParam(COUNT), total=beam.DoFn.StateParam(SUM),
                end=beam.DoFn.TimerParam(END), tagged=beam.DoFn.TimerParam(TAGGED)):
        count.add(element[1])
        total.add(element[1])
        end.set(w.max_timestamp())
        tagged.set(ts + 1 + element[1] % 3, dynamic_timer_tag=f'tag-{element[1] % 2}')

    @userstate.on_timer(END)
    def flush(self, key=beam.DoFn.KeyParam, count=beam.DoFn.StateParam(COUNT),
              total=beam.DoFn.StateParam(SUM)):
        yield key, 'end', count.read(), total.read()
        count.clear()
        total.clear()

    @userstate.on_timer(TAGGED)
    def on_tagged(self, key=beam.DoFn.KeyParam, tag=beam.DoFn.DynamicTimerTagParam,
                  ts=beam.DoFn.TimestampParam):
        yield key, tag, ts.micros


_COMPACTIONS = random.Random()


@pytest.fixture(scope='module')
def fused_stage(stateful_stage):
    """(make operator, encode elements) for the stateful stage of a small pipeline."""
    p = beam.Pipeline(options=PipelineOptions(['--streaming']))
    _ = (p | beam.Impulse()
         | beam.Map(lambda _: ('k', 0)).with_output_types(tuple[str, int])
         | beam.WindowInto(window.FixedWindows(10))
         | beam.ParDo(_CountAndFlush()) | beam.Reshuffle())
    draws = pytest.MonkeyPatch()
    draws.setattr(bundle_processor, 'random', _COMPACTIONS)
    try:
        yield stateful_stage(p)
    finally:
        draws.undo()


def run_epoch(op: FusedStageOperator, state: KeyedStateBackend, encode, epoch):
    """One epoch of `op` (built over `state`): its elements, then the watermark.
    Returns what the partition shows: outputs, hold, keys, live keys and timers."""
    elements, watermark = epoch
    # Beam's combining state compacts at random (`CombiningValueRuntimeState.add`):
    # the same draws make the same cells.
    _COMPACTIONS.seed(len(elements))
    out = []
    for record in encode(elements):
        out += op.process_bundle([record])
    out += op.advance(watermark)
    return (sorted(out), op.hold(), state.watermark, len(state.keys()),
            state.live_keys(), len(state.event_timers))


def decoded_delta(delta):
    """A delta's values decoded, each key's values as a dict."""
    dirty, deleted = delta
    return decoded(dirty, dict), deleted


def churn(rng: random.Random, epochs: int) -> list:
    """Keys of each 10-second window never recur; the watermark trails event time."""
    out = []
    for number in range(epochs):
        t = 10 * number
        elements = [(f'key-{number}-{rng.randrange(30)}', rng.randrange(10),
                     t + rng.randrange(10)) for _ in range(rng.randrange(40))]
        out.append((elements, Timestamp(max(0, t - 5)).micros))
    out.append(([], MAX_WATERMARK))
    return out


def restored_backend(state: dict[bytes, bytes]) -> KeyedStateBackend:
    """A fresh backend restored from `state`, as a task in another worker loads it."""
    backend = KeyedStateBackend(track_changes=True)
    backend.restore(dict(state))
    return backend


@pytest.mark.parametrize('seed', range(4))
def test_restored_every_epoch_equals_the_live_stage(fused_stage, seed):
    """Each epoch, one operator is built over a backend restored from the deltas so far
    and another over the one live backend (as a task that hits the cache): both give
    the same outputs, holds, keys and timers, and the same deltas."""
    make, encode = fused_stage
    live = KeyedStateBackend(track_changes=True)
    state: dict[bytes, bytes] = {}
    for number, epoch in enumerate(churn(random.Random(seed), 8)):
        restored = restored_backend(state)
        assert (run_epoch(make(restored), restored, encode, epoch)
                == run_epoch(make(live), live, encode, epoch)), number
        delta = live.take_delta()
        assert decoded_delta(restored.take_delta()) == decoded_delta(delta), number
        dirty, deleted = delta
        state.update(dirty)
        for name in deleted:
            state.pop(name, None)
    assert state.keys() == {b'm'}


def test_restore_decodes_nothing_until_a_key_is_used(fused_stage):
    make, encode = fused_stage
    live = KeyedStateBackend(track_changes=True)
    live_op = make(live)
    run_epoch(live_op, live, encode, ([(f'key-{i}', i, 1) for i in range(20)], 0))
    state, _ = live.take_delta()
    # A key's timers are in its header: one value per key, plus the partition's.
    assert sum(name[:1] == b'k' for name in state) == 20 and len(state) == 21

    restored = restored_backend(state)
    assert len(restored._raw) == 20 and not restored._values
    assert len(restored.event_timers) == 2 * 20
    assert restored.event_timers.next_timestamp() == live.event_timers.next_timestamp()
    restored_op = make(restored)
    assert restored_op.hold() == live_op.hold()
    assert restored.watermark == live.watermark == 0
    # An epoch touching two keys decodes those two, and its delta holds just them.
    touched = [('key-3', 1, 2), ('key-7', 1, 2)]
    assert (run_epoch(restored_op, restored, encode, (touched, 0))
            == run_epoch(live_op, live, encode, (touched, 0)))
    assert len(restored._raw) == 18
    dirty, deleted = restored.take_delta()
    assert sorted(dirty) == [b'k\x05key-3', b'k\x05key-7', b'm']
    assert not deleted
    # Firing every timer reads every key; the state empties.
    assert (run_epoch(restored_op, restored, encode, ([], MAX_WATERMARK))
            == run_epoch(live_op, live, encode, ([], MAX_WATERMARK)))
    assert not restored._raw and not restored.keys() and not restored.all_keys()


def test_combining_state_factory_is_beams_again_after_building(fused_stage):
    make, encode = fused_stage
    state = KeyedStateBackend(track_changes=True)
    run_epoch(make(state), state, encode, ([('a', 1, 1)], MAX_WATERMARK))
    assert bundle_processor.FnApiUserStateContext is not CheapCombiningStateContext
    assert copy.deepcopy(_CountAndFlush.COUNT.combine_fn) is not None
