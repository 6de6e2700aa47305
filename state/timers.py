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

Versioned partition state (design section 8): once `track_changes` is called,
the queue records every key whose timers were set, cleared or fired;
`take_changed` hands them out, `timers_of` lists a key's timers with their
arrival numbers, and `restore` puts timers back with their arrival numbers, so a
rebuilt queue fires in exactly the order of the original.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
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
        self._next_seq = 0  # arrival number of the next timer set
        # timer id -> (fire timestamp, sequence number, PendingTimer)
        self._by_id: dict[Hashable, tuple[int, int, PendingTimer]] = {}
        self._by_time: SortedList = SortedList()  # (fire timestamp, seq, timer id)
        self._holds: SortedList = SortedList()  # (hold timestamp, seq)
        self._ids_by_key: dict[Hashable, set[Hashable]] = {}
        self._changed: set[Hashable] | None = None  # keys changed, while tracking

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, timer_id: Hashable) -> bool:
        return timer_id in self._by_id

    def set(
        self,
        timer_id: Hashable,
        fire_timestamp: int,
        payload: Any = None,
        hold_timestamp: int | None = None,
    ) -> None:
        """Sets (or resets) the timer `timer_id`; timestamps are microseconds.

        Setting a timer again as it is (a DoFn setting its window-end timer per element)
        changes nothing when no timer firing at the same time arrived after it: moving it
        to the end of the arrivals would not change its place."""
        hold = fire_timestamp if hold_timestamp is None else hold_timestamp
        entry = self._by_id.get(timer_id)
        if entry is not None:
            if self._resets_in_place(entry, fire_timestamp, hold, payload):
                return
            self._remove(timer_id)
        seq = self._next_seq
        self._next_seq += 1
        self._add(seq, PendingTimer(timer_id, fire_timestamp, hold, payload))
        if self._changed is not None:
            self._changed.add(_key_of(timer_id))

    def _resets_in_place(self, entry: tuple[int, int, PendingTimer], fire_timestamp: int,
                         hold: int, payload: Any) -> bool:
        fire, seq, timer = entry
        if fire != fire_timestamp or timer.hold_timestamp != hold or (
                timer.payload is not payload and timer.payload != payload):
            return False
        if seq == self._next_seq - 1:
            return True  # the last arrival
        after = self._by_time.bisect_right((fire, seq, timer.timer_id))
        return after == len(self._by_time) or self._by_time[after][0] != fire

    def _add(self, seq: int, timer: PendingTimer) -> None:
        timer_id = timer.timer_id
        self._by_id[timer_id] = (timer.fire_timestamp, seq, timer)
        self._by_time.add((timer.fire_timestamp, seq, timer_id))
        self._holds.add((timer.hold_timestamp, seq))
        self._index_by_key(timer_id)

    def _index_by_key(self, timer_id: Hashable) -> None:
        key = _key_of(timer_id)
        ids = self._ids_by_key.get(key)
        if ids is None:
            self._ids_by_key[key] = {timer_id}
        else:
            ids.add(timer_id)

    def clear(self, timer_id: Hashable) -> None:
        if self._remove(timer_id) and self._changed is not None:
            self._changed.add(_key_of(timer_id))

    def _remove(self, timer_id: Hashable) -> bool:
        entry = self._by_id.pop(timer_id, None)
        if entry is None:
            return False
        fire_timestamp, seq, timer = entry
        self._by_time.remove((fire_timestamp, seq, timer_id))
        self._holds.remove((timer.hold_timestamp, seq))
        key = _key_of(timer_id)
        ids = self._ids_by_key[key]
        ids.discard(timer_id)
        if not ids:
            del self._ids_by_key[key]
        return True

    def has_timers_for_key(self, key: Hashable) -> bool:
        return key in self._ids_by_key

    def fire_timestamp(self, timer_id: Hashable) -> int | None:
        """When the pending timer `timer_id` fires, or None if it is not pending."""
        entry = self._by_id.get(timer_id)
        return None if entry is None else entry[0]

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

    # Versioned partition state -------------------------------------------------------
    def track_changes(self, into: set | None = None) -> None:
        """Starts (or restarts) recording which keys' timers change, in `into` (a set the
        owner shares with its other structures) or a new set; forgets the record."""
        self._changed = set() if into is None else into

    def keys(self):
        """The keys with pending timers (a view)."""
        return self._ids_by_key.keys()

    def take_changed(self) -> set[Hashable]:
        """The keys whose timers were set, cleared or fired since `track_changes` or the
        last call; resets the record."""
        if self._changed is None:
            raise RuntimeError('TimerQueue.take_changed: call track_changes() first')
        changed, self._changed = self._changed, set()
        return changed

    def timers_of(self, key: Hashable) -> list[tuple[int, PendingTimer]]:
        """The pending timers of `key` with their arrival numbers, by arrival."""
        return sorted((self._by_id[timer_id][1:] for timer_id in self._ids_by_key.get(key, ())),
                      key=lambda entry: entry[0])

    def restore(self, timers: Iterable[tuple[int, tuple]]) -> None:
        """Puts back timers as `timers_of` lists them: (arrival number, (timer id, fire
        timestamp, hold timestamp, payload)). As `set` does, but not as a change
        (restoring a saved state), and in bulk: rebuilding n timers sorts once."""
        batch = {}  # timer id -> (seq, timer): a timer listed twice is restored once
        for seq, fields in timers:
            timer = PendingTimer._make(fields)
            batch[timer.timer_id] = (seq, timer)
        by_time, holds = [], []
        by_id = self._by_id
        replacing = bool(by_id)
        next_seq = self._next_seq
        for timer_id, (seq, timer) in batch.items():
            if replacing:
                self._remove(timer_id)
            fire_timestamp = timer.fire_timestamp
            by_id[timer_id] = (fire_timestamp, seq, timer)
            by_time.append((fire_timestamp, seq, timer_id))
            holds.append((timer.hold_timestamp, seq))
            self._index_by_key(timer_id)
            if seq >= next_seq:
                next_seq = seq + 1
        self._next_seq = next_seq
        self._by_time.update(by_time)
        self._holds.update(holds)

    @property
    def next_seq(self) -> int:
        """The arrival number the next timer set gets."""
        return self._next_seq

    @next_seq.setter
    def next_seq(self, value: int) -> None:
        # Never below a restored timer's number: arrival numbers stay unique.
        self._next_seq = max(self._next_seq, value)


def _key_of(timer_id: Hashable) -> Hashable:
    return timer_id[0] if isinstance(timer_id, tuple) else timer_id
