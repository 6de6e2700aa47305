"""A key's panes by Beam's own trigger driver: every trigger, WindowFn and allowed lateness.

Design section 7. Each key of a streaming GroupByKey holds Beam's
`InMemoryUnmergedState` (panes, trigger state, watermark holds, timers) driven
by `trigger.create_trigger_driver` in streaming mode, so every trigger,
accumulation mode, merging WindowFn and allowed lateness behaves as in Beam.
`BeamTriggerPanes` is what the operator (`streaming_group_by_key`) asks: the
panes of a bundle or of the due timers, and what to index of a key (its
earliest timer per time domain, its earliest hold, its windows).
`TriggerStateCodec` writes a key's state for the keyed-state backend.

For a non-merging WindowFn the trigger driver keeps its state per window
(Beam's driver always goes through `MergeableStateAdapter`, whose window-id
bookkeeping cost 60% of its time per element), and a window's state goes as
soon as the watermark passes its end plus the allowed lateness, so a key that
lives for ever (a global combine, a few hot keys) holds only its live windows.
"""

from __future__ import annotations

import pickle
import types
from collections.abc import Iterator

from apache_beam.internal.cloudpickle import cloudpickle
from apache_beam.transforms import trigger
from apache_beam.transforms.timeutil import DependsOnlyOnWindow, TimeDomain
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.state.backend import KeyedStateBackend

TRIGGER = 'trigger'  # the namespace of a key's (user key, trigger state)
# The tag of a window's watermark holds: the name Beam's
# `InMemoryUnmergedState.get_earliest_hold` reads (it assumes it, as does Beam's
# `GeneralTriggerDriver.WATERMARK_HOLD`).
_HOLD_TAG = 'watermark'


class _MergingState(trigger.MergeableStateAdapter):
    """Beam's `MergeableStateAdapter`, without two costs that grow with a merged
    window's history (NEXMark Q4 streaming: 12% of the Python workers' samples).

    Beam's `without_extraction` builds a new CombineFn class on every read and write of
    a pane's index or tombstone; the tag it gives is the same each time, so it is made
    once per tag. And the default trigger clears a merge result's timer once per merged
    window, for each of the result's window ids (a long-lived auction window has one per
    bid merged into it); only the ids that hold a timer can have one to clear."""

    def clear_timer(self, window, name, time_domain, dynamic_timer_tag='') -> None:
        timers = self.raw_state.timers
        for window_id in self._get_ids(window):
            if window_id in timers:
                self.raw_state.clear_timer(window_id, name, time_domain, dynamic_timer_tag)

    def add_state(self, window, tag, value) -> None:
        if isinstance(tag, trigger._CombiningValueStateTag):
            self.raw_state.add_state(self._get_id(window), _without_extraction(tag), value)
        else:
            super().add_state(window, tag, value)

    def get_state(self, window, tag):
        if not isinstance(tag, trigger._CombiningValueStateTag):
            return super().get_state(window, tag)
        plain = _without_extraction(tag)
        accumulators = [self.raw_state.get_state(window_id, plain)
                        for window_id in self._get_ids(window)]
        return tag.combine_fn.extract_output(tag.combine_fn.merge_accumulators(accumulators))


# (name, CombineFn) of a combining tag -> its `without_extraction()`, made once. Keyed
# by name and CombineFn, not by the tag: a composite trigger's prefixed tags are new
# objects on every access, over the class-level CombineFns of Beam's triggers.
_PLAIN_TAGS: dict = {}


def _without_extraction(tag):
    key = (tag.tag, tag.combine_fn)
    plain = _PLAIN_TAGS.get(key)
    if plain is None:
        plain = _PLAIN_TAGS[key] = tag.without_extraction()
    return plain


def _with_merging_state(method):
    """Beam's driver `method`, its `MergeableStateAdapter` being `_MergingState` (the
    name is a global of Beam's module; should Beam stop looking it up there, the copy
    runs Beam's adapter: slower, the same results)."""
    names = dict(method.__globals__, MergeableStateAdapter=_MergingState)
    return types.FunctionType(method.__code__, names, method.__name__, method.__defaults__,
                              method.__closure__)


class _StreamingTriggerDriver(trigger.GeneralTriggerDriver):
    """What `trigger.create_trigger_driver` gives in streaming, with one Beam bug fixed
    and merging windows' state kept by `_MergingState`.

    Beam 2.77's `process_elements` clears the watermark hold of a merged-away window
    after `MergeableStateAdapter.merge` has moved that window's state ids to the merge
    result, so the clear does nothing: a hold set by an earlier bundle stays in the
    result. With a timestamp combiner that depends only on the window (END_OF_WINDOW,
    the default; holds combined by max), a window merged into a result that ends
    before it (NEXMark's `AuctionOrBidWindowFn`: bid windows into their auction's)
    then gives the pane a timestamp past the end of its own window. Such a combiner's
    output time is the merged window's end, whatever the holds say.
    """

    process_elements = _with_merging_state(trigger.GeneralTriggerDriver.process_elements)
    process_timer = _with_merging_state(trigger.GeneralTriggerDriver.process_timer)

    def _output(self, window, finished, state, output_watermark, maybe_ontime):
        pane = super()._output(window, finished, state, output_watermark, maybe_ontime)
        if isinstance(self.timestamp_combiner_impl, DependsOnlyOnWindow):
            end = self.timestamp_combiner_impl.assign_output_time(window, None)
            if pane.timestamp != end:
                pane = WindowedValue(pane.value, end, pane.windows, pane.pane_info)
        return pane


class BackendClock:
    """Processing time as the partition's backend holds it (Beam's clock API)."""

    def __init__(self, state: KeyedStateBackend) -> None:
        self._state = state

    def time(self) -> Timestamp:
        return Timestamp(micros=self._state.processing_time)


class TriggerStateCodec:
    """A key's values, `[(namespace, (user key, its panes' state))]`, as bytes.

    Beam's `InMemoryUnmergedState` (namespace `TRIGGER`) holds defaultdicts of a
    lambda: it is written as plain lists in its own order (firing order follows
    it); another driver's state (`window_end_panes`) pickles as it is. A user type
    that only cloudpickle can carry (e.g. defined in the main module) goes through
    it."""

    def encode(self, values: list) -> bytes:
        plain = [(namespace, _plain(*value) if namespace == TRIGGER else value)
                 for namespace, value in values]
        try:
            return pickle.dumps(plain, pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):
            return cloudpickle.dumps(plain, pickle.HIGHEST_PROTOCOL)

    def decode(self, data) -> list:
        return [(namespace, _unplain(*value) if namespace == TRIGGER else value)
                for namespace, value in pickle.loads(data)]


def _plain(key, state: trigger.InMemoryUnmergedState) -> tuple:
    return (key,
            [(window, list(timers.items())) for window, timers in state.timers.items()],
            [(window, list(tagged.items())) for window, tagged in state.state.items()],
            state.global_state, state.defensive_copy)


def _unplain(key, timers, tagged_states, global_state, defensive_copy) -> tuple:
    state = trigger.InMemoryUnmergedState(defensive_copy=defensive_copy)
    for window, window_timers in timers:
        state.timers[window] = dict(window_timers)
    for window, tagged in tagged_states:
        state.state[window].update(tagged)
    state.global_state = global_state
    return key, state


TRIGGER_STATE_CODEC = TriggerStateCodec()


def _compact_holds(state: trigger.InMemoryUnmergedState) -> None:
    """Shortens every window's watermark-hold list to its minimum and maximum.

    Beam's driver appends a hold per element and `get_earliest_hold` takes the
    minimum of every list, so a key re-indexed after each small bundle paid for all
    the holds of its windows each time (62% of all worker time for a GroupByKey of
    10 keys over sliding windows at bundle size 10). Every timestamp combiner
    combines holds by their minimum or maximum (`combine_all`), and
    `get_earliest_hold` takes the minimum, so both read the same from the two.
    """
    for tagged in state.state.values():
        holds = tagged.get(_HOLD_TAG)
        if holds is not None and len(holds) > 2:
            tagged[_HOLD_TAG] = [min(holds), max(holds)]




class BeamTriggerPanes:
    """What the streaming GroupByKey asks of a key's panes, answered by Beam's trigger
    driver over the key's `InMemoryUnmergedState`."""

    namespace = TRIGGER

    def __init__(self, windowing, state: KeyedStateBackend) -> None:
        self._driver = _StreamingTriggerDriver(windowing, BackendClock(state))
        self._merging = windowing.windowfn.is_merging()
        self._driver.is_merging = self._merging
        # A merged window's parts cannot go one by one.
        self.drops_windows = not self._merging

    def new_state(self) -> trigger.InMemoryUnmergedState:
        return trigger.InMemoryUnmergedState()

    def process_elements(self, state: trigger.InMemoryUnmergedState, values: list,
                         watermark: Timestamp) -> Iterator[WindowedValue]:
        # The input watermark stands for the output watermark too, as in Beam's own
        # trigger transcripts: a hold of this operator must not make an element
        # that is late for the input look early (transcript `early_late_sessions`).
        return self._driver.process_elements(state, values, watermark, watermark)

    def fire(self, state: trigger.InMemoryUnmergedState, watermark: Timestamp,
             now: Timestamp) -> Iterator[WindowedValue]:
        fired, _ = state.get_timers(clear=True, watermark=watermark, processing_time=now)
        for window_id, (name, domain, timestamp, _) in fired:
            yield from self._driver.process_timer(
                window_id, name, domain, timestamp, state, watermark)

    def index(self, state: trigger.InMemoryUnmergedState) -> tuple:
        event_time = clock_time = None
        for timers in state.timers.values():
            for (_, domain, _), timestamp in timers.items():
                micros = timestamp.micros
                if domain == TimeDomain.WATERMARK:
                    event_time = micros if event_time is None else min(event_time, micros)
                else:
                    clock_time = micros if clock_time is None else min(clock_time, micros)
        _compact_holds(state)
        windows = (trigger.MergeableStateAdapter(state).known_windows()
                   if self._merging else {*state.state, *state.timers})
        return (event_time, clock_time, state.get_earliest_hold().micros,
                [window.max_timestamp().micros for window in windows])

    def expire_windows(self, state: trigger.InMemoryUnmergedState, before: int) -> bool:
        expired = [window for window in state.state
                   if window.end.micros < before and window not in state.timers]
        for window in expired:
            del state.state[window]
        return bool(expired)
