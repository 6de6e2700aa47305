"""Keyed user state of one operator partition, with ordered expiry.

Design section 7 (Li et al., PVLDB 11(12) 2018, section 4.3, "dissecting keyed
state"): state is grouped per user key; an ordered index keeps every key by the
smallest max-timestamp of the windows it holds state in, so that a watermark
advance finds the keys that may expire with a range scan
(`KeyedStateIndex.candidates`) instead of visiting every key. A key is deleted
only when all its windows are past the allowed lateness, it has no pushed-back
elements and no timers; the caller (the operator) knows the last two.

Values are the opaque byte strings of Beam's state API: a cell is a list of
encoded chunks (bag state, combining state, set state, ...); ordered-list cells
keep their entries sorted by their sort key.

Versioned partition state (design section 8): once `track_changes` is called,
the store records every key whose cells or expiry windows change;
`take_changed` hands them out for the epoch's delta, `encode_key` gives a key's
whole state as one value (None once it holds nothing) and `restore_key` puts it
back, index included. The batch driver never tracks, so it pays nothing.

A streaming partition whose task lands in another Python worker is rebuilt from
its full state every such epoch, so `restore_keys` is lazy: it indexes each key's
windows from the value's trailer (a few fixed-size integers) and keeps the
pickled cells as they are, to be decoded when the key is first touched; a key
the epoch does not touch is encoded again from those bytes without decoding.
Value layout: pickle((cells, ordered cells)), then the key's window max
timestamps as little-endian int64s, then their count as a little-endian uint32
(`pickle.loads` of a value reads the cells and ignores the trailer).
"""

from __future__ import annotations

import bisect
import pickle
import struct
from collections.abc import Callable, Hashable, Iterable

from sortedcontainers import SortedDict, SortedList

CellId = Hashable  # (transform id, state id, encoded window[, map key])

_COUNT = struct.Struct('<I')  # the number of windows, last in a key's value
# The cells of a key that holds only expiry windows.
_NO_CELLS = pickle.dumps(([], []), protocol=pickle.HIGHEST_PROTOCOL)


class KeyedStateIndex:
    """Keys ordered by the smallest max-timestamp of the windows they hold."""

    def __init__(self) -> None:
        # A key's windows are few (a sorted list beats a SortedList there).
        self._windows_by_key: dict[bytes, list[int]] = {}
        self._order: SortedList = SortedList()  # (earliest window max timestamp, key)
        # The owning KeyedStateStore's set of changed keys, while it tracks changes.
        self._changed: set[bytes] | None = None

    def __len__(self) -> int:
        return len(self._windows_by_key)

    def add_window(self, key: bytes, window_max_timestamp: int) -> None:
        windows = self._windows_by_key.get(key)
        if windows is None:
            self._windows_by_key[key] = [window_max_timestamp]
            self._order.add((window_max_timestamp, key))
            if self._changed is not None:
                self._changed.add(key)
            return
        position = bisect.bisect_left(windows, window_max_timestamp)
        if position < len(windows) and windows[position] == window_max_timestamp:
            return
        if self._changed is not None:
            self._changed.add(key)
        if position == 0:
            self._order.remove((windows[0], key))
            self._order.add((window_max_timestamp, key))
        windows.insert(position, window_max_timestamp)

    def remove_key(self, key: bytes) -> None:
        if self._drop(key) and self._changed is not None:
            self._changed.add(key)

    def _drop(self, key: bytes) -> bool:
        windows = self._windows_by_key.pop(key, None)
        if windows is None:
            return False
        self._order.remove((windows[0], key))
        return True

    def keys(self):
        """The keys with expiry windows (a view)."""
        return self._windows_by_key.keys()

    def windows(self, key: bytes) -> list[int]:
        """The max timestamps of the windows `key` holds state in, ascending."""
        return list(self._windows_by_key.get(key, ()))

    def restore_key(self, key: bytes, windows: Iterable[int]) -> None:
        """Sets the windows of `key` (replacing any) as `add_window` of each would,
        but not as a change (restoring a saved state)."""
        self._drop(key)
        windows = sorted(set(windows))
        if windows:
            self._windows_by_key[key] = windows
            self._order.add((windows[0], key))

    def restore_keys(self, items: Iterable[tuple[bytes, list[int]]]) -> None:
        """`restore_key` of many keys at once (the order index is sorted once); each
        key's windows ascending and distinct, as `windows` lists them."""
        order = []
        windows_by_key = self._windows_by_key
        for key, windows in items:
            if key in windows_by_key:
                self._drop(key)
            if windows:
                windows_by_key[key] = windows
                order.append((windows[0], key))
        self._order.update(order)

    def latest_window(self, key: bytes) -> int | None:
        windows = self._windows_by_key.get(key)
        return windows[-1] if windows else None

    def candidates(self, up_to: int) -> list[bytes]:
        """Keys whose earliest window ends at or before `up_to` (a range scan)."""
        return [key for _, key in self._order.irange(
            maximum=(up_to + 1, b''), inclusive=(True, False))]


class KeyedStateStore:
    """State cells per user key, plus the expiry index over them."""

    def __init__(self) -> None:
        self._cells: dict[bytes, dict[CellId, list[bytes]]] = {}
        self._ordered: dict[bytes, dict[CellId, SortedDict]] = {}
        # Keys restored but not touched since: their pickled cells (see `restore_keys`).
        self._raw: dict[bytes, bytes] = {}
        self.index = KeyedStateIndex()
        self._changed: set[bytes] | None = None  # keys changed, while tracking

    def __len__(self) -> int:
        return len(self.keys())

    def live_keys(self) -> int:
        """Keys holding anything: state cells, or expiry windows not yet collected (a key
        whose cells the DoFn cleared stays in the index until its windows expire)."""
        return len(self._cells.keys() | self._ordered.keys() | self._raw.keys()
                   | self.index.keys())

    def keys(self) -> set[bytes]:
        return self._cells.keys() | self._ordered.keys() | self._raw.keys()

    def _decode(self, key: bytes) -> None:
        """Decodes the cells of a restored key on its first use."""
        data = self._raw.pop(key, None)
        if data is not None:
            self._set_cells(key, *pickle.loads(data))

    def _set_cells(self, key: bytes, cells: list, ordered: list) -> None:
        if cells:
            self._cells[key] = dict(cells)
        if ordered:
            self._ordered[key] = {cell: SortedDict(entries) for cell, entries in ordered}

    # Bag-like cells ------------------------------------------------------------
    def get(self, key: bytes, cell: CellId) -> list[bytes]:
        if key in self._raw:
            self._decode(key)
        return self._cells.get(key, {}).get(cell, [])

    def append(self, key: bytes, cell: CellId, data: bytes) -> None:
        if key in self._raw:
            self._decode(key)
        self._cells.setdefault(key, {}).setdefault(cell, []).append(data)
        if self._changed is not None:
            self._changed.add(key)

    def clear(self, key: bytes, cell: CellId) -> None:
        if key in self._raw:
            self._decode(key)
        cells = self._cells.get(key)
        if cells is not None and cells.pop(cell, None) is not None:
            if not cells:
                del self._cells[key]
            if self._changed is not None:
                self._changed.add(key)

    def cells_with_prefix(self, key: bytes, prefix: tuple) -> Iterable[CellId]:
        """Cells of `key` whose id starts with `prefix` (e.g. all map keys)."""
        if key in self._raw:
            self._decode(key)
        n = len(prefix)
        return [c for c in self._cells.get(key, {}) if c[:n] == prefix]

    # Ordered-list cells --------------------------------------------------------
    def ordered_range(self, key: bytes, cell: CellId, start: int, end: int) -> list[bytes]:
        if key in self._raw:
            self._decode(key)
        entries = self._ordered.get(key, {}).get(cell)
        if not entries:
            return []
        out: list[bytes] = []
        for sort_key in entries.irange(start, end, inclusive=(True, False)):
            out.extend(entries[sort_key])
        return out

    def ordered_add(self, key: bytes, cell: CellId, sort_key: int, data: bytes) -> None:
        if key in self._raw:
            self._decode(key)
        entries = self._ordered.setdefault(key, {}).setdefault(cell, SortedDict())
        entries.setdefault(sort_key, []).append(data)
        if self._changed is not None:
            self._changed.add(key)

    def ordered_clear(self, key: bytes, cell: CellId, start: int, end: int) -> None:
        if key in self._raw:
            self._decode(key)
        cells = self._ordered.get(key)
        entries = cells.get(cell) if cells else None
        if not entries:
            return
        doomed = list(entries.irange(start, end, inclusive=(True, False)))
        if doomed and self._changed is not None:
            self._changed.add(key)
        for sort_key in doomed:
            del entries[sort_key]
        if not entries:
            del cells[cell]
            if not cells:
                del self._ordered[key]

    # Expiry ----------------------------------------------------------------------
    def delete_key(self, key: bytes) -> None:
        held = ((self._cells.pop(key, None) is not None)
                | (self._ordered.pop(key, None) is not None)
                | (self._raw.pop(key, None) is not None))
        self.index.remove_key(key)  # marks the key changed if it had windows
        if held and self._changed is not None:
            self._changed.add(key)

    def expire(
        self,
        watermark: int,
        allowed_lateness: int,
        is_pinned: Callable[[bytes], bool],
    ) -> list[bytes]:
        """Deletes the keys all of whose windows are past `allowed_lateness`.

        `is_pinned(key)` says whether the key still has timers or pushed-back
        elements; those keys are kept. Returns the deleted keys.
        """
        deleted = []
        for key in self.index.candidates(watermark - allowed_lateness):
            latest = self.index.latest_window(key)
            if latest is not None and latest + allowed_lateness < watermark and not is_pinned(key):
                self.delete_key(key)
                deleted.append(key)
        return deleted

    # Versioned partition state -------------------------------------------------------
    def track_changes(self) -> None:
        """Starts (or restarts) recording which keys change; forgets what was recorded."""
        self._changed = set()
        self.index._changed = self._changed

    def take_changed(self) -> set[bytes]:
        """The keys changed since `track_changes` or the last call; resets the record."""
        if self._changed is None:
            raise RuntimeError('KeyedStateStore.take_changed: call track_changes() first')
        changed = self._changed
        self.track_changes()
        return changed

    def encode_key(self, key: bytes) -> bytes | None:
        """All the state of `key` (cells, ordered cells, expiry windows) as one value,
        or None if it holds none."""
        windows = self.index.windows(key)
        body = self._raw.get(key)
        if body is None:
            cells = self._cells.get(key)
            ordered = self._ordered.get(key)
            if not cells and not ordered:
                if not windows:
                    return None
                body = _NO_CELLS
            else:
                body = pickle.dumps((
                    list(cells.items()) if cells else [],
                    [(cell, list(entries.items())) for cell, entries in ordered.items()]
                    if ordered else [],
                ), protocol=pickle.HIGHEST_PROTOCOL)
        n = len(windows)
        return b''.join((body, struct.pack(f'<{n}qI', *windows, n)))

    def restore_key(self, key: bytes, data: bytes) -> None:
        """Replaces the state of `key` by the value `encode_key` gave (not a change)."""
        self._cells.pop(key, None)
        self._ordered.pop(key, None)
        self._raw.pop(key, None)
        body, windows = _split(data)
        if body != _NO_CELLS:
            self._set_cells(key, *pickle.loads(body))
        self.index.restore_key(key, windows)

    def restore_keys(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """`restore_key` of each (key, value), lazily: the windows go to the index at
        once, the cells stay encoded until the key is used."""
        raw = self._raw
        indexed = []
        for key, data in items:
            self._cells.pop(key, None)
            self._ordered.pop(key, None)
            body, windows = _split(data)
            if body != _NO_CELLS:
                raw[key] = body
            else:
                raw.pop(key, None)
            indexed.append((key, windows))
        self.index.restore_keys(indexed)


def _split(data: bytes) -> tuple[bytes, list[int]]:
    """(pickled cells, window max timestamps) of a value `encode_key` gave."""
    end = len(data) - _COUNT.size
    n, = _COUNT.unpack_from(data, end)
    end -= 8 * n
    return data[:end], list(struct.unpack_from(f'<{n}q', data, end))
