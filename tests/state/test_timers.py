"""Unit tests of `TimerQueue` (no Spark).

The queue is checked against a brute-force model: a plain dict from timer id to
(fire timestamp, hold timestamp, payload, arrival number). The arrival number
breaks ties between timers of one key with the same firing timestamp (the queue
orders by (firing timestamp, arrival)).
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from beam_streams_runner.state.timers import PendingTimer, TimerQueue

KEYS = st.sampled_from(['a', 'b', 'c', b'k'])
NAMES = st.sampled_from(['t1', 't2', 't3'])
TIMER_IDS = st.tuples(KEYS, NAMES)
TIMESTAMPS = st.integers(min_value=-20, max_value=20)
HOLDS = st.none() | TIMESTAMPS
PAYLOADS = st.none() | st.integers(0, 3)


class TimerModel:
    """The obviously correct (and slow) version of `TimerQueue`."""

    def __init__(self):
        self.timers = {}  # timer id -> (fire, hold, payload, arrival)
        self._arrival = itertools.count()

    def set(self, timer_id, fire, payload=None, hold=None):
        hold = fire if hold is None else hold
        self.timers[timer_id] = (fire, hold, payload, next(self._arrival))

    def clear(self, timer_id):
        self.timers.pop(timer_id, None)

    def user_keys(self):
        return {timer_id[0] for timer_id in self.timers}

    def pop_due(self, up_to):
        earliest = {}  # key -> (fire, arrival, timer id)
        for timer_id, (fire, _, _, arrival) in self.timers.items():
            if fire <= up_to:
                candidate = (fire, arrival, timer_id)
                key = timer_id[0]
                if key not in earliest or candidate[:2] < earliest[key][:2]:
                    earliest[key] = candidate
        due = []
        for fire, _, timer_id in sorted(earliest.values(), key=lambda c: c[:2]):
            _, hold, payload, _ = self.timers.pop(timer_id)
            due.append(PendingTimer(timer_id, fire, hold, payload))
        return due


class TimerQueueMachine(RuleBasedStateMachine):
    """Random set/clear/pop_due sequences, compared with `TimerModel`."""

    def __init__(self):
        super().__init__()
        self.queue = TimerQueue()
        self.model = TimerModel()

    # Few firing timestamps: timers of different keys often fire together, where the
    # order of arrival decides.
    @rule(timer_id=TIMER_IDS, fire=st.integers(-3, 3), payload=PAYLOADS, hold=HOLDS)
    def set_timer(self, timer_id, fire, payload, hold):
        self.queue.set(timer_id, fire, payload=payload, hold_timestamp=hold)
        self.model.set(timer_id, fire, payload, hold)

    @rule(timer_id=TIMER_IDS)
    def clear_timer(self, timer_id):
        self.queue.clear(timer_id)
        self.model.clear(timer_id)

    @precondition(lambda self: self.model.timers)
    @rule(data=st.data())
    def clear_existing_timer(self, data):
        timer_id = data.draw(st.sampled_from(sorted(self.model.timers, key=repr)))
        self.queue.clear(timer_id)
        self.model.clear(timer_id)

    @precondition(lambda self: self.model.timers)
    @rule(data=st.data())
    def set_existing_timer_again_as_it_is(self, data):
        # The queue may leave it in place; the firing order must not tell.
        timer_id = data.draw(st.sampled_from(sorted(self.model.timers, key=repr)))
        fire, hold, payload, _ = self.model.timers[timer_id]
        self.queue.set(timer_id, fire, payload=payload, hold_timestamp=hold)
        self.model.set(timer_id, fire, payload, hold)

    @rule(up_to=st.integers(min_value=-5, max_value=5))
    def pop_due(self, up_to):
        due = self.queue.pop_due(up_to)
        assert due == self.model.pop_due(up_to)
        fires = [t.fire_timestamp for t in due]
        assert fires == sorted(fires)
        assert all(f <= up_to for f in fires)
        keys = [t.timer_id[0] for t in due]
        assert len(keys) == len(set(keys)), 'at most one timer per key per round'

    @invariant()
    def agrees_with_model(self):
        timers = self.model.timers
        assert len(self.queue) == len(timers)
        for timer_id in itertools.product(['a', 'b', 'c', b'k'], ['t1', 't2', 't3']):
            assert (timer_id in self.queue) == (timer_id in timers)
        for key in ['a', 'b', 'c', b'k', 'absent']:
            assert self.queue.has_timers_for_key(key) == (key in self.model.user_keys())
        if timers:
            assert self.queue.next_timestamp() == min(v[0] for v in timers.values())
            assert self.queue.min_hold() == min(v[1] for v in timers.values())
        else:
            assert self.queue.next_timestamp() is None
            assert self.queue.min_hold() is None


TimerQueueMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None)
TestTimerQueueStateful = TimerQueueMachine.TestCase


timer_sets = st.dictionaries(TIMER_IDS, TIMESTAMPS, max_size=12)


@settings(max_examples=150, deadline=None)
@given(timers=timer_sets)
def test_firing_round_by_round_yields_per_key_timestamp_order(timers):
    queue = TimerQueue()
    for timer_id, fire in timers.items():
        queue.set(timer_id, fire)
    fired_by_key = {}
    rounds = 0
    while queue:
        due = queue.pop_due(max(timers.values()))
        assert due, 'every pending timer is due, so each round fires something'
        rounds += 1
        for timer in due:
            fired_by_key.setdefault(timer.timer_id[0], []).append(timer.fire_timestamp)
    expected = {}
    for timer_id, fire in timers.items():
        expected.setdefault(timer_id[0], []).append(fire)
    assert fired_by_key == {key: sorted(fires) for key, fires in expected.items()}
    # One round per timer of the busiest key, not one per timer.
    assert rounds == max((len(f) for f in expected.values()), default=0)
    assert queue.next_timestamp() is None and queue.min_hold() is None


@settings(max_examples=100, deadline=None)
@given(
    timers=timer_sets,
    follow_ups=st.lists(st.integers(min_value=0, max_value=5), max_size=20),
)
def test_timers_set_while_firing_keep_per_key_timestamp_order(timers, follow_ups):
    """A fired timer may set another timer of its key, at or after its own timestamp."""
    queue = TimerQueue()
    for timer_id, fire in timers.items():
        queue.set(timer_id, fire)
    watermark = 30
    follow_ups = list(follow_ups)
    fired_by_key = {}
    while True:
        due = queue.pop_due(watermark)
        if not due:
            break
        for timer in due:
            key = timer.timer_id[0]
            fired = fired_by_key.setdefault(key, [])
            assert not fired or fired[-1] <= timer.fire_timestamp
            fired.append(timer.fire_timestamp)
            if follow_ups:
                # Possibly earlier than the key's other pending timers.
                queue.set((key, 'follow-up'), timer.fire_timestamp + follow_ups.pop())
    assert queue.next_timestamp() is None or queue.next_timestamp() > watermark


def test_pop_due_fires_only_each_keys_earliest_timer():
    queue = TimerQueue()
    queue.set(('a', 'late'), 30)
    queue.set(('a', 'early'), 10)
    queue.set(('b', 'x'), 20)
    queue.set(('c', 'future'), 100)

    assert [t.timer_id for t in queue.pop_due(50)] == [('a', 'early'), ('b', 'x')]
    assert [t.timer_id for t in queue.pop_due(50)] == [('a', 'late')]
    assert queue.pop_due(50) == []
    assert len(queue) == 1 and queue.has_timers_for_key('c')
    assert not queue.has_timers_for_key('a')


def test_pop_due_includes_timers_firing_exactly_at_up_to():
    queue = TimerQueue()
    queue.set(('k', 't'), 10, payload='p', hold_timestamp=7)
    assert queue.pop_due(9) == []
    assert queue.pop_due(10) == [PendingTimer(('k', 't'), 10, 7, 'p')]


def test_set_with_existing_id_replaces_timer():
    queue = TimerQueue()
    queue.set(('k', 't'), 10, payload='first', hold_timestamp=5)
    queue.set(('k', 't'), 40, payload='second')
    assert len(queue) == 1
    assert queue.next_timestamp() == 40
    assert queue.min_hold() == 40  # the hold defaults to the firing timestamp
    assert queue.pop_due(39) == []
    assert queue.pop_due(40) == [PendingTimer(('k', 't'), 40, 40, 'second')]


def test_clear_removes_timer_and_its_hold():
    queue = TimerQueue()
    queue.set(('k', 't1'), 10, hold_timestamp=1)
    queue.set(('k', 't2'), 20, hold_timestamp=2)
    queue.clear(('k', 't1'))
    queue.clear(('k', 'never set'))
    assert ('k', 't1') not in queue and ('k', 't2') in queue
    assert queue.min_hold() == 2 and queue.next_timestamp() == 20
    queue.clear(('k', 't2'))
    assert len(queue) == 0 and not queue.has_timers_for_key('k')
    assert queue.min_hold() is None and queue.next_timestamp() is None


def test_same_timestamp_timers_of_one_key_fire_in_arrival_order():
    queue = TimerQueue()
    queue.set(('k', 'second'), 5)
    queue.set(('k', 'first'), 3)
    queue.set(('k', 'third'), 5)
    order = []
    while queue:
        order.extend(t.timer_id[1] for t in queue.pop_due(5))
    assert order == ['first', 'second', 'third']


@settings(max_examples=100, deadline=None)
@given(first=timer_sets, second=timer_sets)
def test_restore_over_pending_timers_replaces_those_with_the_same_id(first, second):
    """A bulk restore into a queue that holds timers (the replacing path) equals one
    restore of the merged timers into an empty queue (the fast path)."""
    first_batch = [(seq, (timer_id, fire, fire, 'first'))
                   for seq, (timer_id, fire) in enumerate(first.items())]
    second_batch = [(len(first) + seq, (timer_id, fire, fire - 1, 'second'))
                    for seq, (timer_id, fire) in enumerate(second.items())]
    queue = TimerQueue()
    queue.restore(first_batch)
    queue.restore(second_batch)
    merged = {fields[0]: (seq, fields) for seq, fields in first_batch + second_batch}
    fresh = TimerQueue()
    fresh.restore(merged.values())
    assert queue._by_id == fresh._by_id
    assert list(queue._by_time) == list(fresh._by_time)
    assert list(queue._holds) == list(fresh._holds)
    assert queue._ids_by_key == fresh._ids_by_key
    assert queue.next_seq == fresh.next_seq == len(first) + len(second)
    assert queue.pop_due(100) == fresh.pop_due(100)
