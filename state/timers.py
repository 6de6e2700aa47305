"""All pending timers of one operator partition in one ordered structure.

Design section 7 (after Li et al., PVLDB 11(12) 2018, section 4.3): timers are
kept ordered by firing timestamp (sortedcontainers), so a watermark advance
finds the due timers with a range scan instead of visiting every key. A timer is
identified by an opaque, hashable id whose first component is the user key;
setting a timer with an existing id replaces it, clearing removes it (Beam's
set/reset/clear semantics).

Firing order: `pop_due` hands out, for every key, only that key's earliest due
timer. Timers of one key therefore fire strictly in timestamp order even when
firing one timer sets another, earlier one; timers of different keys are
independent and fire together, so a watermark jump costs one round per timer of
the busiest key, not one per timer.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any, NamedTuple

from sortedcontainers import SortedList


class PendingTimer(NamedTuple):
    timer_id: Hashable
    fire_timestamp: int
    hold_timestamp: int
    payload: Any


class TimerQueue:
    """Timers ordered by (firing timestamp, arrival), indexed by id and by key."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        # timer id -> (fire timestamp, sequence number, PendingTimer)
        self._by_id: dict[Hashable, tuple[int, int, PendingTimer]] = {}
        self._by_time: SortedList = SortedList()  # (fire timestamp, seq, timer id)
        self._holds: SortedList = SortedList()  # (hold timestamp, seq)
        self._count_by_key: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __getstate__(self) -> dict:
        # itertools.count does not pickle on every Python version: keep its next value.
        state = dict(self.__dict__)
        state['_seq'] = next(self._seq)
        self._seq = itertools.count(state['_seq'] + 1)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._seq = itertools.count(state['_seq'])

    def __contains__(self, timer_id: Hashable) -> bool:
        return timer_id in self._by_id

    def set(
        self,
        timer_id: Hashable,
        fire_timestamp: int,
        payload: Any = None,
        hold_timestamp: int | None = None,
    ) -> None:
        """Sets (or resets) the timer `timer_id`; timestamps are microseconds."""
        self.clear(timer_id)
        seq = next(self._seq)
        hold = fire_timestamp if hold_timestamp is None else hold_timestamp
        timer = PendingTimer(timer_id, fire_timestamp, hold, payload)
        self._by_id[timer_id] = (fire_timestamp, seq, timer)
        self._by_time.add((fire_timestamp, seq, timer_id))
        self._holds.add((hold, seq))
        key = _key_of(timer_id)
        self._count_by_key[key] = self._count_by_key.get(key, 0) + 1

    def clear(self, timer_id: Hashable) -> None:
        entry = self._by_id.pop(timer_id, None)
        if entry is None:
            return
        fire_timestamp, seq, timer = entry
        self._by_time.remove((fire_timestamp, seq, timer_id))
        self._holds.remove((timer.hold_timestamp, seq))
        key = _key_of(timer_id)
        remaining = self._count_by_key[key] - 1
        if remaining:
            self._count_by_key[key] = remaining
        else:
            del self._count_by_key[key]

    def has_timers_for_key(self, key: Hashable) -> bool:
        return key in self._count_by_key

    def next_timestamp(self) -> int | None:
        """Firing timestamp of the earliest pending timer, or None."""
        return self._by_time[0][0] if self._by_time else None

    def min_hold(self) -> int | None:
        """The earliest output-watermark hold of any pending timer, or None."""
        return self._holds[0][0] if self._holds else None

    def pop_due(self, up_to: int) -> list[PendingTimer]:
        """Removes and returns each key's earliest timer firing at or before `up_to`.

        The result is in firing-timestamp order.
        """
        due: list[PendingTimer] = []
        seen_keys: set = set()
        for _, _, timer_id in self._by_time.irange(
            maximum=(up_to, float('inf'), None), inclusive=(True, True)
        ):
            key = _key_of(timer_id)
            if key in seen_keys:
                continue
            seen_keys.add(key)
            due.append(self._by_id[timer_id][2])
        for timer in due:
            self.clear(timer.timer_id)
        return due


def _key_of(timer_id: Hashable) -> Hashable:
    return timer_id[0] if isinstance(timer_id, tuple) else timer_id
