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
"""

from __future__ import annotations

import bisect
import pickle
from collections.abc import Callable, Hashable, Iterable

from sortedcontainers import SortedDict, SortedList

CellId = Hashable  # (transform id, state id, encoded window[, map key])


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
        self.index = KeyedStateIndex()
        self._changed: set[bytes] | None = None  # keys changed, while tracking

    def __len__(self) -> int:
        return len(self._cells.keys() | self._ordered.keys())

    def live_keys(self) -> int:
        """Keys holding anything: state cells, or expiry windows not yet collected (a key
        whose cells the DoFn cleared stays in the index until its windows expire)."""
        return len(self._cells.keys() | self._ordered.keys() | self.index.keys())

    def keys(self) -> set[bytes]:
        return set(self._cells) | set(self._ordered)

    # Bag-like cells ------------------------------------------------------------
    def get(self, key: bytes, cell: CellId) -> list[bytes]:
        return self._cells.get(key, {}).get(cell, [])

    def append(self, key: bytes, cell: CellId, data: bytes) -> None:
        self._cells.setdefault(key, {}).setdefault(cell, []).append(data)
        if self._changed is not None:
            self._changed.add(key)

    def clear(self, key: bytes, cell: CellId) -> None:
        cells = self._cells.get(key)
        if cells is not None and cells.pop(cell, None) is not None:
            if not cells:
                del self._cells[key]
            if self._changed is not None:
                self._changed.add(key)

    def cells_with_prefix(self, key: bytes, prefix: tuple) -> Iterable[CellId]:
        """Cells of `key` whose id starts with `prefix` (e.g. all map keys)."""
        n = len(prefix)
        return [c for c in self._cells.get(key, {}) if c[:n] == prefix]

    # Ordered-list cells --------------------------------------------------------
    def ordered_range(self, key: bytes, cell: CellId, start: int, end: int) -> list[bytes]:
        entries = self._ordered.get(key, {}).get(cell)
        if not entries:
            return []
        out: list[bytes] = []
        for sort_key in entries.irange(start, end, inclusive=(True, False)):
            out.extend(entries[sort_key])
        return out

    def ordered_add(self, key: bytes, cell: CellId, sort_key: int, data: bytes) -> None:
        entries = self._ordered.setdefault(key, {}).setdefault(cell, SortedDict())
        entries.setdefault(sort_key, []).append(data)
        if self._changed is not None:
            self._changed.add(key)

    def ordered_clear(self, key: bytes, cell: CellId, start: int, end: int) -> None:
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
        held = (self._cells.pop(key, None) is not None) | (self._ordered.pop(key, None) is not None)
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
        cells = self._cells.get(key)
        ordered = self._ordered.get(key)
        windows = self.index.windows(key)
        if not cells and not ordered and not windows:
            return None
        return pickle.dumps((
            list(cells.items()) if cells else [],
            [(cell, list(entries.items())) for cell, entries in ordered.items()]
            if ordered else [],
            windows,
        ), protocol=pickle.HIGHEST_PROTOCOL)

    def restore_key(self, key: bytes, data: bytes) -> None:
        """Replaces the state of `key` by the value `encode_key` gave (not a change)."""
        cells, ordered, windows = pickle.loads(data)
        self._cells.pop(key, None)
        self._ordered.pop(key, None)
        if cells:
            self._cells[key] = dict(cells)
        if ordered:
            self._ordered[key] = {cell: SortedDict(entries) for cell, entries in ordered}
        self.index.restore_key(key, windows)
