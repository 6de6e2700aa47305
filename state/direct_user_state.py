"""A stateful DoFn's user state and timers, straight in the partition's keyed-state backend.

Design section 7 ("keep encode/decode off the per-element path") and section 9 (Beam's
own machinery: the harness's `DoFnRunner` still runs the DoFn; only its
`UserStateContext` changes). Beam's `FnApiUserStateContext` serves a DoFn's state
through the Fn API state protocol: every (state, key, window) a bundle touches becomes a
`StateKey` proto, its bytes are fetched and decoded, and at the bundle's end encoded and
written back; every timer set is encoded onto a timer stream that the runner decodes
again. `DirectUserStateContext`, which the runner's bundle processors use instead:

* keeps bag, combining, read-modify-write and set states as `DecodedCell`s in the
  backend, under the same key (the encoded user key) and namespace (transform, state id,
  encoded window) as the protocol, decoded while they live there and encoded with the
  state's coder only when a checkpoint pickles them (as the protocol's chunks, so a
  restored cell is read either way); a combining state holds one accumulator;
* sets and clears timers in the backend's timer queues at once, with the id and
  payload the runner's timer reader gives them (`beam_timers`).

Ordered-list and multimap states keep the protocol (`state_handler`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils import timestamp

from beam_streams_runner.state.backend import EVENT_TIME, PROCESSING_TIME, KeyedStateBackend


class DecodedCell:
    """A bag of decoded values in the backend, pickled as the protocol's bag: a list of
    one chunk, the values' nested encodings."""

    __slots__ = ('coder', 'values')

    def __init__(self, coder: Any, values: list) -> None:
        self.coder = coder  # the state's coder impl
        self.values = values

    def __reduce__(self) -> tuple:
        encode = self.coder.encode_nested
        return list, ([b''.join(encode(value) for value in self.values)],)

    def __eq__(self, other: object) -> bool:
        return type(other) is DecodedCell and other.values == self.values

    __hash__ = None  # type: ignore[assignment] - mutable

    def __repr__(self) -> str:
        return f'DecodedCell({self.values!r})'


def decoded(backend: KeyedStateBackend, key: bytes, namespace: tuple,
            coder: Any) -> DecodedCell | None:
    """The cell of `key` and `namespace` decoded (a restored or protocol-written cell,
    a list of encoded chunks, is decoded once and kept so), or None if empty."""
    cell = backend.get(key, namespace)
    if cell is None or type(cell) is DecodedCell:
        return cell
    cell = DecodedCell(coder, [value for chunk in cell for value in coder.decode_all(chunk)])
    backend.swap(key, namespace, cell)
    return cell


class _Cell:
    """One (state, key, window) of a bundle: finds its cell once, and writes it (the
    harness keeps one state object per cell and bundle)."""

    def __init__(self, context: DirectUserStateContext, spec: userstate.StateSpec, key: bytes,
                 namespace: tuple, window_end: int) -> None:
        self._backend = context.backend()
        self._coder = spec.coder.get_impl()
        self._key = key
        self._namespace = namespace
        self._window_end = window_end
        self._cell: DecodedCell | None = None  # found, and written in this bundle

    def _values(self) -> list:
        cell = self._cell
        if cell is None:
            cell = decoded(self._backend, self._key, self._namespace, self._coder)
            if cell is None:
                return []
        return cell.values

    def _write(self, values: list) -> None:
        backend = self._backend
        cell = self._cell
        if cell is None:
            cell = decoded(backend, self._key, self._namespace, self._coder)
            if cell is None:
                cell = DecodedCell(self._coder, values)
                backend.put(self._key, self._namespace, cell)
            # The cell's window joins the key's expiry index once a bundle.
            backend.add_window(self._key, self._window_end)
            self._cell = cell
        cell.values = values
        backend.mark_changed(self._key)

    def clear(self) -> None:
        self._cell = None
        self._backend.delete(self._key, self._namespace)

    def commit(self) -> None:
        pass  # written as it changes

    def prefetch(self) -> None:
        pass

    def finalize(self) -> None:
        pass


class DirectBagState(_Cell, userstate.BagRuntimeState):
    def read(self) -> Iterable[Any]:
        return list(self._values())

    def add(self, value: Any) -> None:
        values = self._values()
        values.append(value)
        self._write(values)


class DirectReadModifyWriteState(_Cell, userstate.ReadModifyWriteRuntimeState):
    def read(self) -> Any:
        values = self._values()
        return values[-1] if values else None

    def write(self, value: Any) -> None:
        self._write([value])


class DirectSetState(_Cell, userstate.SetRuntimeState):
    _members: set | None = None  # the cell's values as a set, while this bundle runs

    def read(self) -> set:
        return set(self._values())

    def add(self, value: Any) -> None:
        values = self._values()
        if self._members is None:
            self._members = set(values)
        if value not in self._members:
            self._members.add(value)
            values.append(value)
            self._write(values)

    def clear(self) -> None:
        self._members = None
        super().clear()


class DirectCombiningState(_Cell, userstate.CombiningValueRuntimeState):
    """One accumulator, merged from the cell's accumulators when it was decoded."""

    def __init__(self, context: DirectUserStateContext, spec: userstate.StateSpec,
                 key: bytes, namespace: tuple, window_end: int) -> None:
        super().__init__(context, spec, key, namespace, window_end)
        self._fn = context.combine_fn(spec)

    def _accumulator(self) -> Any:
        values = self._values()
        if not values:
            return self._fn.create_accumulator()
        if len(values) > 1:
            values[:] = [self._fn.merge_accumulators(values)]
        return values[0]

    def read(self) -> Any:
        return self._fn.extract_output(self._accumulator())

    def add(self, value: Any) -> None:
        self._write([self._fn.add_input(self._accumulator(), value)])


_STATES = {userstate.BagStateSpec: DirectBagState,
           userstate.ReadModifyWriteStateSpec: DirectReadModifyWriteState,
           userstate.SetStateSpec: DirectSetState,
           userstate.CombiningValueStateSpec: DirectCombiningState}


class DirectTimer(userstate.BaseTimer):
    """A timer of one key and window, set in the backend's queue of its time domain as
    the harness would have written it (see `beam_timers.TimerReader`)."""

    def __init__(self, context: DirectUserStateContext, spec: userstate.TimerSpec, key: Any,
                 window: Any, input_timestamp: timestamp.Timestamp, pane: Any) -> None:
        self._context = context
        self._family = (context.transform_id, spec.name)
        self._event_time = TimeDomain.is_event_time(spec.time_domain)
        self._coder = context.timer_coder(spec.name)
        self._key = key
        self._window = window
        self._input_timestamp = input_timestamp
        self._pane = pane

    def set(self, ts: timestamp.TimestampTypes, dynamic_timer_tag: str = '') -> None:
        ts = timestamp.Timestamp.of(ts)
        hold = ts if self._event_time else self._input_timestamp
        key, ident = self._context.timer_id(self._coder, self._key, dynamic_timer_tag,
                                            self._window)
        timer_id = (key, self._family, ident)
        # A timer set again as this bundle last set it keeps its encoding (the queue
        # then sees the same payload and leaves the timer in place).
        sets = self._context.timer_sets
        last = sets.get(timer_id)
        if last is not None and last[0] == ts and last[1] == hold and last[2] == self._pane:
            payload = last[3]
        else:
            payload = self._coder.encode_nested(userstate.Timer(
                user_key=self._key, dynamic_timer_tag=dynamic_timer_tag,
                windows=(self._window,), clear_bit=False, fire_timestamp=ts,
                hold_timestamp=hold, paneinfo=self._pane))
            sets[timer_id] = (ts, hold, self._pane, payload)
        self._queue().set(timer_id, _millis(ts), payload, _millis(hold))

    def clear(self, dynamic_timer_tag: str = '') -> None:
        key, ident = self._context.timer_id(self._coder, self._key, dynamic_timer_tag,
                                            self._window)
        self._queue().clear((key, self._family, ident))

    def _queue(self):
        return self._context.backend().timers(EVENT_TIME if self._event_time
                                              else PROCESSING_TIME)


class DirectUserStateContext(bundle_processor.FnApiUserStateContext):
    """Beam's user state context, with bag, combining, read-modify-write and set states
    and timers kept in the keyed-state backend of the task now running (the one the
    worker's state router points at); other state kinds go through the protocol."""

    def __init__(self, state_handler, transform_id: str, key_coder, window_coder) -> None:
        super().__init__(state_handler, transform_id, key_coder, window_coder)
        self.transform_id = transform_id
        # The harness's caching handler wraps the worker's router (`runtime`).
        self._router = getattr(state_handler, '_underlying', state_handler)
        self._key_impl = key_coder.get_impl()
        self._window_impl = window_coder.get_impl()
        self._windows: dict[Any, tuple[bytes, int]] = {}
        self._timer_ids: dict[tuple, bytes] = {}
        self._combine_fns: dict[str, Any] = {}
        # timer id -> (fire timestamp, hold, pane, encoding) of this bundle's last set
        self.timer_sets: dict[tuple, tuple] = {}

    def backend(self) -> KeyedStateBackend:
        return self._router.target.state

    def get_state(self, spec: userstate.StateSpec, key: Any, window: Any) -> Any:
        # Beam's own keys its cache by the window itself, whose hash is Python code.
        cache_key = (spec, key, _window_key(window))
        state = self._all_states.get(cache_key)
        if state is None:
            state = self._all_states[cache_key] = self._create_state(spec, key, window)
        return state

    def get_timer(self, timer_spec: userstate.TimerSpec, key: Any, window: Any,
                  timestamp: timestamp.Timestamp, pane: Any) -> DirectTimer:
        return DirectTimer(self, timer_spec, key, window, timestamp, pane)

    def timer_coder(self, family: str) -> Any:
        return self._timers_info[family].timer_coder_impl

    def timer_id(self, coder: Any, key: Any, tag: str, window: Any) -> tuple[bytes, bytes]:
        """(encoded user key, encoded tag and windows) of a timer, as the timer reader
        cuts them from its encoding."""
        cache_key = (tag, _window_key(window))
        ident = self._timer_ids.get(cache_key)
        if ident is None:
            if len(self._timer_ids) > 10_000:
                self._timer_ids.clear()  # windows come and go
            ident = self._timer_ids[cache_key] = (
                coder._tag_coder_impl.encode_nested(tag)
                + coder._windows_coder_impl.encode_nested((window,)))
        return coder._key_coder_impl.encode_nested(key), ident

    def combine_fn(self, spec: userstate.CombiningValueStateSpec) -> Any:
        """The spec's CombineFn, copied and set up once per bundle (torn down at `reset`)."""
        fn = self._combine_fns.get(spec.name)
        if fn is None:
            fn = self._combine_fns[spec.name] = copy.deepcopy(spec.combine_fn)
            fn.setup()
        return fn

    def _create_state(self, state_spec: userstate.StateSpec, key: Any, window: Any):
        kind = _STATES.get(type(state_spec))
        if kind is None:
            return super()._create_state(state_spec, key, window)
        window_key = _window_key(window)
        encoded = self._windows.get(window_key)
        if encoded is None:
            if len(self._windows) > 10_000:
                self._windows.clear()
            encoded = self._windows[window_key] = (self._window_impl.encode(window),
                                               window.max_timestamp().micros)
        namespace = (self.transform_id, state_spec.name, encoded[0])
        return kind(self, state_spec, self._key_impl.encode_nested(key), namespace,
                    encoded[1])

    def reset(self) -> None:
        super().reset()
        for fn in self._combine_fns.values():
            fn.teardown()
        self._combine_fns.clear()
        self.timer_sets.clear()


def _window_key(window: Any) -> Any:
    """A window as a dict key: an interval window's bounds (cheaper to hash than it)."""
    if type(window) is IntervalWindow:
        return window._start_micros, window._end_micros
    return window


def _millis(ts: timestamp.Timestamp) -> int:
    """Micros of `ts` cut to the millisecond, as Beam's timer encoding keeps it."""
    return ts.micros // 1000 * 1000


@contextlib.contextmanager
def direct_user_state() -> Iterator[None]:
    """Bundle processors built in this block use `DirectUserStateContext` (the harness
    looks Beam's class up by name when it builds a stateful ParDo)."""
    previous = bundle_processor.FnApiUserStateContext
    bundle_processor.FnApiUserStateContext = DirectUserStateContext
    try:
        yield
    finally:
        bundle_processor.FnApiUserStateContext = previous
