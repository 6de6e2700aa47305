"""The unbounded NEXMark source (`sources.ReadUnboundedNexmarkEvents`).

* On Beam's DirectRunner with `--streaming` it gives exactly the bounded source's events
  with the same timestamps.
* Its parts cover every position once, in emission order (event times rising).
* The watermark estimator never passes an event the part emits later (checked on the
  estimator's own logic over every part's emission order, with out-of-order groups and
  multi-step rate shapes).
* The pacing arithmetic (no timed assertion).
* The launcher's `--streaming` end to end in a subprocess.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import event_at, events
from benchmarks.nexmark.sources import (
    MAX_EVENTS_PER_CALL,
    NexmarkWatermarkEstimator,
    ReadNexmarkEvents,
    ReadUnboundedNexmarkEvents,
    UnboundedNexmarkFn,
    due_count,
    out_of_order_bound_ms,
    pacing_step,
    part_rate,
    resume_delay_s,
    unbounded_parts,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Identity(beam.DoFn):
    """Everything of an event, with the element timestamp, comparable."""

    def process(self, event, timestamp=beam.DoFn.TimestampParam):
        yield (type(event).__name__, tuple(sorted(
            (k, v.micros if isinstance(v, Timestamp) else v) for k, v in vars(event).items())),
            timestamp.micros)


def _expected(config: NexmarkConfig) -> list:
    return [(type(e.event).__name__, tuple(sorted(
        (k, v.micros if isinstance(v, Timestamp) else v) for k, v in vars(e.event).items())),
        e.timestamp.micros) for e in events(config)]


# Like the launcher: keeps the DirectRunner from first trying to download Prism.
DIRECT_ARGS = ['--allow_unsafe_triggers']


def test_unbounded_on_direct_runner_streaming_equals_bounded_source():
    config = NexmarkConfig(num_events=2000)
    expected = _expected(config)
    assert len(expected) == 2000
    with beam.Pipeline('DirectRunner', options=PipelineOptions(DIRECT_ARGS)) as p:
        assert_that(p | ReadNexmarkEvents(config) | beam.ParDo(_Identity()),
                    equal_to(expected))
    with beam.Pipeline('DirectRunner',
                       options=PipelineOptions(['--streaming', *DIRECT_ARGS])) as p:
        assert_that(p | ReadUnboundedNexmarkEvents(config) | beam.ParDo(_Identity()),
                    equal_to(expected))


def test_paced_unbounded_source_gives_the_same_events():
    # A high rate keeps the test short; the events must not change with pacing.
    config = NexmarkConfig(num_events=500, out_of_order_group_size=7)
    with beam.Pipeline('DirectRunner',
                       options=PipelineOptions(['--streaming', *DIRECT_ARGS])) as p:
        read = p | ReadUnboundedNexmarkEvents(config, rate=20_000, num_splits=3)
        assert_that(read | beam.ParDo(_Identity()), equal_to(_expected(config)))


@pytest.mark.parametrize('num_events,generators,splits', [
    (1003, 100, 8), (2000, 100, 3), (50, 100, 8), (7, 3, 2), (100, 1, 8), (10, 10, 10)])
def test_parts_cover_every_position_once_in_emission_order(num_events, generators, splits):
    config = NexmarkConfig(num_events=num_events, num_event_generators=generators)
    parts = unbounded_parts(config, splits)
    assert 1 <= len(parts) <= splits
    positions = [part.position(k) for part in parts for k in range(part.size)]
    assert sorted(positions) == list(range(num_events))
    for part in parts:
        assert part.size > 0
        numbers = [event_at(config, part.position(k)).event_number for k in range(part.size)]
        assert numbers == sorted(numbers)  # event numbers, so event times, rise


def test_out_of_order_bound():
    assert out_of_order_bound_ms(NexmarkConfig()) == 0
    # 100 timelines at 10,000 events/s: 10 ms between events of a timeline.
    assert out_of_order_bound_ms(NexmarkConfig(out_of_order_group_size=5)) == 40
    assert out_of_order_bound_ms(NexmarkConfig(watermark_holdback_sec=2)) == 2000


@pytest.mark.parametrize('changes', [
    {},
    {'out_of_order_group_size': 7},
    {'out_of_order_group_size': 50, 'num_event_generators': 3},
    {'out_of_order_group_size': 4, 'rate_shape': 'SINE', 'first_event_rate': 10_000,
     'next_event_rate': 1_000, 'rate_period_sec': 2, 'num_event_generators': 5},
    {'out_of_order_group_size': 3, 'rate_shape': 'SQUARE', 'first_event_rate': 333,
     'next_event_rate': 7_000, 'rate_period_sec': 2, 'num_event_generators': 2},
])
def test_watermark_never_passes_a_later_event(changes):
    config = NexmarkConfig(num_events=3000, **changes)
    bound = out_of_order_bound_ms(config)
    slack = []
    for part in unbounded_parts(config, 4):
        stamps = [event_at(config, part.position(k)).timestamp for k in range(part.size)]
        # suffix[k] = the oldest event emitted at or after offset k.
        suffix = [MAX_TIMESTAMP] * (len(stamps) + 1)
        for k in range(len(stamps) - 1, -1, -1):
            suffix[k] = min(stamps[k], suffix[k + 1])
        estimator = NexmarkWatermarkEstimator((MIN_TIMESTAMP.micros, None), bound)
        previous = estimator.current_watermark()
        for k, stamp in enumerate(stamps):
            estimator.advance(stamp)
            watermark = estimator.current_watermark()
            assert watermark >= previous  # monotonic
            assert watermark <= suffix[k + 1], (part, k)  # no later event is late
            if suffix[k + 1] < MAX_TIMESTAMP:
                slack.append((suffix[k + 1] - watermark).micros)
            previous = watermark
        estimator.exhaust()
        assert estimator.current_watermark() == MAX_TIMESTAMP
    # Not vacuous: at times the watermark comes within the bound of the oldest event to come.
    assert min(slack) <= bound * 1000


def test_watermark_state_round_trips_through_a_checkpoint():
    estimator = NexmarkWatermarkEstimator((MIN_TIMESTAMP.micros, None), 40)
    assert estimator.pacing_origin(default=99.0) == 99.0
    estimator.advance(Timestamp(micros=5_000_000))
    state = estimator.get_estimator_state()
    assert state == (4_960_000, 99.0)
    resumed = NexmarkWatermarkEstimator(state, 40)
    assert resumed.current_watermark() == Timestamp(micros=4_960_000)
    assert resumed.pacing_origin(default=150.0) == 99.0
    resumed.advance(Timestamp(micros=1_000_000))  # older: the watermark does not go back
    assert resumed.current_watermark() == Timestamp(micros=4_960_000)


def test_pacing_arithmetic():
    # Event k of a part is due at k / rate seconds after the origin.
    assert due_count(-0.1, 100.0) == 0
    assert due_count(0.0, 100.0) == 1
    assert due_count(0.0099, 100.0) == 1
    assert due_count(0.01, 100.0) == 2
    assert due_count(1.0, 100.0) == 101
    assert resume_delay_s(150, 1.0, 100.0) == pytest.approx(0.5)
    assert resume_delay_s(50, 1.0, 100.0) == 0.0
    # The overall rate is shared in proportion to the part sizes.
    assert part_rate(1000.0, 250, 1000) == 250.0
    # At 100 events/s, 1.0 s after the origin, from offset 40: offsets 40..100 are due;
    # the next (101) is due 0.01 s later.
    end, delay = pacing_step(40, 1000, 1.0, 100.0)
    assert end == 101 and delay == pytest.approx(0.01)
    # Nothing due yet: no event, wait until offset 40's time.
    end, delay = pacing_step(40, 1000, 0.2, 100.0)
    assert end == 40 and delay == pytest.approx(0.2)
    # Far behind: at most a batch per call, resume at once.
    end, delay = pacing_step(0, 10**9, 10**6, 1000.0, max_batch=500)
    assert end == 500 and delay == 0.0
    # The last events: no resume.
    assert pacing_step(990, 1000, 100.0, 100.0) == (1000, None)
    # As fast as possible: batches of max_batch, resume at once, then done.
    assert pacing_step(0, 25_000, 0.0, None) == (MAX_EVENTS_PER_CALL, 0.0)
    assert pacing_step(20_000, 25_000, 0.0, None) == (25_000, None)


class _FakeTracker:
    """The restriction tracker view a runner hands `process` (claims and checkpoints)."""

    def __init__(self, start: int, stop: int) -> None:
        from apache_beam.io.restriction_trackers import OffsetRange
        self.restriction = OffsetRange(start, stop)
        self.claimed: list[int] = []
        self.deferred = None

    def current_restriction(self):
        return self.restriction

    def try_claim(self, position: int) -> bool:
        self.claimed.append(position)
        return position < self.restriction.stop

    def defer_remainder(self, delay=None):
        self.deferred = delay


def test_process_emits_what_is_due_then_defers():
    config = NexmarkConfig(num_events=1000)
    now = [1000.0]
    fn = UnboundedNexmarkFn(config, rate=100.0, clock=lambda: now[0])
    part = unbounded_parts(config, 4)[0]  # 250 events: 25 events/s of the 100
    estimator = fn.create_watermark_estimator(fn.initial_estimator_state(None, None))
    tracker = _FakeTracker(0, part.size)
    out = list(fn.process(part.element(), tracker, estimator))
    assert len(out) == 1 and tracker.claimed == [0]  # only event 0 is due at the origin
    assert tracker.deferred.micros == 40_000  # event 1 is due 1/25 s later
    assert estimator.get_estimator_state()[1] == 1000.0  # the origin travels in the state
    # Resumed 1 s later: events 1..25 are due.
    now[0] = 1001.0
    tracker = _FakeTracker(1, part.size)
    out = list(fn.process(part.element(), tracker, estimator))
    assert tracker.claimed == list(range(1, 26))
    assert [tv.timestamp for tv in out] == [
        event_at(config, part.position(k)).timestamp for k in range(1, 26)]
    # Much later: the rest, the watermark goes to +inf, no resume.
    now[0] = 2000.0
    tracker = _FakeTracker(26, part.size)
    out = list(fn.process(part.element(), tracker, estimator))
    assert len(out) == part.size - 26 and tracker.deferred is None
    assert estimator.current_watermark() == MAX_TIMESTAMP


def test_wall_clock_event_times_make_each_event_due_at_its_event_time():
    # At the generator's own rate, with wall-clock event times, the pacing origin is
    # the base time: what is due at wall time t is what has an event time up to t.
    base_s = 5000.0
    config = NexmarkConfig(num_events=1000, use_wallclock_event_time=True,
                           base_time_ms=int(base_s * 1000), first_event_rate=100,
                           next_event_rate=100)
    now = [base_s - 1.0]  # read before the base time: nothing is due yet
    fn = UnboundedNexmarkFn(config, rate=100.0, clock=lambda: now[0])
    part = unbounded_parts(config, 4)[0]
    estimator = fn.create_watermark_estimator(fn.initial_estimator_state(None, None))
    tracker = _FakeTracker(0, part.size)
    assert list(fn.process(part.element(), tracker, estimator)) == []
    assert estimator.get_estimator_state()[1] == base_s
    now[0] = base_s + 2.0
    tracker = _FakeTracker(0, part.size)
    out = list(fn.process(part.element(), tracker, estimator))
    assert out and all(tv.timestamp.micros <= now[0] * 1e6 for tv in out)
    # The next event of the part is not due yet, and its event time is in the future.
    following = event_at(config, part.position(len(out)))
    assert following.timestamp.micros > (now[0] - 0.1) * 1e6


def test_launcher_streaming_end_to_end_is_compared_with_a_cached_batch_run(tmp_path):
    env = dict(os.environ, NEXMARK_REFERENCE_CACHE=str(tmp_path / 'cache'))
    env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO_ROOT, env.get('PYTHONPATH')) if p)

    def launch(out: str) -> list[dict[str, str]]:
        proc = subprocess.run(
            [sys.executable, '-m', 'benchmarks.nexmark', '--streaming',
             '--runner=DirectRunner', '--query=0,1', '--events=1000', f'--out={out}'],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
            check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert '1000 outputs' in proc.stdout  # Q0: every event
        assert '920 outputs' in proc.stdout  # Q1: the bids (46 of every 50 events)
        with open(os.path.join(out, 'results.csv'), encoding='utf-8') as f:
            return list(csv.DictReader(f))
    rows = launch(str(tmp_path / 'first'))
    # Every streaming row has a verdict against a batch run of the same events.
    assert [(r['runner'], r['equal_to_reference'], r['note']) for r in rows] == [
        ('DirectRunner', 'yes', ''), ('DirectRunner (batch)', 'reference', ''),
        ('DirectRunner', 'yes', ''), ('DirectRunner (batch)', 'reference', '')]
    report = (tmp_path / 'first' / 'report.md').read_text()
    assert 'mode: streaming, as fast as possible' in report
    # The second time the batch runs come from the cache.
    rows = launch(str(tmp_path / 'second'))
    assert [r['note'] for r in rows] == ['', 'cached run', '', 'cached run']
    assert [r['equal_to_reference'] for r in rows] == ['yes', 'reference'] * 2


def test_streaming_q3_may_lack_only_each_sellers_unfired_last_pane():
    from benchmarks.nexmark.verdicts import RunResult, equality_verdict, q3_full_join
    config = NexmarkConfig(num_events=50_000)
    join = q3_full_join(config)
    by_seller: dict[int, list[str]] = {}
    for line, seller in sorted(join.items()):
        by_seller.setdefault(seller, []).append(line)
    big = [lines for lines in by_seller.values() if len(lines) >= 40][:2]
    assert len(big) >= 2, 'the config must have two sellers with 40+ auctions'
    batch = [line for lines in big for line in lines]

    def run(lines):
        return RunResult(3, 'X', config.num_events, ok=True, lines=sorted(lines),
                         output_count=len(lines))
    # One seller lacks its last 29 auctions, another all of them: unfired last panes.
    streamed = big[0][:-29]
    verdict, note = equality_verdict(3, run(streamed), run(batch), config, True)
    assert verdict == 'no (unfired last panes)', note
    assert '1 sellers lack their last 1-29 auctions (29 pairs)' in note
    assert f'1 sellers lack all ({len(big[1])} pairs' in note
    # Not in batch mode, and not when a seller lacks 30 but keeps some.
    assert equality_verdict(3, run(streamed), run(batch), config)[0] == 'no'
    assert equality_verdict(3, run(big[0][:-30] + big[1]), run(batch), config,
                            True)[0] == 'no'
    # A duplicate, or a pair outside the batch output, is a plain difference.
    assert equality_verdict(3, run(streamed + streamed[:1]), run(batch), config,
                            True)[0] == 'no'
    outside = next(line for line in join if line not in set(batch))
    assert equality_verdict(3, run([*streamed, outside]), run(batch), config,
                            True)[0] == 'no'
    assert equality_verdict(3, run(batch), run(batch), config, True)[0] == 'yes'


def test_a_runner_that_cannot_stream_is_a_failed_result_with_its_reason():
    from apache_beam.runners.runner import PipelineRunner

    from beam_streams_runner.errors import UnsupportedFeatureError
    from benchmarks.nexmark.runs import run_query

    class NoStreaming(PipelineRunner):
        def run_pipeline(self, pipeline, options):
            raise UnsupportedFeatureError('streaming is not supported yet')

    result = run_query(0, NoStreaming(), NexmarkConfig(num_events=10), streaming=True)
    assert not result.ok
    assert result.error == 'UnsupportedFeatureError: streaming is not supported yet'
