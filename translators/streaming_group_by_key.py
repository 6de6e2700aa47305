"""GroupByKey across epochs: Beam's trigger driver per key, over the keyed-state backend.

Design section 7. Each key holds Beam's `InMemoryUnmergedState` (panes, trigger
state, watermark holds, timers) driven by `trigger.create_trigger_driver` in
streaming mode, so every trigger, accumulation mode, merging WindowFn and
allowed lateness behaves as in Beam. The trigger state lives in the partition's
`KeyedStateBackend` (namespace `TRIGGER`, encoded by `TriggerStateCodec`);
after every change the key is re-filed there (`_reindex`): one timer per key and
time domain at its earliest trigger timer, its earliest watermark hold as the
key's hold, and its windows in the expiry index. So a watermark or clock advance
touches only the keys that are due, the output hold is the backend's earliest
hold, and expired keys are found by a range scan. A restored backend indexes
every key from its header and decodes a key's trigger state when an epoch
first touches it: PySpark gives a partition no affinity to a Python worker, so
most epochs restore (NEXMark Q5 streaming at 300k events: 47 of 64 GroupByKey
loads, 0.7-0.9 s each when every key was decoded).

For a non-merging WindowFn the trigger driver keeps its state per window
(Beam's driver always goes through `MergeableStateAdapter`, whose window-id
bookkeeping cost 60% of its time per element), and a window's state goes as
soon as the watermark passes its end plus the allowed lateness, so a key that
lives for ever (a global combine, a few hot keys) holds only its live windows.
"""

from __future__ import annotations

import pickle
import types

from apache_beam.internal.cloudpickle import cloudpickle
from apache_beam.transforms import trigger
from apache_beam.transforms.timeutil import DependsOnlyOnWindow, TimeDomain
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.records import MAX_WATERMARK, ChunkBuilder, Record
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.translators.group_by_key import GroupingCoders
from beam_streams_runner.translators.operator import Bundle, Operator

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
    """A key's values, `[(TRIGGER, (user key, InMemoryUnmergedState))]`, as bytes.

    Beam's `InMemoryUnmergedState` holds defaultdicts of a lambda: it is written as
    plain lists in its own order (firing order follows it). A user type that only
    cloudpickle can carry (e.g. defined in the main module) goes through it."""

    def encode(self, values: list) -> bytes:
        plain = [(namespace, _plain(key, state)) for namespace, (key, state) in values]
        try:
            return pickle.dumps(plain, pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):
            return cloudpickle.dumps(plain, pickle.HIGHEST_PROTOCOL)

    def decode(self, data) -> list:
        return [(namespace, _unplain(*plain)) for namespace, plain in pickle.loads(data)]


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


class StreamingGroupByKeyOperator(Operator):
    """Reduce side of GroupByKey in streaming: Beam's trigger driver per key, with its
    state in the partition's keyed-state backend (see the module docstring)."""

    def __init__(self, coders: GroupingCoders, windowing, output_id: str, bundle_size: int,
                 state: KeyedStateBackend, keyed_state_gc: bool = True) -> None:
        self._coders = coders
        self._output_id = output_id
        self._bundle_size = bundle_size
        self._state = state
        # Off only for comparison benchmarks (--no_keyed_state_gc): expired keys stay.
        self._keyed_state_gc = keyed_state_gc
        self._lateness = windowing.allowed_lateness.micros
        self._driver = _StreamingTriggerDriver(windowing, BackendClock(state))
        self._merging = windowing.windowfn.is_merging()
        self._driver.is_merging = self._merging

    def sizes(self) -> dict[str, int]:
        state = self._state
        return {'keys': len(state.keys()), 'timers': state.timer_count()}

    # The operator contract ---------------------------------------------------------
    def process_bundle(self, bundle: Bundle) -> list[Record]:
        # Values wait in the trigger state encoded: a key's state is decoded and
        # encoded again each epoch that touches it, and bytes pickle at C speed
        # where user objects do not (NEXMark Q4 streaming: unpickling the bids
        # waiting per auction was 21% of all Python worker time).
        by_key: dict[bytes, list] = {}
        state = self._state
        encode_key = self._coders.key.encode_nested
        encode_value = self._coders.value.encode
        for _, chunk in bundle:
            for windowed in self._coders.input.decode_all(chunk):
                key, value = windowed.value
                encoded = encode_key(key)
                values = by_key.get(encoded)
                if values is None:
                    values = by_key[encoded] = []
                    if encoded not in state:
                        state.put(encoded, TRIGGER, (key, trigger.InMemoryUnmergedState()))
                values.append(windowed.with_value(encode_value(value)))
        # The input watermark stands for the output watermark too, as in Beam's own
        # trigger transcripts: a hold of this operator must not make an element
        # that is late for the input look early (transcript `early_late_sessions`).
        input_watermark = Timestamp(micros=state.watermark)
        out = self._output()
        for encoded, values in by_key.items():
            key, trigger_state = state.get(encoded, TRIGGER)
            out.extend(key, self._driver.process_elements(
                trigger_state, values, input_watermark, input_watermark))
            self._reindex(encoded)
        return out.records()

    def advance(self, watermark: int, processing_time: int | None = None) -> list[Record]:
        state = self._state
        out = self._output()
        if processing_time is not None:
            state.processing_time = max(state.processing_time, processing_time)
        if watermark > state.watermark:
            state.watermark = watermark
            self._fire(state.event_timers, watermark, out)
            if watermark >= MAX_WATERMARK:
                # The input has ended, so processing time runs out too, as for the
                # timers of a stateful ParDo and in the batch GroupByKey: no pane waits
                # for the wall clock (or, under a TestStream, for a processing-time
                # advance that never comes).
                state.processing_time = MAX_WATERMARK
                self._fire(state.processing_timers, MAX_WATERMARK, out)
                self._fire(state.event_timers, MAX_WATERMARK, out)
            self._expire(watermark)
        if processing_time is not None:
            self._fire(state.processing_timers, state.processing_time, out)
        return out.records()

    def hold(self) -> int:
        return self._state.min_hold()

    def next_processing_time(self) -> int | None:
        """When the earliest processing-time timer fires, or None."""
        return self._state.processing_timers.next_timestamp()

    def _output(self) -> _Output:
        return _Output(self._coders.output, self._output_id, self._bundle_size,
                       self._coders.value.decode)

    # Firing ------------------------------------------------------------------------
    def _fire(self, queue, up_to: int, out: _Output) -> None:
        # Firing may set new timers that are due at once (e.g. a repeated trigger).
        state = self._state
        while True:
            due = queue.pop_due(up_to)
            if not due:
                return
            watermark = Timestamp(micros=state.watermark)
            now = Timestamp(micros=state.processing_time)
            for timer in due:
                encoded = timer.timer_id[0]
                key, trigger_state = state.get(encoded, TRIGGER)
                fired, _ = trigger_state.get_timers(
                    clear=True, watermark=watermark, processing_time=now)
                for window_id, (name, domain, timestamp, _) in fired:
                    out.extend(key, self._driver.process_timer(
                        window_id, name, domain, timestamp, trigger_state, watermark))
                self._reindex(encoded)

    def _expire(self, watermark: int) -> None:
        if not self._keyed_state_gc:
            return
        state = self._state
        for encoded in state.expiry.candidates(watermark - self._lateness):
            latest = state.expiry.latest_window(encoded)
            if latest is None or latest + self._lateness >= watermark:
                if not self._merging:
                    self._expire_windows(encoded, watermark)
                continue
            if not state.has_timers(encoded):  # else a timer is still to fire
                state.delete_key(encoded)

    def _expire_windows(self, encoded: bytes, watermark: int) -> None:
        """Drops the windows of a live key that no element can reach any more (past
        their end plus the allowed lateness, as Beam's driver drops late elements)
        and that wait for no timer."""
        _, trigger_state = self._state.get(encoded, TRIGGER)
        expired = [window for window in trigger_state.state
                   if window.end.micros + self._lateness < watermark
                   and window not in trigger_state.timers]
        if expired:
            for window in expired:
                del trigger_state.state[window]
            self._reindex(encoded)

    def _reindex(self, encoded: bytes) -> None:
        """Re-files `encoded` in the backend after its trigger state changed: its
        earliest timer per time domain, its earliest hold and its windows."""
        state = self._state
        state.mark_changed(encoded)
        _, trigger_state = state.get(encoded, TRIGGER)
        event_time = clock_time = None
        for timers in trigger_state.timers.values():
            for (_, domain, _), timestamp in timers.items():
                micros = timestamp.micros
                if domain == TimeDomain.WATERMARK:
                    event_time = micros if event_time is None else min(event_time, micros)
                else:
                    clock_time = micros if clock_time is None else min(clock_time, micros)
        for queue, micros in ((state.event_timers, event_time),
                              (state.processing_timers, clock_time)):
            if micros is None:
                queue.clear((encoded,))
            else:
                # A key's timer holds nothing: the trigger state's holds do.
                queue.set((encoded,), micros, None, MAX_WATERMARK)
        _compact_holds(trigger_state)
        hold = trigger_state.get_earliest_hold().micros
        state.set_hold(encoded, hold if hold < MAX_WATERMARK else None)
        state.expiry.remove_key(encoded)
        windows = (trigger.MergeableStateAdapter(trigger_state).known_windows()
                   if self._merging else {*trigger_state.state, *trigger_state.timers})
        for window in windows:
            state.add_window(encoded, window.max_timestamp().micros)


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


class _Output:
    """Encodes fired panes `(key, values)` into chunks of at most `bundle_size`, each
    value decoded by `decode_value` first."""

    def __init__(self, coder_impl, output_id: str, bundle_size: int, decode_value) -> None:
        self._encode = coder_impl.encode_nested
        self._decode_value = decode_value
        self._output_id = output_id
        self._builder = ChunkBuilder(bundle_size)
        self._records: list[Record] = []

    def extend(self, key, panes) -> None:
        decode = self._decode_value
        for pane in panes:
            values = [decode(value) for value in pane.value]
            full = self._builder.add(self._encode(pane.with_value((key, values))))
            if full is not None:
                self._records.append((self._output_id, full))

    def records(self) -> list[Record]:
        rest = self._builder.flush()
        if rest is not None:
            self._records.append((self._output_id, rest))
        return self._records
