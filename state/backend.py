"""The keyed-state backend: the one state service every stateful operator is handed.

Design sections 7 and 8 (after Li et al., PVLDB 11(12) 2018, section 4.3, and
Flink's `KeyedStateBackend` with its `InternalTimerService`). A stateful ParDo's
user state and timers, a GroupByKey's trigger state and holds, and a side-input
gate's pushed-back elements all live in a `KeyedStateBackend`; the operators
read and write values per (key, namespace) and never see how they are stored,
indexed or checkpointed.

What the backend keeps per key:

* values per namespace (an operator's cell id, its trigger state, a pushed-back
  pair), encoded together by the backend's `ValueCodec`;
* the key's windows in the ordered expiry index (`KeyedStateIndex`), so a
  watermark advance finds the keys that may expire by a range scan;
* its timers, in one `TimerQueue` per time domain for the whole partition;
* a watermark hold of its own (a GroupByKey's trigger state holds).

And per partition: named values (`get_meta`/`put_meta`), the input watermark
and processing time the operator has advanced to.

Checkpoint hooks (design section 8; the consistent-region controller calls
them through the cache): every change marks its key; `take_delta` encodes each
changed key whole (or lists it deleted) since the last call, `snapshot` gives
the full state, `restore` rebuilds from a full state. A key's persisted value is
a header (marshal: windows, hold, timers) then the codec's encoding of its
values; `restore` indexes every header at once and keeps the values encoded
until the key is first used, because a task lands in another Python worker most
epochs (PySpark has no task affinity) and a restore touching every value would
cost the whole state each epoch.
"""

from __future__ import annotations

import contextlib
import gc
import marshal
import pickle
import struct
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from sortedcontainers import SortedList

from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK
from beam_streams_runner.state.keyed_state import KeyedStateIndex
from beam_streams_runner.state.timers import PendingTimer, TimerQueue

Namespace = Hashable
EVENT_TIME = 'event'
PROCESSING_TIME = 'processing'

_KEY = b'k'  # + encoded key: one key's header and values
_META = b'm'  # the partition's named values, watermark and timer arrival numbers
_HEADER_LENGTH = struct.Struct('<I')


def never_pinned(key: bytes) -> bool:
    """No key is pinned (no side-input gate holds elements of it)."""
    return False


class ValueCodec(Protocol):
    """How one key's values, `[(namespace, value), ...]`, become bytes and back."""

    def encode(self, values: list[tuple[Namespace, Any]]) -> bytes: ...

    def decode(self, data: bytes | memoryview) -> list[tuple[Namespace, Any]]: ...


@runtime_checkable
class PagedState(Protocol):
    """A full state read on demand (a partition's live copy on its host: see
    `host_state.HostStateView`)."""

    def scan(self) -> Iterator[tuple[bytes, bytes | memoryview, int]]:
        """Every key with the head of its value (a buffer valid until the next item: at
        least its `head_length`) and the length of the rest."""

    def fetch(self, name: bytes) -> bytes | None:
        """One key's value."""

    def moved_to(self, revision: Any) -> None:
        """Its reader's commit moved it to `revision`."""


class PickleCodec:
    """Values as pickle writes them (bytes, lists, tuples, sorted containers)."""

    def encode(self, values: list[tuple[Namespace, Any]]) -> bytes:
        return pickle.dumps(values, pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes | memoryview) -> list[tuple[Namespace, Any]]:
        return pickle.loads(data)


PICKLE_CODEC = PickleCodec()


class KeyedStateBackend:
    """One operator partition's keyed state, timers, holds and expiry index."""

    def __init__(self, codec: ValueCodec = PICKLE_CODEC, track_changes: bool = False) -> None:
        self._codec = codec
        self._reset()
        if track_changes:
            self._track()

    def _reset(self) -> None:
        self._values: dict[bytes, dict[Namespace, Any]] = {}
        # Restored, not decoded yet; None: in the paged state, not read yet either.
        self._raw: dict[bytes, bytes | memoryview | None] = {}
        self._paged: PagedState | None = None
        self.expiry = KeyedStateIndex()
        self.event_timers = TimerQueue()
        self.processing_timers = TimerQueue()
        self._holds: dict[bytes, int] = {}
        self._hold_order: SortedList = SortedList()  # (hold, key)
        self._meta: dict[str, Any] = {'watermark': MIN_WATERMARK, 'processing_time': 0}
        self._changed: set[bytes] | None = None
        self._new: set[bytes] = set()  # keys created since the last delta
        self._derived: dict[str, Any] = {}

    # Values per (key, namespace) ------------------------------------------------------
    def get(self, key: bytes, namespace: Namespace, default: Any = None) -> Any:
        values = self._values.get(key)
        if values is None:
            if key not in self._raw:
                return default
            values = self._decode(key)
        return values.get(namespace, default)

    def put(self, key: bytes, namespace: Namespace, value: Any) -> None:
        values = self._values.get(key)
        if values is None:
            if key in self._raw:
                values = self._decode(key)
            else:
                changed = self._changed
                if changed is not None and key not in changed and not self._indexed(key):
                    self._new.add(key)  # first touched this interval, and nowhere before
                values = self._values[key] = {}
        values[namespace] = value
        if self._changed is not None:
            self._changed.add(key)

    def delete(self, key: bytes, namespace: Namespace) -> None:
        values = self._values.get(key)
        if values is None:
            if key not in self._raw:
                return
            values = self._decode(key)
        if values.pop(namespace, _MISSING) is not _MISSING:
            if not values:
                del self._values[key]
            if self._changed is not None:
                self._changed.add(key)

    def swap(self, key: bytes, namespace: Namespace, value: Any) -> None:
        """Replaces the value of `key` in `namespace` by another form of the same value
        (decoded, say): no change to checkpoint."""
        values = self._values.get(key)
        if values is None:
            values = self._decode(key)
        values[namespace] = value

    def mark_changed(self, key: bytes) -> None:
        """A value of `key` was changed in place (a list appended to, a trigger state)."""
        if self._changed is not None:
            self._changed.add(key)

    def namespaces(self, key: bytes) -> list[Namespace]:
        values = self._values.get(key)
        if values is None:
            if key not in self._raw:
                return []
            values = self._decode(key)
        return list(values)

    def keys(self) -> set[bytes]:
        """The keys holding values."""
        return self._values.keys() | self._raw.keys()

    def all_keys(self) -> set[bytes]:
        """The keys holding anything: values, windows, timers or a hold."""
        return (self._values.keys() | self._raw.keys() | self.expiry.keys()
                | self._holds.keys() | self.event_timers.keys()
                | self.processing_timers.keys())

    def __contains__(self, key: bytes) -> bool:
        return key in self._values or key in self._raw

    def live_keys(self) -> int:
        """Keys holding values, or windows not collected yet (a key whose values were
        cleared stays in the expiry index until its windows expire)."""
        return len(self._values.keys() | self._raw.keys() | self.expiry.keys())

    def delete_key(self, key: bytes) -> None:
        """Drops everything `key` holds: values, windows, timers and hold."""
        self._values.pop(key, None)
        self._raw.pop(key, None)
        self.expiry.remove_key(key)
        for queue in (self.event_timers, self.processing_timers):
            for _, timer in queue.timers_of(key):
                queue.clear(timer.timer_id)
        self.set_hold(key, None)
        if self._changed is not None:
            self._changed.add(key)

    def _decode(self, key: bytes) -> dict[Namespace, Any]:
        body = self._raw.pop(key)
        if body is None:
            body = self._paged_body(key)
        values = self._values[key] = dict(self._codec.decode(body))
        return values

    def _paged_body(self, key: bytes) -> memoryview:
        value = self._paged.fetch(_KEY + key)
        if value is None:
            raise RuntimeError(f'The paged state {self._paged!r} lacks the values of key '
                               f'{key!r} that its scan listed')
        return split_entry(value)[1]

    def paged_moved_to(self, revision: Any) -> None:
        """The paged state this backend was restored from moved to `revision` by this
        backend's own commit (the values it still reads from there did not change)."""
        if self._paged is not None:
            self._paged.moved_to(revision)

    def _indexed(self, key: bytes) -> bool:
        return (key in self._holds or self.expiry.latest_window(key) is not None
                or self.event_timers.has_timers_for_key(key)
                or self.processing_timers.has_timers_for_key(key))

    # Expiry (design section 7) ---------------------------------------------------------
    def add_window(self, key: bytes, window_max_timestamp: int) -> None:
        """`key` holds state in a window ending at `window_max_timestamp` (micros)."""
        self.expiry.add_window(key, window_max_timestamp)

    def expire(self, watermark: int, allowed_lateness: int,
               is_pinned: Callable[[bytes], bool] = never_pinned) -> list[bytes]:
        """Deletes the keys all of whose windows are past `allowed_lateness` behind
        `watermark` and that have no timers and are not pinned (pushed-back elements)."""
        deleted = []
        expiry = self.expiry
        for key in expiry.candidates(watermark - allowed_lateness):
            latest = expiry.latest_window(key)
            if (latest is not None and latest + allowed_lateness < watermark
                    and not self.has_timers(key) and not is_pinned(key)):
                self.delete_key(key)
                deleted.append(key)
        return deleted

    # Timers and holds ---------------------------------------------------------------------
    def timers(self, domain: str) -> TimerQueue:
        return self.event_timers if domain == EVENT_TIME else self.processing_timers

    def timer_count(self) -> int:
        """The pending timers of both time domains."""
        return len(self.event_timers) + len(self.processing_timers)

    def has_timers(self, key: bytes) -> bool:
        return (self.event_timers.has_timers_for_key(key)
                or self.processing_timers.has_timers_for_key(key))

    def set_hold(self, key: bytes, hold: int | None) -> None:
        """Holds the output watermark at `hold` (micros) for `key`; None releases it."""
        old = self._holds.get(key)
        if old == hold:
            return
        if old is not None:
            self._hold_order.remove((old, key))
            del self._holds[key]
        if hold is not None:
            self._holds[key] = hold
            self._hold_order.add((hold, key))
        if self._changed is not None:
            self._changed.add(key)

    def hold(self, key: bytes) -> int | None:
        return self._holds.get(key)

    def min_hold(self) -> int:
        """The earliest hold of any key or timer (MAX_WATERMARK if none)."""
        holds = [MAX_WATERMARK]
        if self._hold_order:
            holds.append(self._hold_order[0][0])
        for queue in (self.event_timers, self.processing_timers):
            hold = queue.min_hold()
            if hold is not None:
                holds.append(hold)
        return min(holds)

    # The partition's own values ----------------------------------------------------------
    @property
    def watermark(self) -> int:
        """The input watermark the operator has advanced to (micros)."""
        return self._meta['watermark']

    @watermark.setter
    def watermark(self, value: int) -> None:
        self._meta['watermark'] = value

    @property
    def processing_time(self) -> int:
        """The processing time the operator has advanced to (micros)."""
        return self._meta['processing_time']

    @processing_time.setter
    def processing_time(self, value: int) -> None:
        self._meta['processing_time'] = value

    def get_meta(self, name: str, default: Any = None) -> Any:
        return self._meta.get(name, default)

    def put_meta(self, name: str, value: Any) -> None:
        self._meta[name] = value

    def derived(self, name: str, build: Callable[[KeyedStateBackend], Any]) -> Any:
        """An in-memory index an operator builds over this state (e.g. a Pending States
        Graph), built once by `build(self)` and kept while this backend lives; a
        `restore` forgets it. The operator keeps it in step with its writes."""
        value = self._derived.get(name)
        if value is None:
            value = self._derived[name] = build(self)
        return value

    # Checkpoint hooks (design section 8) ---------------------------------------------------
    def take_delta(self) -> tuple[dict[bytes, bytes], set[bytes]]:
        """What changed since the last call (or `restore`): each changed key's whole
        encoding under b'k' + key, or the key in the deleted set once it holds nothing
        (a key created and emptied in between is in neither), plus b'm'."""
        if self._changed is None:
            raise RuntimeError('KeyedStateBackend.take_delta: the backend does not track '
                               'changes (create it with track_changes=True)')
        dirty: dict[bytes, bytes] = {}
        deleted: set[bytes] = set()
        with _collector_paused():
            for key in self._changed:
                value = self._encode_key(key)
                if value is not None:
                    dirty[_KEY + key] = value
                elif key not in self._new:
                    deleted.add(_KEY + key)
            dirty[_META] = self._encode_meta()
        self._track()
        return dirty, deleted

    def snapshot(self) -> dict[bytes, bytes]:
        """The full state, as `restore` takes it."""
        with _collector_paused():
            state = {}
            for key in self.all_keys():
                value = self._encode_key(key)
                if value is not None:
                    state[_KEY + key] = value
            state[_META] = self._encode_meta()
        return state

    def restore(self, state: Mapping[bytes, bytes] | PagedState) -> None:
        """Replaces everything by the full state `state` (a `snapshot`, or the sum of
        the deltas; {} is the initial state); tracks changes from here. A `PagedState`
        is scanned for the keys' headers only: a key's values are read from it when the
        key is first used."""
        self._reset()
        windows, holds = [], []
        timers: dict[str, list] = {EVENT_TIME: [], PROCESSING_TIME: []}
        paged = isinstance(state, PagedState)
        meta_seen = False
        entries = (state.scan() if paged
                   else ((name, value, 0) for name, value in state.items()))
        with _collector_paused():
            for name, value, more in entries:
                if name[:1] == _KEY:
                    key = name[1:]
                    (key_windows, hold, event, processing), body = split_entry(value)
                    if key_windows:
                        windows.append((key, key_windows))
                    if hold is not None:
                        holds.append((hold, key))
                    timers[EVENT_TIME].extend(_restored_timers(key, event))
                    timers[PROCESSING_TIME].extend(_restored_timers(key, processing))
                    if body or more:
                        self._raw[key] = None if paged else body
                elif name == _META:
                    meta, event_seq, processing_seq = pickle.loads(value)
                    self._meta.update(meta)
                    meta_seen = True
            self.expiry.restore_keys(windows)
            self._holds = {key: hold for hold, key in holds}
            self._hold_order.update(holds)
            for domain, restored in timers.items():
                self.timers(domain).restore(restored)
            if meta_seen:
                self.event_timers.next_seq = event_seq
                self.processing_timers.next_seq = processing_seq
        if paged:
            self._paged = state
        self._track()

    def _track(self) -> None:
        self._changed = set()
        self._new = set()
        self.expiry.track_changes(self._changed)
        self.event_timers.track_changes(self._changed)
        self.processing_timers.track_changes(self._changed)

    def _encode_key(self, key: bytes) -> bytes | None:
        """The header and values of `key`, or None if it holds nothing."""
        body = self._raw.get(key)
        if body is None and key in self._raw:
            body = self._paged_body(key)
        if body is None:
            values = self._values.get(key)
            body = self._codec.encode(list(values.items())) if values else b''
        header = (self.expiry.windows(key), self._holds.get(key),
                  _persisted_timers(self.event_timers, key),
                  _persisted_timers(self.processing_timers, key))
        if not body and header == ([], None, [], []):
            return None
        encoded_header = marshal.dumps(header)
        return b''.join((_HEADER_LENGTH.pack(len(encoded_header)), encoded_header, body))

    def _encode_meta(self) -> bytes:
        return pickle.dumps((self._meta, self.event_timers.next_seq,
                             self.processing_timers.next_seq), pickle.HIGHEST_PROTOCOL)


_MISSING = object()


def head_length(name: bytes, value: bytes) -> int:
    """How much of a persisted value a restore reads at once (the rest, a key's values,
    when the key is first used): a key's header, or a partition's value whole."""
    if name[:1] != _KEY:
        return len(value)
    return _HEADER_LENGTH.size + _HEADER_LENGTH.unpack_from(value)[0]


def split_entry(value: bytes) -> tuple[tuple, memoryview]:
    """A persisted key's header (expiry windows, hold, event-time and processing-time
    timers) and its values as the codec encoded them (empty if it holds none)."""
    (length,) = _HEADER_LENGTH.unpack_from(value)
    end = _HEADER_LENGTH.size + length
    view = memoryview(value)
    return marshal.loads(view[_HEADER_LENGTH.size:end]), view[end:]


def _persisted_timers(queue: TimerQueue, key: bytes) -> list[tuple]:
    """`key`'s timers as (arrival, the rest of the timer id, fire, hold, payload); the
    id's first part is the key itself (or the id is the key)."""
    return [(seq, timer.timer_id[1:] if isinstance(timer.timer_id, tuple) else None,
             timer.fire_timestamp, timer.hold_timestamp, timer.payload)
            for seq, timer in queue.timers_of(key)]


def _restored_timers(key: bytes, persisted: Iterable[tuple]) -> Iterator[tuple[int, tuple]]:
    for seq, rest, fire, hold, payload in persisted:
        timer_id = key if rest is None else (key, *rest)
        yield seq, PendingTimer(timer_id, fire, hold, payload)


@contextlib.contextmanager
def _collector_paused():
    """Pauses Python's cyclic garbage collector while a partition's state is encoded or
    rebuilt: those allocate many objects and free none in cycles, and every collection
    they would trigger scans the whole (large) heap of a worker."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
