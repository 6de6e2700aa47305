"""GroupByKey across epochs: a key's panes over the keyed-state backend.

Design section 7. The reduce side of a streaming GroupByKey groups a bundle's
values per key and hands them to the key's panes, kept in the partition's
`KeyedStateBackend` (encoded by `TriggerStateCodec`): `WindowEndPanes` for
Beam's default trigger over a non-merging WindowFn (most windowed
aggregations), Beam's own trigger driver (`BeamTriggerPanes`) for every other
trigger, merging WindowFn and allowed lateness. After every change the key is
re-filed in the backend (`_reindex`): one timer per key and time domain at its
earliest timer, its earliest watermark hold as the key's hold, and its windows
in the expiry index. So a watermark or clock advance touches only the keys that
are due, the output hold is the backend's earliest hold, and expired keys are
found by a range scan. A restored backend indexes every key from its header and
decodes a key's state when an epoch first touches it: PySpark gives a
partition no affinity to a Python worker, so most epochs restore (NEXMark Q5
streaming at 300k events: 47 of 64 GroupByKey loads, 0.7-0.9 s each when every
key was decoded).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.records import MAX_WATERMARK, ChunkBuilder, Record
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.translators import window_end_panes
from beam_streams_runner.translators.beam_trigger_panes import (
    TRIGGER_STATE_CODEC,
    BeamTriggerPanes,
)
from beam_streams_runner.translators.group_by_key import GroupingCoders
from beam_streams_runner.translators.operator import Bundle, Operator

__all__ = ['TRIGGER_STATE_CODEC', 'KeyPanes', 'StreamingGroupByKeyOperator', 'key_panes']


class KeyPanes(Protocol):
    """A key's panes: what the operator asks of the state it keeps per key."""

    namespace: str  # the key's state in the backend: (namespace, (user key, state))
    drops_windows: bool  # whether `expire_windows` can drop any window

    def new_state(self) -> Any: ...

    def process_elements(self, state: Any, values: list,
                         watermark: Timestamp) -> Iterator[WindowedValue]:
        """Adds a bundle's values of the key (windowed, each value encoded); yields
        the panes that fire at once."""

    def fire(self, state: Any, watermark: Timestamp, now: Timestamp) -> Iterator[WindowedValue]:
        """Yields the panes of the key's timers due at `watermark` and `now`."""

    def index(self, state: Any) -> tuple[int | None, int | None, int | None, list[int]]:
        """The key's earliest event-time timer, processing-time timer and watermark
        hold (micros, None: none), and its windows' max timestamps."""

    def expire_windows(self, state: Any, before: int) -> bool:
        """Drops the windows ending before `before` that wait for no timer; whether
        any went (only asked when `drops_windows`)."""


def key_panes(windowing, state: KeyedStateBackend) -> KeyPanes:
    """The panes `windowing` needs: `WindowEndPanes` where it applies, else Beam's."""
    if window_end_panes.applies_to(windowing):
        return window_end_panes.WindowEndPanes(windowing)
    return BeamTriggerPanes(windowing, state)


class StreamingGroupByKeyOperator(Operator):
    """Reduce side of GroupByKey in streaming: a key's panes per key, with their state
    in the partition's keyed-state backend (see the module docstring)."""

    def __init__(self, coders: GroupingCoders, windowing, output_id: str, bundle_size: int,
                 state: KeyedStateBackend, keyed_state_gc: bool = True,
                 panes: KeyPanes | None = None) -> None:
        self._coders = coders
        self._output_id = output_id
        self._bundle_size = bundle_size
        self._state = state
        # Off only for comparison benchmarks (--no_keyed_state_gc): expired keys stay.
        self._keyed_state_gc = keyed_state_gc
        self._lateness = windowing.allowed_lateness.micros
        self._panes = key_panes(windowing, state) if panes is None else panes
        self._namespace = self._panes.namespace

    def sizes(self) -> dict[str, int]:
        state = self._state
        return {'keys': len(state.keys()), 'timers': state.timer_count()}

    # The operator contract ---------------------------------------------------------
    def process_bundle(self, bundle: Bundle) -> list[Record]:
        # Values wait in the key's state encoded: a key's state is decoded and
        # encoded again each epoch that touches it, and bytes pickle at C speed
        # where user objects do not (NEXMark Q4 streaming: unpickling the bids
        # waiting per auction was 21% of all Python worker time).
        by_key: dict[bytes, list] = {}
        state = self._state
        panes = self._panes
        namespace = self._namespace
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
                        state.put(encoded, namespace, (key, panes.new_state()))
                values.append(windowed.with_value(encode_value(value)))
        watermark = Timestamp(micros=state.watermark)
        out = self._output()
        for encoded, values in by_key.items():
            key, key_state = self._key_state(encoded)
            out.extend(key, panes.process_elements(key_state, values, watermark))
            self._reindex(encoded, key_state)
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
                key, key_state = self._key_state(encoded)
                out.extend(key, self._panes.fire(key_state, watermark, now))
                self._reindex(encoded, key_state)

    def _expire(self, watermark: int) -> None:
        if not self._keyed_state_gc:
            return
        state = self._state
        for encoded in state.expiry.candidates(watermark - self._lateness):
            latest = state.expiry.latest_window(encoded)
            if latest is None or latest + self._lateness >= watermark:
                # Drops the windows of a live key that no element can reach any
                # more (past their end plus the allowed lateness, as Beam's driver
                # drops late elements) and that wait for no timer. A merged window's
                # parts cannot go one by one: its key's state is not even read.
                if self._panes.drops_windows:
                    _, key_state = self._key_state(encoded)
                    if self._panes.expire_windows(key_state, watermark - self._lateness):
                        self._reindex(encoded, key_state)
                continue
            if not state.has_timers(encoded):  # else a timer is still to fire
                state.delete_key(encoded)

    def _key_state(self, encoded: bytes) -> tuple:
        entry = self._state.get(encoded, self._namespace)
        if entry is None:
            raise RuntimeError(
                f'The GroupByKey state of key {encoded!r} is not in the form this runner '
                f'keeps it ({self._namespace!r}; it holds {self._state.namespaces(encoded)}): '
                'the checkpoint was written by another version of the runner. Resume it '
                'with that version, or start over with --restart_from_scratch.')
        return entry

    def _reindex(self, encoded: bytes, key_state) -> None:
        """Re-files `encoded` in the backend after its state changed: its earliest
        timer per time domain, its earliest hold and its windows."""
        state = self._state
        state.mark_changed(encoded)
        event_time, clock_time, hold, windows = self._panes.index(key_state)
        timer_id = (encoded,)
        for queue, micros in ((state.event_timers, event_time),
                              (state.processing_timers, clock_time)):
            if micros is None:
                queue.clear(timer_id)
            elif queue.fire_timestamp(timer_id) != micros:
                # A key's timer holds nothing: the key's state holds do. Set again
                # as it is, it would only move behind the keys set after it.
                queue.set(timer_id, micros, None, MAX_WATERMARK)
        state.set_hold(encoded, hold if hold is not None and hold < MAX_WATERMARK else None)
        windows = sorted(set(windows))
        indexed = state.expiry.windows(encoded)
        if indexed != windows:
            if any(window not in windows for window in indexed):
                state.expiry.remove_key(encoded)
                indexed = []
            for window in windows:
                if window not in indexed:
                    state.add_window(encoded, window)


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
