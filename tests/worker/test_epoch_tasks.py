"""`read.ReadInEpochs.read_on`: how a source stage's epoch task reads on within its read
budget (`partition_epoch.PartitionEpoch.read_on` hands it the operator's
`read_residual` and the epoch's deadline)."""

from beam_streams_runner.translators.read import ReadInEpochs, Residual


class _Clock:
    """The clock `read_on` reads instead of time.monotonic: only bundles move it, so
    budgets and resume delays come out the same however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _ScriptedSource:
    """Stands in for a source stage's operator over the task's `ReadInEpochs` policy:
    each bundle of a restriction emits one record, takes `bundle_s` on `clock` and
    leaves a residual (with the scripted delay) until it has run `lengths`; what a
    bundle leaves goes to the policy (`keep`), as the operator hands it on."""

    def __init__(self, lengths: dict[bytes, int], delays: dict[bytes, float],
                 steps: dict[bytes, int] | None = None, bundle_s: float = 1.0) -> None:
        self.clock = _Clock()
        self.bundle_s = bundle_s
        self.left = dict(lengths)
        self.delays = delays
        self.steps = steps or {}  # how far a bundle moves the restriction's watermark
        self.watermarks = dict.fromkeys(lengths, 0)
        self.order: list[bytes] = []
        self.policy = ReadInEpochs(0)
        self.policy.deal(Residual('in', name, 0.0, 0) for name in lengths)

    @property
    def residuals(self) -> list[Residual]:
        """What the policy keeps for the driver's next epochs."""
        return self.policy.residuals

    def read_residual(self, residual):
        name = residual.element
        self.order.append(name)
        self.clock.now += self.bundle_s
        self.left[name] -= 1
        self.watermarks[name] += self.steps.get(name, 0)
        left = ([Residual('in', name, self.delays.get(name, 0.0), self.watermarks[name])]
                if self.left[name] else [])
        assert self.policy.keep(left) == []  # kept for read_on, not read at once
        return [('out', name)]

    def read_on(self, deadline: float):
        return self.policy.read_on(self.read_residual, deadline, self.clock)


def test_restrictions_take_turns_until_each_is_done():
    source = _ScriptedSource({b'a': 3, b'b': 2}, {})
    out = list(source.read_on(source.clock.now + 60))
    assert source.order == [b'a', b'b', b'a', b'b', b'a']
    assert out == [('out', name) for name in source.order]
    assert source.residuals == []


def test_the_restriction_furthest_behind_reads_first():
    source = _ScriptedSource({b'fast': 4, b'slow': 6}, {}, steps={b'fast': 10, b'slow': 4})
    list(source.read_on(source.clock.now + 60))
    # slow catches up with fast (watermarks 10 vs 4, 8, 12) before fast reads again
    assert source.order == [b'fast', b'slow', b'slow', b'slow', b'fast', b'slow', b'slow',
                            b'fast', b'slow', b'fast']


def test_a_restriction_waiting_for_data_goes_back_to_the_driver():
    source = _ScriptedSource({b'a': 3, b'paced': 3}, {b'paced': 30.0})
    list(source.read_on(source.clock.now + 60))
    assert source.order == [b'a', b'paced', b'a', b'a']
    (left,) = source.residuals
    # It went back 2 bundles (2 s) after it asked for 30 s: the driver waits the rest.
    assert left.element == b'paced' and left.resume_delay_s == 28.0


def test_the_budget_ends_reading_and_keeps_what_is_left():
    source = _ScriptedSource({b'a': 1000, b'b': 1000}, {})
    list(source.read_on(source.clock.now + 2.5))
    assert source.order == [b'a', b'b', b'a']  # 1 s bundles: the third ends at 3 s
    assert sorted(r.element for r in source.residuals) == [b'a', b'b']
    assert all(r.resume_delay_s == 0.0 for r in source.residuals)


def test_a_spent_budget_still_reads_one_bundle():
    source = _ScriptedSource({b'a': 1000, b'b': 1000}, {})
    list(source.read_on(source.clock.now - 1))
    assert source.order == [b'a']
    assert sorted(r.element for r in source.residuals) == [b'a', b'b']


def test_restrictions_at_different_paces_stay_together_over_epochs():
    # Each epoch's budget reads one bundle of the three. Read a bundle each per epoch,
    # their watermarks would drift apart by 2 per epoch (steps 12 vs 14).
    steps = {b'a': 12, b'b': 13, b'c': 14}
    source = _ScriptedSource(dict.fromkeys(steps, 10_000), {}, steps=steps)
    for _ in range(300):
        list(source.read_on(source.clock.now))
    assert max(source.watermarks.values()) - min(source.watermarks.values()) <= max(
        steps.values())
    assert len(source.order) == 300
