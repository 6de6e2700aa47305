"""How long the next streaming epoch's source tasks read: adaptive epochs (design section 5).

An epoch costs a fixed part (scheduling its Spark job, the stages after the read,
loading and committing keyed state) on top of its reading. After every epoch the
driver measures that part (smoothed) and gives the next epoch the read budget
`--target_latency_ms` minus it, at least `MIN_READ_SHARE` of the goal, so an element
waits about one epoch: its reading, then the rest of the job.

Under a backlog the latency goal is already lost: the sources have more due at once
than an epoch reads (a task stopped at its budget with a restriction still due, as a
source read from long past or behind its input is). Short epochs then spend most of
the time on their fixed part, which only makes the backlog last longer. So while the
sources stay behind, epochs grow until one lasts `BACKLOG_FACTOR` times the goal:
the budget scales by that length over the last epoch's, at most doubling per epoch (the
rest of an epoch grows with what it read: the stages after the read process it). Spark's
micro-batches likewise take what is available. With consistent regions on, an epoch
grows to the checkpoint period at most: a cut is taken between epochs, so a longer
epoch would space the cuts wider than the user asked. Once a source waits for data
again (its restrictions come back with a resume delay), epochs return to the goal.
"""

from __future__ import annotations

MIN_READ_SHARE = 0.25  # the read budget never falls below this share of the latency goal
OVERHEAD_SMOOTHING = 0.5  # weight of the newest epoch in the measured fixed cost
BACKLOG_FACTOR = 4  # under a backlog an epoch lasts about this many times the goal


class ReadBudget:
    """The read budget of the next epoch (`ms`), from the last epochs' costs."""

    def __init__(self, target_latency_ms: int, checkpoint_period_s: float = 0.0) -> None:
        self.goal_ms = target_latency_ms
        self.ms = max(1, int(target_latency_ms * MIN_READ_SHARE))
        self._overhead_s: float | None = None
        # How long an epoch under a backlog may last (`checkpoint_period_s` 0: no cuts).
        self.longest_ms = target_latency_ms * BACKLOG_FACTOR
        if checkpoint_period_s > 0:
            self.longest_ms = min(self.longest_ms, 1000 * checkpoint_period_s)

    def after_epoch(self, wall_s: float, read_s: float, behind: bool) -> int:
        """The next epoch's budget, after an epoch of `wall_s` whose longest source task
        read for `read_s`; `behind`: a source task stopped at its budget with a
        restriction still due at once."""
        overhead = max(0.0, wall_s - read_s)
        if self._overhead_s is None:
            self._overhead_s = overhead
        else:
            self._overhead_s += OVERHEAD_SMOOTHING * (overhead - self._overhead_s)
        goal = self.goal_ms
        for_goal = max(1, round(min(goal, max(goal * MIN_READ_SHARE,
                                               goal - 1000 * self._overhead_s))))
        if behind:
            longest_ms = self.longest_ms
            scaled = self.ms * longest_ms / max(1000 * wall_s, 1.0)
            self.ms = max(for_goal, round(min(2 * self.ms, scaled, longest_ms)))
        else:
            self.ms = for_goal
        return self.ms
