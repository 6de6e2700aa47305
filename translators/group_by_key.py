"""GroupByKey (and the shuffle in front of stateful ParDos and lifted Combines).

Design sections 3.3-3.5 and 7. The map side decodes each element's key, hashes
its deterministic Beam encoding (crc32 of the key coder's bytes) to a
partition, and ships the element's original bytes, batched per target partition
in chunks of at most `bundle_size` elements. The reduce side
(`GroupByKeyOperator`) buffers values per (encoded key) and, when the input
watermark passes, runs Beam's trigger driver
(`apache_beam.transforms.trigger.create_trigger_driver`) per key: every
WindowFn incl. custom and merging ones (the real Python WindowFn, never an
opaque stand-in), timestamp combiners, accumulation modes, allowed lateness,
pane info. Combine lifting (`lift_combiners`) puts a partial combine before this
shuffle and the merge of accumulators after it, both in the SDK harness.

Two fast paths skip the trigger driver where its result is known in advance:
the global window with default windowing (one pane per key, as Beam's own
`BatchGlobalTriggerDriver`), and (`_one_pane_per_window`) a non-merging
WindowFn with Beam's `DefaultTrigger`, where in batch every (key, window) gets
exactly one on-time pane. The second exists because the general driver's
per-window state, timers and watermark holds cost 16% of all Python worker
time in NEXMark Q5 batch (sliding windows, default trigger; py-spy, 300k
events); its panes are the general driver's, value for value (see
`_one_pane_per_window`), and the general driver still runs for merging
WindowFns, every other trigger, and keys with a window ending outside
(-inf, +inf].
"""

from __future__ import annotations

import functools
import marshal
import pickle
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping

from apache_beam.internal.cloudpickle import cloudpickle
from apache_beam.runners.direct.clock import RealClock
from apache_beam.transforms import trigger
from apache_beam.transforms.timeutil import DependsOnlyOnWindow, TimeDomain
from apache_beam.transforms.window import GlobalWindow, GlobalWindows, TimestampCombiner
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from sortedcontainers import SortedList

from beam_streams_runner.records import (
    MAX_WATERMARK,
    ChunkBuilder,
    Record,
    chunks_by_target,
    decode_with_raw,
)
from beam_streams_runner.state.keyed_state import KeyedStateIndex
from beam_streams_runner.translators.operator import Bundle, Operator

_ONLY_PANE = PaneInfo(
    is_first=True, is_last=True, timing=PaneInfoTiming.ON_TIME, index=0, nonspeculative_index=0)
# What `GeneralTriggerDriver` emits for `DefaultTrigger` in batch: the watermark
# timer at the window's end fires once, on time, and `DefaultTrigger.on_fire`
# never finishes the window, so the pane is not marked last.
_DEFAULT_TRIGGER_PANE = PaneInfo(
    is_first=True, is_last=False, timing=PaneInfoTiming.ON_TIME, index=0, nonspeculative_index=0)


def _process_entire_key(driver, key, windowed_values):
    """`GeneralTriggerDriver.process_entire_key`, with processing-time timers.

    Beam 2.77's version asks for due timers without a processing time, so any
    processing-time trigger (e.g. NEXMark Q12's) fails with a TypeError; here
    both the watermark and processing time stand at +inf once the bounded input
    has ended, so every pending pane fires.
    """
    state = trigger.InMemoryUnmergedState()
    for wvalue in driver.process_elements(state, windowed_values, MIN_TIMESTAMP, MIN_TIMESTAMP):
        yield wvalue.with_value((key, wvalue.value))
    while state.timers:
        fired, _ = state.get_timers(
            clear=True, watermark=MAX_TIMESTAMP, processing_time=MAX_TIMESTAMP)
        if not fired:
            break  # only timers set beyond the end of time remain
        for timer_window, (name, time_domain, fire_time, _) in fired:
            for wvalue in driver.process_timer(timer_window, name, time_domain, fire_time, state):
                yield wvalue.with_value((key, wvalue.value))


def _one_pane_per_window(timestamp_combiner, general, key, windowed_values):
    """One key's panes for a non-merging WindowFn and `DefaultTrigger` in batch.

    Exactly what `_process_entire_key(general driver)` gives, without its state,
    timers and holds: `process_elements` (at watermark -inf) groups the values by
    window in arrival order (an element in several windows goes into each),
    holds each window at its combined output time and sets one watermark timer
    at the window's end; at watermark +inf the timers fire in the order the
    windows were first seen, each giving one pane `_DEFAULT_TRIGGER_PANE` at the
    held time, or at the window's end if nothing was held (an output time before
    -inf, from `get_transformed_output_time`, holds nothing); allowed lateness
    drops nothing at watermark -inf. Only a window ending at or before -inf
    (fired early, at once) or after +inf (its timer never fires) differs: then
    the key goes through `general`.
    """
    by_window: dict = {}
    for windowed in windowed_values:
        for window in windowed.windows:
            group = by_window.get(window)
            if group is None:
                by_window[window] = [windowed]
            else:
                group.append(windowed)
    assign = timestamp_combiner.assign_output_time
    merge = timestamp_combiner.merge
    panes = []
    for window, group in by_window.items():
        if not MIN_TIMESTAMP < window.end <= MAX_TIMESTAMP:
            return list(general(key, windowed_values))
        # As the driver's hold: over the output times not before the output
        # watermark (-inf); a combiner that depends only on the window
        # (END_OF_WINDOW) never reads them.
        timestamp = merge(window, (
            output_time for output_time in (
                assign(window, windowed.timestamp) for windowed in group)
            if output_time >= MIN_TIMESTAMP))
        if timestamp is None:
            timestamp = window.max_timestamp()
        panes.append(WindowedValue(
            (key, [windowed.value for windowed in group]), timestamp, (window,),
            _DEFAULT_TRIGGER_PANE))
    return panes


def batch_panes(windowing):
    """`panes(key, windowed_values)` for the batch GroupByKey once its input ended:
    one of the fast paths, or Beam's trigger driver for `windowing`."""
    if windowing.is_default():
        # Global window, default trigger: one pane per key at the end, as Beam's
        # own batch grouping does; the values come without their windows.
        in_global_window = GlobalWindows.windowed_value(
            None, timestamp=GlobalWindow().max_timestamp(), pane_info=_ONLY_PANE).with_value
        return lambda key, values: (in_global_window((key, values)),)
    driver = trigger.create_trigger_driver(windowing, is_batch=True, clock=RealClock())
    if not isinstance(driver, trigger.GeneralTriggerDriver):
        return driver.process_entire_key
    general = functools.partial(_process_entire_key, driver)
    if (type(windowing.triggerfn) is trigger.DefaultTrigger
            and not windowing.windowfn.is_merging()):
        return functools.partial(
            _one_pane_per_window,
            TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn),
            general)
    return general


class KeyPartitioner:
    """Map side of a keyed shuffle: routes encoded KV elements by their key."""

    def __init__(self, element_coder_impl, key_coder_impl, num_partitions: int,
                 bundle_size: int) -> None:
        self._element_coder = element_coder_impl
        self._key_coder = key_coder_impl
        self._num_partitions = num_partitions
        self._bundle_size = bundle_size

    def partition(self, tag: str, chunks: Iterable[bytes]) -> Iterator[tuple[int, Record]]:
        n = self._num_partitions
        encode_key = self._key_coder.encode_nested
        crc32 = zlib.crc32
        routed = (
            (crc32(encode_key(windowed.value[0])) % n, raw)
            for chunk in chunks
            for windowed, raw in decode_with_raw(self._element_coder, chunk))
        return chunks_by_target(routed, n, self._bundle_size, tag)


class _GroupingOperator(Operator):
    """What both reduce sides of GroupByKey decode, group and encode with."""

    def __init__(self, input_coder_impl, output_coder_impl, key_coder_impl, windowing,
                 output_id: str, bundle_size: int, channels=('input',)) -> None:
        super().__init__(channels)
        self._input_coder = input_coder_impl
        self._output_coder = output_coder_impl
        self._key_coder = key_coder_impl
        self._windowing = windowing
        self._output_id = output_id
        self._bundle_size = bundle_size


class GroupByKeyOperator(_GroupingOperator):
    """Reduce side of GroupByKey: per-key buffers, fired by the watermark."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._buffers: dict[bytes, tuple[object, list]] = {}
        # Global window, default trigger (see `batch_panes`): values are kept
        # without their windows.
        self._trivial = self._windowing.is_default()

    def process_bundle(self, bundle: Bundle) -> list[Record]:
        encode_key = self._key_coder.encode_nested
        buffers = self._buffers
        decode_all = self._input_coder.decode_all
        trivial = self._trivial
        for _, chunk in bundle:
            for windowed in decode_all(chunk):
                key, value = windowed.value
                encoded = encode_key(key)
                entry = buffers.get(encoded)
                if entry is None:
                    entry = buffers[encoded] = (key, [])
                entry[1].append(value if trivial else windowed.with_value(value))
        return []

    def on_input_watermark(self, watermark: int) -> list[Record]:
        if watermark < MAX_WATERMARK:
            # Firing before the end of input is the streaming driver's work
            # (trigger driver in streaming mode); the batch driver only ends inputs.
            return []
        panes = batch_panes(self._windowing)
        builder = ChunkBuilder(self._bundle_size)
        out: list[Record] = []
        encode = self._output_coder.encode_nested
        for key, values in self._buffers.values():
            for grouped in panes(key, values):
                full = builder.add(encode(grouped))
                if full is not None:
                    out.append((self._output_id, full))
        rest = builder.flush()
        if rest is not None:
            out.append((self._output_id, rest))
        self._buffers = {}
        return out


class _StreamingTriggerDriver(trigger.GeneralTriggerDriver):
    """What `trigger.create_trigger_driver` gives in streaming, with one Beam bug fixed.

    Beam 2.77's `process_elements` clears the watermark hold of a merged-away window
    after `MergeableStateAdapter.merge` has moved that window's state ids to the merge
    result, so the clear does nothing: a hold set by an earlier bundle stays in the
    result. With a timestamp combiner that depends only on the window (END_OF_WINDOW,
    the default; holds combined by max), a window merged into a result that ends
    before it (NEXMark's `AuctionOrBidWindowFn`: bid windows into their auction's)
    then gives the pane a timestamp past the end of its own window. Such a combiner's
    output time is the merged window's end, whatever the holds say.
    """

    def _output(self, window, finished, state, output_watermark, maybe_ontime):
        pane = super()._output(window, finished, state, output_watermark, maybe_ontime)
        if isinstance(self.timestamp_combiner_impl, DependsOnlyOnWindow):
            end = self.timestamp_combiner_impl.assign_output_time(window, None)
            if pane.timestamp != end:
                pane = WindowedValue(pane.value, end, pane.windows, pane.pane_info)
        return pane


class EpochClock:
    """Processing time as the streaming driver sets it for an epoch (Beam's clock API)."""

    def __init__(self, micros: int = 0) -> None:
        self.micros = micros

    def time(self) -> Timestamp:
        return Timestamp(micros=self.micros)


class StreamingGroupByKeyOperator(_GroupingOperator):
    """Reduce side of GroupByKey in streaming: Beam's trigger driver per key, across epochs.

    Design section 7. Each key holds Beam's `InMemoryUnmergedState` (panes,
    trigger state, watermark holds, timers) driven by
    `trigger.create_trigger_driver` in streaming mode, so every trigger,
    accumulation mode, merging WindowFn and allowed lateness behaves as in Beam.
    Three ordered indexes make a watermark or clock advance touch only what is
    due: keys by their earliest event-time timer, keys by their earliest
    processing-time timer, keys by their earliest watermark hold (the output
    watermark is min(input watermark, earliest hold)); expired keys are found
    through `KeyedStateIndex` by the earliest window they hold.

    Across epochs (design section 8) its state is versioned per key:
    `state_delta` gives the keys changed since the last call (every change goes
    through `_reindex`), each key's `InMemoryUnmergedState` encoded alone behind
    a small header of what the indexes need (`_encode_entry`), and
    `restore_state` rebuilds the indexes from the headers alone: a key's trigger
    state is decoded when an epoch first touches it (`_entry`). PySpark gives a
    partition no affinity to a Python worker, so most epochs restore (NEXMark Q5
    streaming at 300k events: 47 of 64 GroupByKey loads, 0.7-0.9 s each when
    every key was decoded, most of an epoch's fixed cost).

    For a non-merging WindowFn the trigger driver keeps its state per window
    (Beam's driver always goes through `MergeableStateAdapter`, whose window-id
    bookkeeping cost 60% of its time per element), and a window's state goes as
    soon as the watermark passes its end plus the allowed lateness, so a key
    that lives for ever (a global combine, a few hot keys) holds only its live
    windows.
    """

    def __init__(self, *args, value_coder_impl, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Values wait in the trigger state encoded: a key's state is decoded and
        # encoded again each epoch that touches it, and bytes pickle at C speed
        # where user objects do not (NEXMark Q4 streaming: unpickling the bids
        # waiting per auction was 21% of all Python worker time).
        self._value_coder = value_coder_impl
        self._lateness = self._windowing.allowed_lateness.micros
        self.clock = EpochClock()
        self._driver = _StreamingTriggerDriver(self._windowing, self.clock)
        self._merging = self._windowing.windowfn.is_merging()
        self._driver.is_merging = self._merging
        # encoded key -> (user key, trigger state), or the key's encoded entry
        # (`_encode_entry`) until an epoch touches it.
        self._keys: dict[bytes, tuple[object, trigger.InMemoryUnmergedState] | bytes] = {}
        self._indexed: dict[bytes, tuple[int | None, int | None, int | None]] = {}
        self._event_due: SortedList = SortedList()  # (earliest event-time timer, key)
        self._clock_due: SortedList = SortedList()  # (earliest processing-time timer, key)
        self._holds: SortedList = SortedList()  # (earliest watermark hold, key)
        self._expiry = KeyedStateIndex()
        self._changed: set[bytes] = set()  # keys changed since the last state_delta
        # Off only for comparison benchmarks (--no_keyed_state_gc): expired keys stay.
        self.keyed_state_gc = True

    def __len__(self) -> int:
        return len(self._keys)

    def sizes(self) -> dict[str, int]:
        return {'keys': len(self._keys),
                'timers': len(self._event_due) + len(self._clock_due)}

    # State across epochs ---------------------------------------------------------
    def state_delta(self) -> tuple[dict[bytes, bytes], set[bytes]]:
        """What changed since the last call: each changed key's user key and trigger
        state under b'k' + encoded key (deleted once expired), plus b'm': the input
        watermark and processing time."""
        changed, self._changed = self._changed, set()
        dirty: dict[bytes, bytes] = {}
        deleted: set[bytes] = set()
        for encoded in changed:
            entry = self._keys.get(encoded)
            if entry is None:
                deleted.add(b'k' + encoded)
            elif not isinstance(entry, bytes):
                event_time, clock_time, hold = self._indexed[encoded]
                dirty[b'k' + encoded] = _encode_entry(
                    (event_time, clock_time, hold, self._expiry.windows(encoded)),
                    _encode_key_state(*entry))
        dirty[b'm'] = pickle.dumps((self.watermarks.current(), self.clock.micros))
        return dirty, deleted

    def restore_state(self, state: Mapping[bytes, bytes]) -> None:
        """Rebuilds the keys and every index from the full state `state_delta` wrote
        (called on a fresh operator, with {} for the initial state)."""
        for name, value in state.items():
            if name[:1] == b'k':
                encoded = name[1:]
                event_time, clock_time, hold, windows = _entry_header(value)
                self._keys[encoded] = value if isinstance(value, bytes) else bytes(value)
                self._index(encoded, (event_time, clock_time, hold))
                self._expiry.restore_key(encoded, windows)
            elif name == b'm':
                watermark, now = pickle.loads(value)
                self.clock.micros = now
                self.watermarks.advance('input', watermark)
        self._changed = set()

    # The operator contract ---------------------------------------------------------
    def process_bundle(self, bundle: Bundle) -> list[Record]:
        by_key: dict[bytes, list] = {}
        encode_key = self._key_coder.encode_nested
        encode_value = self._value_coder.encode
        for _, chunk in bundle:
            for windowed in self._input_coder.decode_all(chunk):
                key, value = windowed.value
                encoded = encode_key(key)
                values = by_key.get(encoded)
                if values is None:
                    values = by_key[encoded] = []
                    if encoded not in self._keys:
                        self._keys[encoded] = (key, trigger.InMemoryUnmergedState())
                values.append(windowed.with_value(encode_value(value)))
        # The input watermark stands for the output watermark too, as in Beam's own
        # trigger transcripts: a hold of this operator must not make an element
        # that is late for the input look early (transcript `early_late_sessions`).
        input_watermark = Timestamp(micros=self.watermarks.current())
        out = self._output()
        for encoded, values in by_key.items():
            key, state = self._entry(encoded)
            out.extend(key, self._driver.process_elements(
                state, values, input_watermark, input_watermark))
            self._reindex(encoded)
        return out.records()

    def on_input_watermark(self, watermark: int) -> list[Record]:
        out = self._output()
        self._fire(self._event_due, watermark, out)
        if watermark >= MAX_WATERMARK:
            # The input has ended, so processing time runs out too, as for the timers of
            # `par_do.FusedStageOperator` and in the batch GroupByKey
            # (`_process_entire_key`): no pane waits for the wall clock (or, under a
            # TestStream, for a processing-time advance that never comes).
            self.clock.micros = MAX_WATERMARK
            self._fire(self._clock_due, MAX_WATERMARK, out)
            self._fire(self._event_due, MAX_WATERMARK, out)
        self._expire(watermark)
        return out.records()

    def on_processing_time(self, now: int) -> list[Record]:
        """Advances processing time to `now` (micros) and fires what became due."""
        self.clock.micros = max(self.clock.micros, now)
        out = self._output()
        self._fire(self._clock_due, self.clock.micros, out)
        return out.records()

    def _output(self) -> _Output:
        return _Output(self._output_coder, self._output_id, self._bundle_size,
                       self._value_coder.decode)

    def output_watermark(self) -> int:
        watermark = self.watermarks.current()
        if self._holds:
            watermark = min(watermark, self._holds[0][0])
        return watermark

    def next_processing_time(self) -> int | None:
        """When the earliest processing-time timer fires, or None."""
        return self._clock_due[0][0] if self._clock_due else None

    # Firing ------------------------------------------------------------------------
    def _fire(self, due_index: SortedList, up_to: int, out: _Output) -> None:
        # Firing may set new timers that are due at once (e.g. a repeated trigger).
        while due_index and due_index[0][0] <= up_to:
            keys = [key for _, key in due_index.irange(
                maximum=(up_to + 1,), inclusive=(True, False))]
            watermark = Timestamp(micros=self.watermarks.current())
            now = Timestamp(micros=self.clock.micros)
            for encoded in keys:
                key, state = self._entry(encoded)
                fired, _ = state.get_timers(clear=True, watermark=watermark, processing_time=now)
                for window_id, (name, domain, timestamp, _) in fired:
                    out.extend(key, self._driver.process_timer(
                        window_id, name, domain, timestamp, state, watermark))
                self._reindex(encoded)

    def _expire(self, watermark: int) -> None:
        if not self.keyed_state_gc:
            return
        for encoded in self._expiry.candidates(watermark - self._lateness):
            latest = self._expiry.latest_window(encoded)
            if latest is None or latest + self._lateness >= watermark:
                if not self._merging:
                    self._expire_windows(encoded, watermark)
                continue
            event_time, clock_time, _ = self._indexed[encoded]
            if event_time is not None or clock_time is not None:
                continue  # a timer is still to fire
            del self._keys[encoded]
            self._reindex(encoded)

    def _expire_windows(self, encoded: bytes, watermark: int) -> None:
        """Drops the windows of a live key that no element can reach any more (past
        their end plus the allowed lateness, as Beam's driver drops late elements)
        and that wait for no timer."""
        _, state = self._entry(encoded)
        expired = [window for window in state.state
                   if window.end.micros + self._lateness < watermark
                   and window not in state.timers]
        if expired:
            for window in expired:
                del state.state[window]
            self._reindex(encoded)

    def _entry(self, encoded: bytes) -> tuple[object, trigger.InMemoryUnmergedState]:
        """The user key and trigger state of `encoded`, decoded on first use."""
        entry = self._keys[encoded]
        if isinstance(entry, bytes):
            entry = self._keys[encoded] = _decode_key_state(_entry_body(entry))
        return entry

    # Indexes -----------------------------------------------------------------------
    def _reindex(self, encoded: bytes) -> None:
        """Re-files `encoded` in every index after its state changed (or went)."""
        self._changed.add(encoded)
        old = self._indexed.pop(encoded, None)
        if old is not None:
            for index, value in zip((self._event_due, self._clock_due, self._holds), old,
                                    strict=True):
                if value is not None:
                    index.remove((value, encoded))
        self._expiry.remove_key(encoded)
        if encoded not in self._keys:
            return
        state = self._entry(encoded)[1]
        event_time = clock_time = None
        for timers in state.timers.values():
            for (_, domain, _), timestamp in timers.items():
                micros = timestamp.micros
                if domain == TimeDomain.WATERMARK:
                    event_time = micros if event_time is None else min(event_time, micros)
                else:
                    clock_time = micros if clock_time is None else min(clock_time, micros)
        _compact_holds(state)
        hold = state.get_earliest_hold()
        hold_micros = hold.micros if hold < MAX_TIMESTAMP else None
        self._index(encoded, (event_time, clock_time, hold_micros))
        windows = (trigger.MergeableStateAdapter(state).known_windows() if self._merging
                   else {*state.state, *state.timers})
        for window in windows:
            self._expiry.add_window(encoded, window.max_timestamp().micros)

    def _index(self, encoded: bytes, due: tuple[int | None, int | None, int | None]) -> None:
        """Files `encoded` by its earliest event-time timer, processing-time timer and
        watermark hold (each None if it has none)."""
        for index, value in zip((self._event_due, self._clock_due, self._holds), due,
                                strict=True):
            if value is not None:
                index.add((value, encoded))
        self._indexed[encoded] = due


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


# The tag of a window's watermark holds: the name Beam's
# `InMemoryUnmergedState.get_earliest_hold` reads (it assumes it, as does Beam's
# `GeneralTriggerDriver.WATERMARK_HOLD`).
_HOLD_TAG = 'watermark'


# A key's entry in the versioned state: the length of its header, the header
# (marshal: event-time timer, processing-time timer, hold, expiry windows; what
# `restore_state` indexes without decoding), then `_encode_key_state`.
_HEADER_LENGTH = struct.Struct('<I')


def _encode_entry(header: tuple, body: bytes) -> bytes:
    encoded_header = marshal.dumps(header)
    return _HEADER_LENGTH.pack(len(encoded_header)) + encoded_header + body


def _entry_header(entry: bytes) -> tuple:
    (length,) = _HEADER_LENGTH.unpack_from(entry)
    return marshal.loads(memoryview(entry)[_HEADER_LENGTH.size:_HEADER_LENGTH.size + length])


def _entry_body(entry: bytes) -> memoryview:
    (length,) = _HEADER_LENGTH.unpack_from(entry)
    return memoryview(entry)[_HEADER_LENGTH.size + length:]


def _encode_key_state(key, state: trigger.InMemoryUnmergedState) -> bytes:
    """One key's user key and trigger state (Beam's `InMemoryUnmergedState`, whose
    defaultdicts hold a lambda, as plain dicts in their order: firing order follows it)."""
    plain = (key,
             [(window, list(timers.items())) for window, timers in state.timers.items()],
             [(window, list(tagged.items())) for window, tagged in state.state.items()],
             state.global_state, state.defensive_copy)
    try:
        return pickle.dumps(plain, pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        # A user type only cloudpickle can carry (e.g. defined in the main module).
        return cloudpickle.dumps(plain, pickle.HIGHEST_PROTOCOL)


def _decode_key_state(data: bytes) -> tuple[object, trigger.InMemoryUnmergedState]:
    key, timers, tagged_states, global_state, defensive_copy = pickle.loads(data)
    state = trigger.InMemoryUnmergedState(defensive_copy=defensive_copy)
    for window, window_timers in timers:
        state.timers[window] = dict(window_timers)
    for window, tagged in tagged_states:
        state.state[window].update(tagged)
    state.global_state = global_state
    return key, state


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
