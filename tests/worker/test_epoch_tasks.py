"""`epoch_tasks.read_on`: how a source stage's task reads on within its read budget."""

from beam_streams_runner.translators.par_do import Residual
from beam_streams_runner.worker.epoch_tasks import read_on


class _Clock:
    """The clock `read_on` reads instead of time.monotonic: only bundles move it, so
    budgets and resume delays come out the same however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _ScriptedSource:
    """Stands in for a source stage's operator: each bundle of a restriction emits one
    record, takes `bundle_s` on `clock` and leaves a residual (with the scripted delay)
    until it has run `lengths`."""

    def __init__(self, lengths: dict[bytes, int], delays: dict[bytes, float],
                 steps: dict[bytes, int] | None = None, bundle_s: float = 1.0) -> None:
        self.clock = _Clock()
        self.bundle_s = bundle_s
        self.left = dict(lengths)
        self.delays = delays
        self.steps = steps or {}  # how far a bundle moves the restriction's watermark
        self.watermarks = dict.fromkeys(lengths, 0)
        self.order: list[bytes] = []
        self.residuals = [Residual('in', name, 0.0, 0) for name in lengths]

    def read_residual(self, residual):
        name = residual.element
        self.order.append(name)
        self.clock.now += self.bundle_s
        self.left[name] -= 1
        self.watermarks[name] += self.steps.get(name, 0)
        if self.left[name]:
            self.residuals.append(Residual('in', name, self.delays.get(name, 0.0),
                                           self.watermarks[name]))
        return [('out', name)]


def test_restrictions_take_turns_until_each_is_done():
    source = _ScriptedSource({b'a': 3, b'b': 2}, {})
    out = list(read_on(source, source.clock.now + 60, source.clock))
    assert source.order == [b'a', b'b', b'a', b'b', b'a']
    assert out == [('out', name) for name in source.order]
    assert source.residuals == []


def test_the_restriction_furthest_behind_reads_first():
    source = _ScriptedSource({b'fast': 4, b'slow': 6}, {}, steps={b'fast': 10, b'slow': 4})
    list(read_on(source, source.clock.now + 60, source.clock))
    # slow catches up with fast (watermarks 10 vs 4, 8, 12) before fast reads again
    assert source.order == [b'fast', b'slow', b'slow', b'slow', b'fast', b'slow', b'slow',
                            b'fast', b'slow', b'fast']


def test_a_restriction_waiting_for_data_goes_back_to_the_driver():
    source = _ScriptedSource({b'a': 3, b'paced': 3}, {b'paced': 30.0})
    list(read_on(source, source.clock.now + 60, source.clock))
    assert source.order == [b'a', b'paced', b'a', b'a']
    (left,) = source.residuals
    # It went back 2 bundles (2 s) after it asked for 30 s: the driver waits the rest.
    assert left.element == b'paced' and left.resume_delay_s == 28.0


def test_the_budget_ends_reading_and_keeps_what_is_left():
    source = _ScriptedSource({b'a': 1000, b'b': 1000}, {})
    list(read_on(source, source.clock.now + 2.5, source.clock))
    assert source.order == [b'a', b'b', b'a']  # 1 s bundles: the third ends at 3 s
    assert sorted(r.element for r in source.residuals) == [b'a', b'b']
    assert all(r.resume_delay_s == 0.0 for r in source.residuals)


def test_a_spent_budget_still_reads_one_bundle():
    source = _ScriptedSource({b'a': 1000, b'b': 1000}, {})
    list(read_on(source, source.clock.now - 1, source.clock))
    assert source.order == [b'a']
    assert sorted(r.element for r in source.residuals) == [b'a', b'b']


def test_restrictions_at_different_paces_stay_together_over_epochs():
    # Each epoch's budget reads one bundle of the three. Read a bundle each per epoch,
    # their watermarks would drift apart by 2 per epoch (steps 12 vs 14).
    steps = {b'a': 12, b'b': 13, b'c': 14}
    source = _ScriptedSource(dict.fromkeys(steps, 10_000), {}, steps=steps)
    for _ in range(300):
        list(read_on(source, source.clock.now, source.clock))
    assert max(source.watermarks.values()) - min(source.watermarks.values()) <= max(
        steps.values())
    assert len(source.order) == 300
