"""The ordered expiry index of a partition's keyed state.

Design section 7 (Li et al., PVLDB 11(12) 2018, section 4.3, "dissecting keyed
state"): an ordered index keeps every key by the smallest max-timestamp of the
windows it holds state in, so that a watermark advance finds the keys that may
expire with a range scan (`KeyedStateIndex.candidates`) instead of visiting
every key. A key is deleted only when all its windows are past the allowed
lateness, it has no pushed-back elements and no timers; the keyed-state
backend (`backend.KeyedStateBackend.expire`) checks the last two.

While its owner tracks changes (`track_changes`), every key whose windows
change is recorded in the owner's set of changes, for the epoch's delta.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from sortedcontainers import SortedList


class KeyedStateIndex:
    """Keys ordered by the smallest max-timestamp of the windows they hold."""

    def __init__(self) -> None:
        # A key's windows are few (a sorted list beats a SortedList there).
        self._windows_by_key: dict[bytes, list[int]] = {}
        self._order: SortedList = SortedList()  # (earliest window max timestamp, key)
        # The owner's set of changed keys, while it tracks changes.
        self._changed: set[bytes] | None = None

    def __len__(self) -> int:
        return len(self._windows_by_key)

    def track_changes(self, into: set[bytes]) -> None:
        """Records the keys whose windows change in `into` (the owner's set of changes)."""
        self._changed = into

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
