"""A stateful fused stage's own state machinery, in process (no Spark).

* `TimerReader` splits a stream of timers in Beam's encoding into the parts the
  timer queues keep (encoded key, encoded tag and windows, firing and hold
  micros, the timer's encoding) exactly as Beam's `TimerCoderImpl` reads them;
* `DirectUserStateContext` sets timers as the reader reads Beam's, and keeps every
  direct state kind reading as Beam's semantics say, across bundles and checkpoints;
* a `FusedStageOperator` over a restored `KeyedStateBackend` is lazy (untouched
  keys stay encoded, no timer is decoded) and a stage built afresh over a backend
  restored every epoch behaves as a live one, with combining state, event-time
  timers at the window end and dynamic timers.
"""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_OutputStream
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
from beam_streams_runner.state.direct_user_state import DirectUserStateContext
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


# DirectUserStateContext ---------------------------------------------------------------

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


def direct_context(key_coder, window_coder, timer_specs=()):
    """A `DirectUserStateContext` over a fresh backend (what a task's router points at),
    with `timer_specs`' timer coders, and the backend."""
    backend = KeyedStateBackend(track_changes=True)
    router = SimpleNamespace(target=SimpleNamespace(state=backend))
    context = DirectUserStateContext(SimpleNamespace(_underlying=router), 'transform',
                                     key_coder, window_coder)
    for spec in timer_specs:
        timer_coder = coders._TimerCoder(key_coder, window_coder).get_impl()
        context.add_timer_info(spec.name, bundle_processor.TimerInfo(timer_coder))
    return context, backend


@given(data=st.data(), key_coder=st.sampled_from(sorted(KEY_CODERS)),
       event_time=st.booleans())
@settings(max_examples=60, deadline=None)
def test_direct_timers_are_what_the_timer_reader_reads_of_beams(data, key_coder, event_time):
    """A timer set or cleared through the direct context lands in the queue with the id,
    firing and hold micros and payload that the runner's reader takes from the timer
    Beam's `OutputTimer` writes."""
    coder, keys = KEY_CODERS[key_coder]
    spec = userstate.TimerSpec('t', TimeDomain.WATERMARK if event_time
                               else TimeDomain.REAL_TIME)
    context, backend = direct_context(coder, coders.IntervalWindowCoder(), [spec])
    key, tag = data.draw(keys), data.draw(st.text(max_size=3))
    start = data.draw(st.integers(-10**6, 10**6))
    w = window.IntervalWindow(start, start + data.draw(st.integers(1, 100)))
    fire = Timestamp(micros=data.draw(MILLIS) * 1000 + data.draw(st.integers(0, 999)))
    input_ts, pane = Timestamp(micros=data.draw(MILLIS) * 1000), data.draw(PANES)
    timer_coder = context.timer_coder(spec.name)
    stream = _TimerStream()
    bundle_processor.OutputTimer(key, w, input_ts, pane, spec.time_domain, spec.name,
                                 timer_coder, stream).set(fire, dynamic_timer_tag=tag)
    reader = TimerReader(coder.get_impl(), coders.IntervalWindowCoder())
    [(encoded_key, ident, fire_us, hold_us, payload)] = reader.read(stream.get())

    context.get_timer(spec, key, w, input_ts, pane).set(fire, dynamic_timer_tag=tag)
    queue = backend.timers('event' if event_time else 'processing')
    [(_, pending)] = queue.timers_of(encoded_key)
    assert pending.timer_id == (encoded_key, ('transform', spec.name), ident)
    assert (pending.fire_timestamp, pending.hold_timestamp, pending.payload) == (
        fire_us, hold_us, payload)
    context.get_timer(spec, key, w, input_ts, pane).clear(dynamic_timer_tag=tag)
    assert not queue.timers_of(encoded_key)


class _TimerStream(create_OutputStream):
    """An output stream as `OutputTimer` writes to (the harness's flushes it)."""

    def maybe_flush(self):
        pass


class _Model:
    """What each state kind reads after the same calls, by Beam's semantics."""

    def __init__(self):
        self.bag, self.value, self.members, self.count = [], None, set(), 0


STATE_CALLS = st.lists(st.tuples(st.sampled_from(['add', 'clear', 'commit', 'reload']),
                                 st.integers(0, 5)), max_size=30)


@given(calls=STATE_CALLS)
@settings(max_examples=60, deadline=None)
def test_direct_states_read_as_beams_and_checkpoint_as_the_protocols_bag(calls):
    """Bag, read-modify-write, set and combining states through the direct context read
    what Beam's semantics say after any calls, across bundles (`commit`, `reset`) and
    across a checkpoint restored into a fresh backend (`reload`: the cells come back as
    the protocol's encoded chunks and are decoded again); the protocol's handler reads
    the same bag from a checkpointed cell."""
    specs = {'bag': userstate.BagStateSpec('bag', coders.VarIntCoder()),
             'value': userstate.ReadModifyWriteStateSpec('value', coders.VarIntCoder()),
             'members': userstate.SetStateSpec('members', coders.VarIntCoder()),
             'count': userstate.CombiningValueStateSpec('count', coders.VarIntCoder(),
                                                        _Unpicklable())}
    context, backend = direct_context(coders.StrUtf8Coder(), coders.GlobalWindowCoder())
    model, w = _Model(), window.GlobalWindow()
    for call, value in calls:
        states = {name: context.get_state(spec, 'k', w) for name, spec in specs.items()}
        if call == 'add':
            states['bag'].add(value)
            states['value'].write(value)
            states['members'].add(value)
            states['count'].add(value)
            model.bag.append(value)
            model.value = value
            model.members.add(value)
            model.count += value
        elif call == 'clear':
            for state in states.values():
                state.clear()
            model = _Model()
        elif call == 'commit':
            context.commit()
            context.reset()
        else:
            snapshot = backend.snapshot()
            backend = KeyedStateBackend(track_changes=True)
            backend.restore(snapshot)
            context._router.target.state = backend
            context.reset()
        states = {name: context.get_state(spec, 'k', w) for name, spec in specs.items()}
        assert list(states['bag'].read()) == model.bag
        assert states['value'].read() == model.value
        assert states['members'].read() == model.members
        assert states['count'].read() == model.count
    snapshot = backend.snapshot()
    protocol = KeyedStateBackend()
    protocol.restore(snapshot)
    namespace = ('transform', 'bag', coders.GlobalWindowCoder().encode(w))
    cell = protocol.get(coders.StrUtf8Coder().get_impl().encode_nested('k'), namespace, ())
    assert list(coders.VarIntCoder().get_impl().decode_all(b''.join(cell))) == model.bag


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


def test_the_user_state_factory_is_beams_again_after_building(fused_stage):
    make, encode = fused_stage
    state = KeyedStateBackend(track_changes=True)
    run_epoch(make(state), state, encode, ([('a', 1, 1)], MAX_WATERMARK))
    assert bundle_processor.FnApiUserStateContext is not DirectUserStateContext
    assert copy.deepcopy(_CountAndFlush.COUNT.combine_fn) is not None
