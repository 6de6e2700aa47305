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
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from sortedcontainers import SortedDict, SortedList

CellId = Hashable  # (transform id, state id, encoded window[, map key])


class KeyedStateIndex:
    """Keys ordered by the smallest max-timestamp of the windows they hold."""

    def __init__(self) -> None:
        self._windows_by_key: dict[bytes, SortedList] = {}
        self._order: SortedList = SortedList()  # (earliest window max timestamp, key)

    def __len__(self) -> int:
        return len(self._windows_by_key)

    def add_window(self, key: bytes, window_max_timestamp: int) -> None:
        windows = self._windows_by_key.get(key)
        if windows is None:
            self._windows_by_key[key] = SortedList([window_max_timestamp])
            self._order.add((window_max_timestamp, key))
            return
        if window_max_timestamp in windows:
            return
        earliest = windows[0]
        windows.add(window_max_timestamp)
        if window_max_timestamp < earliest:
            self._order.remove((earliest, key))
            self._order.add((window_max_timestamp, key))

    def remove_key(self, key: bytes) -> None:
        windows = self._windows_by_key.pop(key, None)
        if windows is not None:
            self._order.remove((windows[0], key))

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

    def __len__(self) -> int:
        return len(set(self._cells) | set(self._ordered))

    def keys(self) -> set[bytes]:
        return set(self._cells) | set(self._ordered)

    # Bag-like cells ------------------------------------------------------------
    def get(self, key: bytes, cell: CellId) -> list[bytes]:
        return self._cells.get(key, {}).get(cell, [])

    def append(self, key: bytes, cell: CellId, data: bytes) -> None:
        self._cells.setdefault(key, {}).setdefault(cell, []).append(data)

    def clear(self, key: bytes, cell: CellId) -> None:
        cells = self._cells.get(key)
        if cells is not None:
            cells.pop(cell, None)
            if not cells:
                del self._cells[key]

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

    def ordered_clear(self, key: bytes, cell: CellId, start: int, end: int) -> None:
        cells = self._ordered.get(key)
        entries = cells.get(cell) if cells else None
        if not entries:
            return
        for sort_key in list(entries.irange(start, end, inclusive=(True, False))):
            del entries[sort_key]
        if not entries:
            del cells[cell]
            if not cells:
                del self._ordered[key]

    # Expiry ----------------------------------------------------------------------
    def delete_key(self, key: bytes) -> None:
        self._cells.pop(key, None)
        self._ordered.pop(key, None)
        self.index.remove_key(key)

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
