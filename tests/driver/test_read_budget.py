"""The read budget of streaming epochs: the latency goal minus the fixed cost, and
longer epochs while the sources are behind."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from beam_streams_runner.driver.read_budget import BACKLOG_FACTOR, MIN_READ_SHARE, ReadBudget


def test_the_budget_is_the_goal_minus_the_fixed_cost():
    budget = ReadBudget(1000)
    assert budget.ms == 250  # no epoch measured yet: the least share of the goal
    assert budget.after_epoch(wall_s=0.5, read_s=0.3, behind=False) == 800
    # The fixed cost is smoothed: 0.2 s, then 1.0 s, counts 0.6 s.
    assert budget.after_epoch(wall_s=1.3, read_s=0.3, behind=False) == 400
    assert budget.after_epoch(wall_s=5.0, read_s=0.3, behind=False) == 250


def test_epochs_grow_while_behind_and_return_to_the_goal_once_caught_up():
    budget = ReadBudget(1000)
    # An epoch lasting a fixed 1 s plus twice its reading (the stages after the read).
    grown, wall_s = [], 1.0 + 2 * 0.25
    for _ in range(6):
        grown.append(budget.after_epoch(wall_s, budget.ms / 1000, behind=True))
        wall_s = 1.0 + 2 * grown[-1] / 1000
    assert grown == [500, 1000, 1333, 1454, 1488, 1497]  # epochs of about 4 s
    assert budget.after_epoch(wall_s, 1.5, behind=False) == 250


@given(st.integers(1, 60_000),
       st.lists(st.tuples(st.floats(0, 30), st.floats(0, 30), st.booleans()), max_size=30))
def test_the_budget_stays_between_its_bounds(goal, epochs):
    budget = ReadBudget(goal)
    for wall_s, read_s, behind in epochs:
        ms = budget.after_epoch(wall_s, read_s, behind)
        assert min(goal, max(1, round(goal * MIN_READ_SHARE))) <= ms
        assert ms <= max(1, goal) * (BACKLOG_FACTOR if behind else 1)


def test_with_consistent_regions_an_epoch_grows_to_the_checkpoint_period_at_most():
    budget = ReadBudget(300, checkpoint_period_s=0.5)
    assert budget.longest_ms == 500
    assert ReadBudget(300, checkpoint_period_s=10).longest_ms == 1200
    grown = [budget.after_epoch(0.2 + 2 * budget.ms / 1000, budget.ms / 1000, behind=True)
             for _ in range(8)]
    # Epochs settle at 0.5 s: 0.2 s fixed, 0.3 s for what 150 ms of reading brought.
    assert grown == [107, 129, 141, 146, 148, 149, 150, 150]
