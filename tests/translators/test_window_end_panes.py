"""`WindowEndPanes` gives what Beam's trigger driver gives for `DefaultTrigger` over a
non-merging WindowFn: random epochs of bundles and watermark advances (late elements,
allowed lateness, every timestamp combiner and accumulation mode) through two streaming
GroupByKey operators, one on each, must give the same panes (values, timestamps, windows,
pane info, in the same order), holds, timers, windows and keys (hypothesis)."""

from __future__ import annotations

import pytest
from apache_beam.coders import coders
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.window import TimestampCombiner
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.translators import window_end_panes
from beam_streams_runner.translators.beam_trigger_panes import (
    TRIGGER,
    TRIGGER_STATE_CODEC,
    BeamTriggerPanes,
)
from beam_streams_runner.translators.streaming_group_by_key import (
    StreamingGroupByKeyOperator,
    key_panes,
)
from beam_streams_runner.translators.window_end_panes import WindowEndPanes
from tests.state.test_state_deltas import EPOCHS, as_epochs, grouping_input, grouping_operator

WINDOW_FNS = [window.FixedWindows(10), window.SlidingWindows(10, 5), window.GlobalWindows()]
WINDOWINGS = st.builds(
    lambda window_fn, combiner, lateness, mode: Windowing(
        window_fn, triggerfn=trigger.DefaultTrigger(), accumulation_mode=mode,
        timestamp_combiner=combiner, allowed_lateness=lateness),
    st.sampled_from(WINDOW_FNS),
    st.sampled_from([TimestampCombiner.OUTPUT_AT_EOW, TimestampCombiner.OUTPUT_AT_EARLIEST,
                     TimestampCombiner.OUTPUT_AT_LATEST]),
    st.sampled_from([0, 7]),
    st.sampled_from([trigger.AccumulationMode.DISCARDING,
                     trigger.AccumulationMode.ACCUMULATING]))


def _observe(windowing, op: StreamingGroupByKeyOperator, state: KeyedStateBackend,
             epoch) -> tuple:
    elements, watermark, now = epoch
    records = []
    if elements:
        records += op.process_bundle([('input', grouping_input(windowing, elements))])
    records += op.advance(watermark, now)
    output = coders.WindowedValueCoder(
        coders.TupleCoder([coders.StrUtf8Coder(), coders.IterableCoder(coders.VarIntCoder())]),
        windowing.windowfn.get_window_coder()).get_impl()
    panes = [(pane.value, pane.timestamp, pane.windows, pane.pane_info)
             for _, chunk in records for pane in output.decode_all(chunk)]
    timers = {key: [(timer.fire_timestamp, timer.hold_timestamp)
                    for _, timer in state.event_timers.timers_of(key)]
              for key in state.event_timers.keys()}
    return (panes, op.hold(), timers, op.sizes(),
            {key: state.expiry.windows(key) for key in state.expiry.keys()})


@settings(max_examples=150, deadline=None)
@given(windowing=WINDOWINGS, steps=EPOCHS)
def test_window_end_panes_equal_beams_driver(windowing, steps):
    assert window_end_panes.applies_to(windowing)
    make = grouping_operator(windowing)
    fast_state = KeyedStateBackend(TRIGGER_STATE_CODEC)
    beam_state = KeyedStateBackend(TRIGGER_STATE_CODEC)
    fast = make(fast_state)
    assert isinstance(fast._panes, WindowEndPanes)
    beam = StreamingGroupByKeyOperator(
        fast._coders, windowing, 'out', 100, beam_state,
        panes=BeamTriggerPanes(windowing, beam_state))
    for number, epoch in enumerate(as_epochs(steps)):
        got = _observe(windowing, fast, fast_state, epoch)
        want = _observe(windowing, beam, beam_state, epoch)
        assert got == want, f'epoch {number}'


def test_other_triggers_and_merging_windows_keep_beams_driver():
    state = KeyedStateBackend(TRIGGER_STATE_CODEC)
    for windowing in [Windowing(window.Sessions(5)),
                      Windowing(window.FixedWindows(10), triggerfn=trigger.AfterWatermark(
                          early=trigger.AfterCount(1)),
                               accumulation_mode=trigger.AccumulationMode.DISCARDING)]:
        assert isinstance(key_panes(windowing, state), BeamTriggerPanes)
    assert isinstance(key_panes(Windowing(window.FixedWindows(10)), state), WindowEndPanes)


def test_a_key_state_of_the_other_form_names_what_to_do():
    """A checkpoint whose GroupByKey state another version of the runner wrote (Beam's
    trigger state where this one keeps window panes) fails with what to do."""
    windowing = Windowing(window.FixedWindows(10))
    state = KeyedStateBackend(TRIGGER_STATE_CODEC)
    op = grouping_operator(windowing)(state)
    state.put(b'\x01a', TRIGGER, ('a', trigger.InMemoryUnmergedState()))
    with pytest.raises(RuntimeError, match='--restart_from_scratch'):
        op.process_bundle([('input', grouping_input(windowing, [('a', 1, 3)]))])
