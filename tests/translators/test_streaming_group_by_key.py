"""The streaming GroupByKey's trigger driver keeps merging windows' state with
`_MergingState`: the same panes and the same state as with Beam's adapter, for random
sessions of elements, watermark advances and timer firings (hypothesis)."""

from __future__ import annotations

from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import example, given, settings
from hypothesis import strategies as st

from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.translators.beam_trigger_panes import (
    TRIGGER_STATE_CODEC,
    _MergingState,
    _StreamingTriggerDriver,
)
from tests.state.test_state_deltas import grouping_input, grouping_operator, seconds


class _BeamAdapterDriver(_StreamingTriggerDriver):
    """The same driver with Beam's own `MergeableStateAdapter`."""

    process_elements = trigger.GeneralTriggerDriver.process_elements
    process_timer = trigger.GeneralTriggerDriver.process_timer


class _Clock:
    def time(self) -> Timestamp:
        return Timestamp(0)


_TRIGGERS = [trigger.DefaultTrigger(),
             trigger.AfterWatermark(early=trigger.AfterCount(2)),
             trigger.Repeatedly(trigger.AfterCount(3)),
             trigger.AfterWatermark(late=trigger.AfterCount(1))]
_STEPS = st.lists(st.one_of(
    st.lists(st.tuples(st.sampled_from('ab'), st.integers(0, 40)), min_size=1, max_size=6),
    st.integers(1, 25)), max_size=12)  # a bundle of (key, event time), or a watermark step


def _run(driver_class, windowing, steps) -> tuple[list, dict]:
    driver = driver_class(windowing, _Clock())
    driver.is_merging = True
    states: dict = {}
    panes: list = []
    watermark = Timestamp(0)
    for step in steps:
        if isinstance(step, int):
            watermark = watermark + step
            for key, state in states.items():
                fired = state.get_timers(clear=True, watermark=watermark)[0]
                for window_id, (name, domain, timestamp, _) in fired:
                    panes += [(key, p) for p in driver.process_timer(
                        window_id, name, domain, timestamp, state, watermark)]
            continue
        for key in sorted({k for k, _ in step}):
            state = states.setdefault(key, trigger.InMemoryUnmergedState())
            values = [WindowedValue(t, Timestamp(t), (w,))
                      for k, t in step if k == key
                      for w in windowing.windowfn.assign(
                          window.WindowFn.AssignContext(Timestamp(t)))]
            panes += [(key, p) for p in driver.process_elements(
                state, values, watermark, watermark)]
    seen = [(key, sorted(p.value), p.timestamp, p.windows, p.pane_info) for key, p in panes]
    kept = {key: (dict(s.timers), {w: dict(t) for w, t in s.state.items()}, s.global_state)
            for key, s in states.items()}
    return seen, kept


@settings(max_examples=150, deadline=None)
@given(steps=_STEPS, trigger_index=st.integers(0, len(_TRIGGERS) - 1),
       accumulating=st.booleans(), lateness=st.sampled_from([0, 10]))
# Two sessions of two elements each, bridged by a fifth: the merged window's count
# (Repeatedly(AfterCount(3))) is read across the window ids merged into it.
@example(steps=[[('a', 0), ('a', 1)], [('a', 10), ('a', 11)], [('a', 5)], 30],
         trigger_index=2, accumulating=False, lateness=0)
def test_merging_state_gives_beams_panes_and_state(steps, trigger_index, accumulating,
                                                    lateness):
    windowing = Windowing(
        window.Sessions(5), triggerfn=_TRIGGERS[trigger_index],
        accumulation_mode=(trigger.AccumulationMode.ACCUMULATING if accumulating
                           else trigger.AccumulationMode.DISCARDING),
        allowed_lateness=lateness)
    assert _run(_StreamingTriggerDriver, windowing, steps) == _run(
        _BeamAdapterDriver, windowing, steps)


def test_the_driver_runs_the_merging_state():
    # Else the comparison above would compare Beam's adapter with itself.
    assert (_StreamingTriggerDriver.process_elements.__globals__['MergeableStateAdapter']
            is _MergingState)
    assert (_StreamingTriggerDriver.process_timer.__globals__['MergeableStateAdapter']
            is _MergingState)


class _CountingCodec:
    """The GroupByKey's codec, counting the keys it decodes."""

    def __init__(self) -> None:
        self.decoded = 0

    def encode(self, values: list) -> bytes:
        return TRIGGER_STATE_CODEC.encode(values)

    def decode(self, data) -> list:
        self.decoded += 1
        return TRIGGER_STATE_CODEC.decode(data)


def test_expiry_of_merging_windows_leaves_the_keys_states_unread():
    """A watermark advance that fires nothing reads no key's state of a merging
    GroupByKey: its windows cannot be dropped one by one, so expiry has nothing to
    read them for (a restored partition decodes a key's state when first used)."""
    windowing = Windowing(window.Sessions(5))
    elements = [(key, 1, t) for key in 'abcde' for t in (1, 20)]
    live_state = KeyedStateBackend(TRIGGER_STATE_CODEC)
    live = grouping_operator(windowing)(live_state)
    live.process_bundle([('input', grouping_input(windowing, elements))])
    assert live.advance(seconds(10))  # the first sessions fire
    codec = _CountingCodec()
    restored = KeyedStateBackend(codec)
    restored.restore(live_state.snapshot())
    operator = grouping_operator(windowing)(restored)
    assert operator.advance(seconds(12)) == []
    assert codec.decoded == 0
    assert operator.advance(seconds(30))  # the second sessions fire, read from the state
    assert codec.decoded == 5
