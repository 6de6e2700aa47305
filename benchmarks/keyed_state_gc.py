"""Keyed state under churning keys: flat with the runner's keyed-state GC, growing without.

Streaming pipelines whose keys appear and die out run on StreamsSparkRunner twice,
once with the ordered keyed-state garbage collection (design section 7) and once with
`--no_keyed_state_gc`, side by side. While each runs, every `--sample_s` (0.5 s) it
samples the wall time, the events read so far (a user counter after the source), the
outputs (a counter at the sink), the runner's gauges (namespace `StreamsSparkRunner`:
`keyed_states`, `timers`, and the Pending States Graph's `pushed_back_elements` and
`pending_side_windows`, each summed over all steps) and the resident memory of
PySpark's Python workers (the Python processes below the JVM below this process: the
worker daemon and the workers it forks): RSS (VmRSS summed, so the pages the forks share
with the daemon count once per process) and PSS (`Pss:` of `/proc/<pid>/smaps_rollup`
summed over the same processes, which shares those pages out: counted once in all).

Cases (`--cases`):

* `synthetic`: an unbounded splittable DoFn (`ChurnSourceFn`, `--parts` parallel
  parts) emits `--events` events over `--windows` one-second event-time windows
  (`--window_s`); the keys of a window (`--keys` over all windows, default one per
  event: 1M events = 1M keys, 10,000 per window) never recur; the watermark follows
  event time. After `WindowInto(FixedWindows)`, two branches keyed by the churning
  keys: a stateful DoFn (`CountUntilWindowEnd`: a per-key count in combining state,
  an event-time timer at the window's end that emits the count and clears the state)
  and a `GroupByKey`.
* `nexmark-q5`, `nexmark-q4`: Beam's own Python NEXMark queries 5 (bids per auction
  in sliding windows, then the hottest auctions) and 4 (winning bids of closed
  auctions in a custom merging window, then the average price per category over
  sliding windows) over the unbounded NEXMark source (`ReadUnboundedNexmarkEvents`'
  DoFn), keyed by auctions that close and never recur. The event rate is set so that
  the events span `--windows` * `--window_s` seconds of event time, and the sliding
  windows are 2 * `--window_s` every `--window_s` (Beam's defaults, 10 s every 5 s,
  would cover 10% of a 100-second stream each, so the state would never reach a
  steady size in the first 10% of the events).

Every source ends by holding its watermark at the time of its last event (an extra
restriction that reads nothing, `HOLD`): the stream stays open with all but the last
window expired, so the state after all the events is measured without the end of
the stream (the watermark going to +inf) flushing it. A run ends once all events are
read and two more epochs reported their gauges; it is then cancelled.

Every case's outputs go to a `sink_check.CountingSink` (appending to files of its DoFn
instances, read after the run), and the run's `output ok` checks what it wrote against
what the events imply (`Case.check`): for `synthetic`, a `(key, count)` per key of every
window the held watermark closed, once from each branch (count, and a checksum of keys
and counts; `synthetic_expected`); for NEXMark, the query's batch output over the same
events on the DirectRunner (BundleBasedDirectRunner for Q4), in the windows that end
before the hold (`closed_window_lines`; that reference run comes after the timed run,
in the same process). An empty output, or a run that did not finish, is failed; such
a run's memory is not judged by the rule (`n/a`).

The rule (issue 6): "1x" is the first sample whose gauges come from an epoch that
ended after the events read had reached 10% of `--events` (`one_x_sample`), "10x" the
end (all events read, two more epochs); each figure at a point is its peak over all
samples up to that point (so the noise of a single sample does not decide). With GC
on, the Python workers' memory at 10x / at 1x must be <= 1.2, judged on RSS; the PSS
ratio is reported beside it (table, and a line per GC-on run above the table). The
report gives the events ratio actually reached (10 if an epoch boundary fell exactly
at 10%), the same ratio for the keyed states, and the GC-off run beside it. The
pipelines read no side input, so the Pending States Graph stays empty (its column
shows it).

What GC leaves live: the keys of the windows the watermark has not passed. The stage
watermark is the minimum over the source parts, so when the parts are read unevenly
(as fast as possible, some further ahead in event time than others) every key read
ahead of the slowest part stays live too; `--rate` paces all parts alike. At small
`--events` the 1x point still falls in the workers' warm-up (imports, first forks),
which the RSS ratio then includes.

    python -m benchmarks.keyed_state_gc --events=1000000 --cases=synthetic,nexmark-q5 \\
        --out benchmarks/results/<date>-keyed-state-gc [--spark_master=local[2] ...]

Options this module does not know go to the runner (`--bundle_size`,
`--target_latency_ms`, ...); `--spark_master` defaults to `local[2]`. Each run is a
fresh Python process (its own JVM and Python workers, so the memory of one run does
not carry into the next; `--in_process` runs them in this process instead, as the
tests do). It prints a progress line every few seconds and writes `OUT/gc.md` (the
table), `OUT/gc.csv` (the time series), `OUT/gc.png` (keyed states, and the workers'
RSS and PSS, over events read, GC on vs off, one column per case) and `OUT/logs/` (each
run's stderr).
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.io import iobase
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import userstate, window
from apache_beam.transforms.core import RestrictionProvider, WatermarkEstimatorProvider
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp

import beam_streams_runner  # noqa: F401 - registers the short runner name
from beam_streams_runner.metrics import RUNNER_NAMESPACE
from benchmarks import sink_check
from benchmarks.children import REPO_ROOT, child_environment
from benchmarks.nexmark import launcher, runs, verdicts
from benchmarks.nexmark.capture import output_line
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.early_bids import WINNING_BIDS_QUERIES
from benchmarks.nexmark.generator import event_at
from benchmarks.nexmark.sources import (
    UnboundedNexmarkFn,
    end_call,
    pacing_step,
    part_rate,
    unbounded_parts,
)

NAMESPACE = 'keyed_state_gc'  # the user counters: events read, outputs
GAUGES = ('keyed_states', 'timers', 'pushed_back_elements', 'pending_side_windows')
# Events one source `process` call emits before it checkpoints.
MAX_EVENTS_PER_CALL = 10_000
# The element of the extra source restriction that reads nothing and holds the
# watermark at the last event's time; it asks to be called again after this long.
HOLD = -1
NEXMARK_HOLD = (-1, -1)
HOLD_POLL_S = 0.5
# The hold sits this far (micros) before the last event: Beam encodes timer timestamps
# in milliseconds, so a timer set at a window's max timestamp (end - 1 us) fires at
# end - 1 ms, which may be the last event's own time.
HOLD_MARGIN_US = 1000
ONE_X = 0.1  # "1x" = this share of the events; the end is 10x
RULE = 1.2  # with GC on, memory at 10x / at 1x must not exceed this
SAMPLE_FIELDS = ('case', 'gc', 't_s', 'events', 'outputs', *GAUGES, 'rss_mb', 'pss_mb',
                 'workers', 'gauge_age_s', 'keyed_states_by_step')


# ---------------------------------------------------------------- synthetic source


@dataclass(frozen=True)
class Churn:
    """`events` events over `windows` event-time windows of `window_s` seconds.

    Event i lies in window w(i) = i * windows // events, at time
    i * windows * window_s / events (so event time rises with i and the events of a
    window are consecutive), with the key w * keys_per_window + i % keys_per_window:
    every window has its own keys, which never recur.
    """

    events: int
    windows: int
    keys: int
    window_s: float = 1.0

    @property
    def keys_per_window(self) -> int:
        return max(1, self.keys // self.windows)

    @property
    def window_us(self) -> int:
        return round(self.window_s * 1_000_000)

    def window_of(self, i: int) -> int:
        return i * self.windows // self.events

    def timestamp(self, i: int) -> Timestamp:
        return Timestamp(micros=i * self.windows * self.window_us // self.events)

    def key(self, i: int) -> int:
        return self.window_of(i) * self.keys_per_window + i % self.keys_per_window

    def first_event(self, w: int) -> int:
        """The first event of window `w` (the smallest i with window_of(i) >= w)."""
        return -(-w * self.events // self.windows)

    def distinct_keys(self) -> int:
        return sum(min(self.keys_per_window, self.first_event(w + 1) - self.first_event(w))
                   for w in range(self.windows))

    def last_timestamp(self) -> Timestamp:
        return self.timestamp(self.events - 1)

    def hold_timestamp(self) -> Timestamp:
        """Where `HOLD` keeps the watermark once the parts are exhausted."""
        return Timestamp(micros=self.last_timestamp().micros - HOLD_MARGIN_US)


class EventTimeWatermark(iobase.WatermarkEstimator):
    """Watermark = the time of the last event emitted (never going back); +inf when the
    part is exhausted. The hold restriction starts (and stays) at the last event's time.
    The state also keeps the part's pacing origin (wall-clock seconds, or None), as the
    NEXMark source does: `(watermark micros, origin)`."""

    def __init__(self, state: tuple[int, float | None]) -> None:
        self._watermark = Timestamp(micros=state[0])
        self._origin = state[1]

    def observe_timestamp(self, timestamp: Timestamp) -> None:
        pass  # the DoFn drives the watermark (`advance`)

    def current_watermark(self) -> Timestamp:
        return self._watermark

    def get_estimator_state(self) -> tuple[int, float | None]:
        return self._watermark.micros, self._origin

    def pacing_origin(self, default: float) -> float:
        if self._origin is None:
            self._origin = default
        return self._origin

    def advance(self, timestamp: Timestamp) -> None:
        if timestamp > self._watermark:
            self._watermark = timestamp

    def exhaust(self) -> None:
        self._watermark = MAX_TIMESTAMP


class ChurnSourceFn(beam.DoFn, RestrictionProvider, WatermarkEstimatorProvider):
    """The synthetic unbounded source: `(key, 1)` pairs of `Churn`, at their event time.

    Input: one element per part j in [0, parts), plus `HOLD`. Part j emits the events
    i = j, j + parts, j + 2 * parts, ... (offsets o = i // parts), so every part's clock
    advances at the same pace; it checkpoints every `MAX_EVENTS_PER_CALL` events. `HOLD`
    reads nothing: it defers itself forever with its watermark at the last event's
    time, so the stream stays open when the parts are exhausted (see the module
    docstring). The DoFn is its own restriction and watermark estimator provider.
    """

    def __init__(self, churn: Churn, parts: int, rate: float | None = None) -> None:
        super().__init__()
        self._churn = churn
        self._parts = parts
        self._rate = rate

    def _size(self, part: int) -> int:
        return len(range(part, self._churn.events, self._parts))

    # RestrictionProvider
    def initial_restriction(self, element: int) -> OffsetRange:
        return OffsetRange(0, 1 if element == HOLD else self._size(element))

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction: OffsetRange) -> int:
        return restriction.size()

    def split(self, element, restriction: OffsetRange) -> Iterator[OffsetRange]:
        yield restriction  # the parts are the parallelism (slices would hold the watermark)

    # WatermarkEstimatorProvider
    def initial_estimator_state(self, element, restriction) -> tuple[int, None]:
        if element == HOLD:
            return self._churn.hold_timestamp().micros, None
        return MIN_TIMESTAMP.micros, None

    def create_watermark_estimator(self, estimator_state) -> EventTimeWatermark:
        return EventTimeWatermark(estimator_state)

    @beam.DoFn.unbounded_per_element()
    def process(self, element: int, tracker=beam.DoFn.RestrictionParam(),
                watermark_estimator=beam.DoFn.WatermarkEstimatorParam()):
        if element == HOLD:
            tracker.defer_remainder(Duration(seconds=HOLD_POLL_S))
            return
        churn, parts = self._churn, self._parts
        restriction = tracker.current_restriction()
        start, stop = restriction.start, restriction.stop
        rate = origin = None
        elapsed = 0.0
        if self._rate is not None:
            rate = part_rate(self._rate, self._size(element), churn.events)
            origin = watermark_estimator.pacing_origin(time.time() - start / rate)
            elapsed = time.time() - origin
        end, delay = pacing_step(start, stop, elapsed, rate, MAX_EVENTS_PER_CALL)
        for offset in range(start, end):
            if not tracker.try_claim(offset):
                return
            i = offset * parts + element
            timestamp = churn.timestamp(i)
            watermark_estimator.advance(timestamp)
            yield window.TimestampedValue((churn.key(i), 1), timestamp)
        end_call(tracker, watermark_estimator, end, delay, rate, lambda: time.time() - origin)


class CountUntilWindowEnd(beam.DoFn):
    """Counts each key's events of a window in keyed state; an event-time timer at the
    window's end emits `(key, count)` and clears the state."""

    COUNT = userstate.CombiningValueStateSpec('count', VarIntCoder(),
                                              beam.combiners.CountCombineFn())
    END = userstate.TimerSpec('end', TimeDomain.WATERMARK)

    def process(self, element, w=beam.DoFn.WindowParam,
                count=beam.DoFn.StateParam(COUNT), end=beam.DoFn.TimerParam(END)):
        count.add(element)
        end.set(w.max_timestamp())

    @userstate.on_timer(END)
    def flush(self, key=beam.DoFn.KeyParam, count=beam.DoFn.StateParam(COUNT)):
        yield key, count.read()
        count.clear()


def _counter(name: str) -> Callable:
    counter = beam.metrics.Metrics.counter(NAMESPACE, name)

    def count(element):
        counter.inc()
        return element
    return count


def build_synthetic(p: beam.Pipeline, known: argparse.Namespace
                    ) -> tuple[beam.PCollection, int]:
    """The synthetic case: its outputs `(key, count)` and the number of distinct keys."""
    churn = synthetic_churn(known)
    windowed = (p
                | 'Parts' >> beam.Create([*range(known.parts), HOLD])
                | 'Events' >> beam.ParDo(ChurnSourceFn(churn, known.parts, known.rate))
                # Typed, so the keys get a deterministic coder (VarInt).
                | 'CountEvents' >> beam.Map(_counter('events')).with_output_types(
                    tuple[int, int])
                | 'Window' >> beam.WindowInto(window.FixedWindows(churn.window_s)))
    counts = windowed | 'StatefulCount' >> beam.ParDo(CountUntilWindowEnd())
    sums = (windowed
            | 'GroupByKey' >> beam.GroupByKey()
            | 'Sum' >> beam.MapTuple(lambda key, ones: (key, sum(ones))))
    return (counts, sums) | 'Outputs' >> beam.Flatten(), churn.distinct_keys()


def synthetic_churn(known: argparse.Namespace) -> Churn:
    return Churn(known.events, known.windows, known.keys or known.events, known.window_s)


CHECKSUM_BASE = 1 << 32  # above any count of one key in one window


def synthetic_checksum(element: tuple[int, int]) -> int:
    """The sink's checksum of a synthetic output `(key, count)`: both in one number."""
    key, count = element
    return key * CHECKSUM_BASE + count


def synthetic_expected(churn: Churn) -> sink_check.Tally:
    """What the synthetic sink must have got once the stream is held (`HOLD`): for every
    window that ends at or before the hold, a `(key, count)` per key of the window twice
    (from the stateful DoFn's timer and from the GroupByKey), summed by
    `synthetic_checksum`; the last window stays open. (A hold less than a millisecond
    past a window's end, when the last window's events span under 1 ms, would leave it
    to the millisecond encoding of timers whether that window fires.)"""
    hold = churn.hold_timestamp().micros
    total = sink_check.Tally()
    for w in range(churn.windows):
        if (w + 1) * churn.window_us > hold:
            break
        counts = collections.Counter(
            churn.key(i) for i in range(churn.first_event(w), churn.first_event(w + 1)))
        total += sink_check.Tally(len(counts), sum(map(synthetic_checksum, counts.items())))
    return sink_check.Tally(2 * total.count, 2 * total.checksum)


def check_synthetic(known: argparse.Namespace, written: sink_check.SinkOutput) -> str:
    """The synthetic run's `output_ok` (`synthetic_expected`)."""
    return sink_check.verdict(synthetic_expected(synthetic_churn(known)), written.tally)


# ---------------------------------------------------------------- NEXMark


class HeldNexmarkFn(UnboundedNexmarkFn):
    """The unbounded NEXMark source (as fast as possible) plus the `NEXMARK_HOLD`
    element, which reads nothing and holds the watermark at `hold_until`."""

    def __init__(self, config: NexmarkConfig, hold_until: Timestamp,
                 rate: float | None = None) -> None:
        super().__init__(config, rate)
        self._hold_micros = hold_until.micros

    def initial_restriction(self, element: tuple[int, int]) -> OffsetRange:
        if tuple(element) == NEXMARK_HOLD:
            return OffsetRange(0, 1)
        return super().initial_restriction(element)

    def initial_estimator_state(self, element, restriction):
        if tuple(element) == NEXMARK_HOLD:
            return self._hold_micros, None
        return super().initial_estimator_state(element, restriction)

    @beam.DoFn.unbounded_per_element()
    def process(self, element: tuple[int, int], tracker=beam.DoFn.RestrictionParam(),
                watermark_estimator=beam.DoFn.WatermarkEstimatorParam()):
        if tuple(element) == NEXMARK_HOLD:
            tracker.defer_remainder(Duration(seconds=HOLD_POLL_S))
            return
        yield from super().process(element, tracker, watermark_estimator)


def nexmark_config(known: argparse.Namespace) -> NexmarkConfig:
    """`--events` over `--windows` * `--window_s` seconds of event time; sliding windows
    of 2 * `--window_s` every `--window_s`."""
    span_s = known.windows * known.window_s
    rate = max(1, round(known.events / span_s))
    period = max(1, round(known.window_s))
    return NexmarkConfig(num_events=known.events, first_event_rate=rate,
                         next_event_rate=rate, window_size_sec=2 * period,
                         window_period_sec=period)


def nexmark_hold_timestamp(config: NexmarkConfig) -> Timestamp:
    """Where to hold the source's watermark: just before (`HOLD_MARGIN_US`) its latest
    event time, the last event of one of its timelines."""
    latest = MIN_TIMESTAMP
    for part in unbounded_parts(config):
        for offset in range(max(0, part.size - part.width), part.size):
            latest = max(latest, event_at(config, part.position(offset)).timestamp)
    return Timestamp(micros=latest.micros - HOLD_MARGIN_US)


def nexmark_query(query: int) -> Callable[[beam.Pipeline, argparse.Namespace],
                                          tuple[beam.PCollection, None]]:
    def build(p: beam.Pipeline, known: argparse.Namespace) -> tuple[beam.PCollection, None]:
        import importlib

        from apache_beam.testing.benchmarks.nexmark import nexmark_util
        nexmark_util.setup_coder()
        module = importlib.import_module(
            f'apache_beam.testing.benchmarks.nexmark.queries.query{query}')
        config = nexmark_config(known)
        parts = [part.element() for part in unbounded_parts(config)]
        events = (p
                  | 'Parts' >> beam.Create([*parts, NEXMARK_HOLD])
                  | 'Events' >> beam.ParDo(HeldNexmarkFn(
                      config, nexmark_hold_timestamp(config), known.rate))
                  | 'CountEvents' >> beam.Map(_counter('events')))
        return module.load(events, config.query_args(), p.options), None
    return build


_WINDOW = re.compile(r'\[(\S+), (\S+)\)')


def closed_window_lines(lines: Sequence[str], hold: Timestamp) -> list[str]:
    """The `capture.output_line`s whose window (an `IntervalWindow`) ends at or before
    `hold`: what a stream held there has fired."""
    closed = []
    for line in lines:
        match = _WINDOW.fullmatch(line.rsplit('\t', 2)[1])
        if match and round(float(match.group(2)) * 1e6) <= hold.micros:
            closed.append(line)
    return closed


def nexmark_check(query: int) -> Callable[[argparse.Namespace, sink_check.SinkOutput], str]:
    """The `output_ok` of a held NEXMark run of `query`: its output lines against those of
    the same query over the same events in batch on the DirectRunner (the
    BundleBasedDirectRunner for Q4, `launcher.reference_for`) whose windows ended before
    the hold (`closed_window_lines`), both with timestamps to the millisecond (the
    BundleBasedDirectRunner keeps microseconds). Q4 may instead equal the reference
    without the bids whose window closes before their auction exists, which Beam's
    streaming merging windows cannot join (`verdicts.early_bids_verdict`): `yes (bids
    closed before their auction)`."""
    def check(known: argparse.Namespace, written: sink_check.SinkOutput) -> str:
        config = nexmark_config(known)
        hold = nexmark_hold_timestamp(config)
        got = verdicts.truncate_to_millis(written.lines)
        first = ''
        variants = (False, True) if query in WINNING_BIDS_QUERIES else (False,)
        for without_early_bids in variants:
            reference = runs.run_query(query, launcher.reference_for(query, 'DirectRunner'),
                                       config, streaming=False,
                                       without_early_bids=without_early_bids)
            if not reference.ok:
                return f'failed: no reference: {reference.error}'
            expected = verdicts.truncate_to_millis(closed_window_lines(reference.lines, hold))
            result = sink_check.lines_verdict(got, expected)
            if result == sink_check.YES:
                return 'yes (bids closed before their auction)' if without_early_bids else result
            first = first or result
        return first
    return check


def output_lines(element, window, timestamp) -> list[str]:
    """The NEXMark sink's line of an output (`capture.output_line`)."""
    return [output_line(element, window, timestamp)]


@dataclass(frozen=True)
class Case:
    """A case: its pipeline (outputs, distinct keys if known), what its sink writes of
    each output (`sink_check.CountingSink`), the check of what the sink got, and the
    runner options it needs."""

    build: Callable[[beam.Pipeline, argparse.Namespace], tuple[beam.PCollection, int | None]]
    check: Callable[[argparse.Namespace, sink_check.SinkOutput], str]
    lines: sink_check.LinesFn | None = None
    checksum: Callable[[Any], int] | None = None
    args: tuple[str, ...] = ()


# Q11's trigger is "unsafe" for Beam's checks; the NEXMark queries all run with this.
NEXMARK_ARGS = ('--allow_unsafe_triggers',)
CASES: dict[str, Case] = {
    'synthetic': Case(build_synthetic, check_synthetic, checksum=synthetic_checksum),
    'nexmark-q5': Case(nexmark_query(5), nexmark_check(5), lines=output_lines,
                       args=NEXMARK_ARGS),
    'nexmark-q4': Case(nexmark_query(4), nexmark_check(4), lines=output_lines,
                       args=NEXMARK_ARGS),
}


# ---------------------------------------------------------------- sampling


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat', 'rb') as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        children[int(stat[stat.rindex(b')') + 2:].split()[1])].append(int(entry))
    return children


def proc_kb(path: str, field: str) -> int:
    """The kB of the first line starting with `field` (e.g. `VmRSS:` in
    `/proc/<pid>/status`, `Pss:` in `/proc/<pid>/smaps_rollup`); 0 if none or unreadable
    (a process that ended)."""
    try:
        with open(path, encoding='ascii', errors='replace') as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _comm(pid: int) -> str:
    try:
        with open(f'/proc/{pid}/comm', encoding='utf-8', errors='replace') as f:
            return f.read().strip()
    except OSError:
        return ''


def python_worker_memory(root: int | None = None) -> tuple[float, float, int] | None:
    """(RSS MB, PSS MB, processes) of PySpark's Python workers: the Python processes
    below a JVM below `root` (this process), i.e. the worker daemon (whatever its module,
    `spark.python.daemon.module`) and the workers it forked. RSS is summed (pages the
    forks share count once per process); PSS shares them out. None without /proc."""
    if not os.path.isdir('/proc'):
        return None
    children = _children()
    stack = [(os.getpid() if root is None else root, False)]
    rss_kb = pss_kb = count = 0
    while stack:
        pid, below_jvm = stack.pop()
        for child in children.get(pid, ()):
            comm = _comm(child)
            stack.append((child, below_jvm or comm == 'java'))
            if below_jvm and comm.startswith('python'):
                rss_kb += proc_kb(f'/proc/{child}/status', 'VmRSS:')
                pss_kb += proc_kb(f'/proc/{child}/smaps_rollup', 'Pss:')
                count += 1
    return rss_kb / 1024, pss_kb / 1024, count


class WorkerMemorySampler:
    """Samples the Python workers' memory (`python_worker_memory`) every `every_s` in a
    thread while the block runs: `samples` of (seconds since the Unix epoch, RSS MB, PSS
    MB), taken while workers run; their peaks; `pss_at(t)`, the PSS of the first sample at
    or after `t` (None: the last sample), '' without samples."""

    def __init__(self, every_s: float) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._every_s = every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> WorkerMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(self._every_s):
            memory = python_worker_memory()
            if memory is not None and memory[2]:
                self.samples.append((time.time(), memory[0], memory[1]))

    @property
    def peak_rss_mb(self) -> float:
        return max((rss for _, rss, _ in self.samples), default=0.0)

    @property
    def peak_pss_mb(self) -> float:
        return max((pss for _, _, pss in self.samples), default=0.0)

    def pss_at(self, t: float | None) -> float | str:
        if not self.samples:
            return ''
        if t is None:
            return round(self.samples[-1][2], 1)
        return round(next((pss for when, _, pss in self.samples if when >= t),
                          self.samples[-1][2]), 1)


def _value(result) -> int:
    value = result.committed if result.committed is not None else result.attempted
    return getattr(value, 'value', value) or 0


def metrics_snapshot(result) -> dict:
    """Counters of this module and the runner's gauges, summed over steps; also the
    keyed states per step and the latest gauge time."""
    metrics = result.metrics().query()
    snapshot: dict = {'events': 0, 'outputs': 0, **dict.fromkeys(GAUGES, 0)}
    by_step: dict[str, int] = {}
    latest = 0.0
    for counter in metrics['counters']:
        name = counter.key.metric
        if name.namespace == NAMESPACE and name.name in ('events', 'outputs'):
            snapshot[name.name] += _value(counter)
    for gauge in metrics['gauges']:
        name = gauge.key.metric
        if name.namespace != RUNNER_NAMESPACE or name.name not in GAUGES:
            continue
        snapshot[name.name] += _value(gauge)
        data = gauge.committed if gauge.committed is not None else gauge.attempted
        latest = max(latest, float(getattr(data, 'timestamp', 0) or 0))
        if name.name == 'keyed_states':
            by_step[gauge.key.step] = by_step.get(gauge.key.step, 0) + _value(gauge)
    # (A step may be None: the runner reported an empty GroupByKey partition so.)
    snapshot['keyed_states_by_step'] = ';'.join(
        f'{s}={n}' for s, n in sorted(by_step.items(), key=lambda item: str(item[0])))
    snapshot['gauge_time'] = latest
    return snapshot


def build_pipeline(case: str, gc: bool, known: argparse.Namespace, extra: Sequence[str],
                   sink_dir: str) -> tuple[beam.Pipeline, int | None]:
    """The pipeline of `case` on StreamsSparkRunner, its outputs counted (counter
    `outputs`, sampled while running) and written by a `sink_check.CountingSink` under
    `sink_dir` (read after the run); and its distinct keys if known."""
    args = ['--streaming', *CASES[case].args, *extra]
    if not any(a.startswith('--spark_master') for a in extra):
        args.append('--spark_master=local[2]')
    if not gc:
        args.append('--no_keyed_state_gc')
    p = beam.Pipeline(runner='StreamsSparkRunner', options=PipelineOptions(args))
    outputs, distinct_keys = CASES[case].build(p, known)
    _ = (outputs
         | 'Sink' >> beam.Map(_counter('outputs'))
         | 'Write' >> beam.ParDo(sink_check.CountingSink(
             os.path.join(sink_dir, 'sink'), CASES[case].lines, CASES[case].checksum)))
    return p, distinct_keys


def check_output(case: str, status: str, known: argparse.Namespace, sink_dir: str) -> str:
    """The run's `output_ok`: what its sink wrote against what the case's input implies
    (`Case.check`); a run that did not end as planned is failed unchecked."""
    if status != 'ok':
        return f'failed: the run did not finish ({status})'
    try:
        return CASES[case].check(known, sink_check.read_sink(sink_dir))
    except Exception as e:  # noqa: BLE001 - a check that cannot run is no verdict
        traceback.print_exc()
        return f'failed: check failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}'


def run_case(case: str, gc: bool, known: argparse.Namespace, extra: Sequence[str]) -> dict:
    """Runs one case in this process; returns {'samples': [...], 'status', 'output_ok',
    'distinct_keys', 'wall_s'}. The pipeline is cancelled once all events are read and
    two more epochs reported, or when the events stop moving for `--stall_s`; then what
    its sink got is checked (`check_output`, not part of `wall_s`)."""
    label = f"{case} gc={'on' if gc else 'off'}"
    sink_dir = tempfile.mkdtemp(prefix='keyed-state-gc-sink-')
    p, distinct_keys = build_pipeline(case, gc, known, extra, sink_dir)
    started = time.monotonic()
    result = p.run()
    samples: list[dict] = []
    status = 'ok'
    last_print = last_move = started
    last_events = -1
    reached_gauge_time: float | None = None
    reached_at = started
    gauge_updates = 0
    last_gauge_time = 0.0
    try:
        while True:
            state = result.wait_until_finish(duration=int(known.sample_s * 1000))
            now = time.monotonic()
            snapshot = metrics_snapshot(result)
            memory = python_worker_memory()
            rss, pss, workers = memory if memory else (math.nan, math.nan, 0)
            wall = time.time()
            sample = {'case': case, 'gc': 'on' if gc else 'off', 't_s': round(now - started, 2),
                      'wall': wall, **snapshot, 'rss_mb': round(rss, 1), 'pss_mb': round(pss, 1),
                      'workers': workers,
                      'gauge_age_s': (round(wall - snapshot['gauge_time'], 2)
                                      if snapshot['gauge_time'] else '')}
            samples.append(sample)
            if now - last_print >= known.progress_s:
                last_print = now
                print(f"[{label}] {sample['t_s']:7.1f} s  events {sample['events']:>9}/"
                      f"{known.events}  keyed_states {sample['keyed_states']:>8}  "
                      f"timers {sample['timers']:>8}  RSS {rss:7.1f} MB  PSS {pss:7.1f} MB",
                      flush=True)
            if PipelineState.is_terminal(state):
                status = f'ended early: {state}'
                break
            if snapshot['events'] != last_events:
                last_events, last_move = snapshot['events'], now
            elif now - last_move > known.stall_s:
                status = f'stalled: no event read for {known.stall_s} s'
                break
            if snapshot['events'] >= known.events:
                if reached_gauge_time is None:
                    reached_gauge_time = last_gauge_time = snapshot['gauge_time']
                    reached_at = now
                elif snapshot['gauge_time'] > last_gauge_time:
                    last_gauge_time = snapshot['gauge_time']
                    gauge_updates += 1
                if gauge_updates >= 2 and now - reached_at >= known.tail_s:
                    break
    except Exception as e:  # noqa: BLE001 - a failed run is a result
        traceback.print_exc()
        status = f'failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}'
    finally:
        if not PipelineState.is_terminal(result.state):
            result.cancel()
    wall_s = round(time.monotonic() - started, 2)
    output_ok = check_output(case, status, known, sink_dir)
    shutil.rmtree(sink_dir, ignore_errors=True)
    return {'case': case, 'gc': 'on' if gc else 'off', 'samples': samples, 'status': status,
            'output_ok': output_ok, 'distinct_keys': distinct_keys, 'wall_s': wall_s}


def run_in_subprocess(case: str, gc: bool, argv: Sequence[str], out: str) -> dict:
    """`run_case` in a fresh Python process (its own JVM and Python workers)."""
    logs = os.path.join(out, 'logs')
    os.makedirs(logs, exist_ok=True)
    name = f"{case}-gc-{'on' if gc else 'off'}"
    with tempfile.NamedTemporaryFile(suffix='.json', delete=False) as f:
        result_path = f.name
    command = [sys.executable, '-m', 'benchmarks.keyed_state_gc', '--run-one', case,
               f"--gc={'on' if gc else 'off'}", f'--result={result_path}', *argv]
    with open(os.path.join(logs, name + '.log'), 'w') as log:
        code = subprocess.call(command, cwd=REPO_ROOT, env=child_environment(), stderr=log)
    try:
        with open(result_path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {'case': case, 'gc': 'on' if gc else 'off', 'samples': [],
                'status': f'failed: exit code {code}, see logs/{name}.log',
                'output_ok': 'failed: no result', 'distinct_keys': None, 'wall_s': 0}
    finally:
        os.unlink(result_path)


# ---------------------------------------------------------------- report


def _peak(samples: Sequence[dict], name: str) -> float:
    values = [s[name] for s in samples if not (isinstance(s[name], float) and math.isnan(s[name]))]
    return max(values) if values else math.nan


def one_x_sample(samples: Sequence[dict], events: int) -> int | None:
    """The index of the 1x sample: the first whose gauges were set (at an epoch's end)
    after the event counter had reached `ONE_X` of `events`. (The counter moves as soon
    as the reading tasks end, the runner's gauges only when the whole epoch ends.)"""
    reached = next((s for s in samples if s['events'] >= ONE_X * events), None)
    if reached is None:
        return None
    return next((i for i, s in enumerate(samples)
                 if s['events'] >= reached['events'] and s['gauge_time'] >= reached['wall']),
                None)


def gauge_updates(samples: Sequence[dict]) -> list[dict]:
    """The samples that carry new gauges (an epoch ended since the previous sample)."""
    return [s for i, s in enumerate(samples)
            if i == 0 or s['gauge_time'] != samples[i - 1]['gauge_time']]


def summarize(run: dict, events: int) -> dict:
    """The table row of a run: peaks up to 1x (`one_x_sample`) and up to 10x (all
    samples: the run ends two epochs after all events were read)."""
    samples = run['samples']
    one_x = one_x_sample(samples, events)
    complete = bool(samples) and samples[-1]['events'] >= events
    row = {'case': run['case'], 'gc': run['gc'], 'status': run['status'],
           'output_ok': run.get('output_ok', ''),
           'events': samples[-1]['events'] if samples else 0,
           'distinct_keys': run['distinct_keys'] if run['distinct_keys'] is not None else '',
           'wall_s': run['wall_s']}
    if one_x is None or not complete:
        return {**row, 'rule': 'n/a'}
    first, whole = samples[:one_x + 1], samples
    row['events_1x'] = samples[one_x]['events']
    row['events_ratio'] = _ratio(row['events'], row['events_1x'])
    for name in ('keyed_states', 'timers', 'rss_mb', 'pss_mb'):
        row[f'{name}_1x'] = _peak(first, name)
        row[f'{name}_10x'] = _peak(whole, name)
    row['keyed_states_end'] = samples[-1]['keyed_states']
    row['keyed_states_end_by_step'] = samples[-1]['keyed_states_by_step']
    row['psg_10x'] = max(s['pushed_back_elements'] + s['pending_side_windows'] for s in whole)
    row['rss_ratio'] = _ratio(row['rss_mb_10x'], row['rss_mb_1x'])
    row['pss_ratio'] = _ratio(row['pss_mb_10x'], row['pss_mb_1x'])
    row['keyed_ratio'] = _ratio(row['keyed_states_10x'], row['keyed_states_1x'])
    if run['status'] != 'ok' or not sink_check.is_ok(row['output_ok']):
        # A run that lost outputs proves nothing about the memory a correct one needs.
        row['rule'] = 'n/a'
    elif run['gc'] == 'on':
        row['rule'] = 'pass' if row['rss_ratio'] <= RULE else 'FAIL'
    else:
        row['rule'] = '-'
    return row


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b and not math.isnan(a) and not math.isnan(b) else math.nan


TABLE = (('case', 'case'), ('gc', 'GC'), ('events', 'events'), ('events_1x', 'events at 1x'),
         ('events_ratio', 'events 10x/1x'),
         ('distinct_keys', 'distinct keys'),
         ('keyed_states_1x', 'keyed states 1x'), ('keyed_states_10x', 'keyed states 10x'),
         ('keyed_ratio', 'keyed ratio'), ('keyed_states_end', 'keyed states at end'),
         ('timers_1x', 'timers 1x'), ('timers_10x', 'timers 10x'), ('psg_10x', 'PSG 10x'),
         ('rss_mb_1x', 'RSS MB 1x'), ('rss_mb_10x', 'RSS MB 10x'), ('rss_ratio', 'RSS ratio'),
         ('pss_mb_1x', 'PSS MB 1x'), ('pss_mb_10x', 'PSS MB 10x'), ('pss_ratio', 'PSS ratio'),
         ('rule', f'RSS 10x/1x <= {RULE} (GC on)'), ('wall_s', 'wall s'), ('status', 'status'),
         ('output_ok', 'output ok'))


def _cell(value) -> str:
    if isinstance(value, float):
        return 'n/a' if math.isnan(value) else f'{value:g}'
    return str(value)


def rule_lines(rows: Sequence[dict]) -> list[str]:
    """Per GC-on row: the rule's verdict on RSS and, beside it, the PSS ratio."""
    return [f"* {row['case']}: RSS 10x/1x = {_cell(row.get('rss_ratio', ''))} "
            f"(judged: {row['rule']}), PSS 10x/1x = {_cell(row.get('pss_ratio', ''))} "
            f"(not judged); output {row['output_ok']}"
            for row in rows if row['gc'] == 'on']


def write_report(runs: Sequence[dict], rows: Sequence[dict], known: argparse.Namespace,
                 extra: Sequence[str], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'gc.csv'), 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=SAMPLE_FIELDS, extrasaction='ignore')
        writer.writeheader()
        for run in runs:
            writer.writerows(run['samples'])
    with open(os.path.join(out, 'gc.md'), 'w') as f:
        f.write('# Keyed state under churning keys, keyed-state GC on and off\n\n')
        f.write(f'`python -m benchmarks.keyed_state_gc --events={known.events} '
                f'--windows={known.windows} --cases={known.cases} '
                + ' '.join(extra) + '`\n\n')
        f.write(f'1x = the first gauges of an epoch that ended after {ONE_X:.0%} of the '
                'events were read, 10x = all events read (the stream still open, its '
                'watermark held at the last event); each figure is its peak over the '
                'samples up to that point, summed over steps. Rule: with GC on, RSS at 10x '
                f'/ RSS at 1x <= {RULE}; it is judged on RSS, and the PSS ratio is shown '
                'beside it. RSS sums the VmRSS of PySpark\'s Python workers (daemon and '
                'forks), so the pages the forks share with the daemon count once per '
                'process; PSS (`Pss:` of /proc/<pid>/smaps_rollup, same processes) shares '
                'them out, counting them once in all. Output ok: what the sink got when '
                'the run ended against what the events imply (synthetic: a (key, count) '
                'per key of every window the held watermark closed, from each branch; '
                'NEXMark: the batch output of the same events in those windows); the '
                'rule is n/a for a run whose output is not ok. PSG = pushed-back '
                'elements + pending side windows (no side inputs here: 0). "keyed states '
                'at end" per step: see `keyed_states_by_step` in gc.csv.\n\n')
        f.write('\n'.join(rule_lines(rows)) + '\n\n')
        f.write('| ' + ' | '.join(title for _, title in TABLE) + ' |\n')
        f.write('|' + '---|' * len(TABLE) + '\n')
        for row in rows:
            f.write('| ' + ' | '.join(_cell(row.get(k, '')) for k, _ in TABLE) + ' |\n')
        f.write('\n![keyed states and worker memory over events](gc.png)\n')
    plot(runs, os.path.join(out, 'gc.png'))


def plot(runs: Sequence[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(run['case'] for run in runs))
    fig, axes = plt.subplots(2, len(cases), figsize=(5 * len(cases), 7), squeeze=False)
    for column, case in enumerate(cases):
        for run in runs:
            if run['case'] != case or not run['samples']:
                continue
            points = gauge_updates(run['samples'])
            events = [s['events'] for s in points]
            style = '.-' if run['gc'] == 'on' else '.--'
            label = f"GC {run['gc']}"
            axes[0][column].plot(events, [s['keyed_states'] for s in points], style, label=label)
            axes[1][column].plot(events, [s['rss_mb'] for s in points], style, color='C0',
                                 label=f'RSS, {label}')
            axes[1][column].plot(events, [s['pss_mb'] for s in points], style, color='C1',
                                 label=f'PSS, {label}')
        axes[0][column].set_title(case)
        axes[0][column].set_ylabel('keyed states (all steps)')
        axes[1][column].set_ylabel('Python workers memory (MB)')
        axes[1][column].set_xlabel('events read')
        for ax in (axes[0][column], axes[1][column]):
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- CLI


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--events', type=int, default=1_000_000)
    parser.add_argument('--windows', type=int, default=100,
                        help='event-time windows the events span (default 100)')
    parser.add_argument('--window_s', type=float, default=1.0)
    parser.add_argument('--keys', type=int, default=None,
                        help='synthetic: distinct keys over all windows (default: --events)')
    parser.add_argument('--rate', type=float, default=None,
                        help='events/s over all source parts (default: as fast as possible)')
    parser.add_argument('--parts', type=int, default=8,
                        help='synthetic: parallel source parts (default 8)')
    parser.add_argument('--cases', default=','.join(CASES))
    parser.add_argument('--gc', default='on,off', help='on, off or on,off (default)')
    parser.add_argument('--out', default='bench-out')
    parser.add_argument('--sample_s', type=float, default=0.5)
    parser.add_argument('--progress_s', type=float, default=3.0)
    parser.add_argument('--tail_s', type=float, default=0.0,
                        help='keep the stream open (idle, watermark held) and sampling this '
                             'long after all events were read (default 0: two epochs)')
    parser.add_argument('--stall_s', type=float, default=300.0,
                        help='cancel a run whose event count has not moved for this long')
    parser.add_argument('--in_process', action='store_true',
                        help='run every case in this process (default: one process each)')
    parser.add_argument('--run-one', dest='run_one', default=None, help=argparse.SUPPRESS)
    parser.add_argument('--result', default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    known, extra = parser().parse_known_args(argv)
    unknown = [c for c in known.cases.split(',') if c not in CASES]
    if unknown:
        raise SystemExit(f'unknown cases {unknown}; known: {list(CASES)}')
    if known.run_one:
        run = run_case(known.run_one, known.gc == 'on', known, extra)
        with open(known.result, 'w') as f:
            json.dump(run, f)
        return [run]
    child_argv = [f'--{name}={getattr(known, name)}'
                  for name in ('events', 'windows', 'window_s', 'keys', 'rate', 'parts',
                               'sample_s', 'tail_s', 'progress_s', 'stall_s')
                  if getattr(known, name) is not None] + extra
    runs, rows = [], []
    for case in known.cases.split(','):
        for gc in known.gc.split(','):
            print(f"== {case}, GC {gc}, {known.events} events", flush=True)
            if known.in_process:
                run = run_case(case, gc == 'on', known, extra)
            else:
                run = run_in_subprocess(case, gc == 'on', child_argv, known.out)
            row = summarize(run, known.events)
            print(f"== {case}, GC {gc}: {row['status']}, keyed states "
                  f"{_cell(row.get('keyed_states_1x', ''))} -> "
                  f"{_cell(row.get('keyed_states_10x', ''))}, RSS MB "
                  f"{_cell(row.get('rss_mb_1x', ''))} -> {_cell(row.get('rss_mb_10x', ''))}"
                  f" ({row['rule']}), PSS MB {_cell(row.get('pss_mb_1x', ''))} -> "
                  f"{_cell(row.get('pss_mb_10x', ''))}, output {row['output_ok']}", flush=True)
            runs.append(run)
            rows.append(row)
    write_report(runs, rows, known, extra, known.out)
    print(open(os.path.join(known.out, 'gc.md')).read())
    return rows


if __name__ == '__main__':
    # A run that failed, wrote a wrong output or broke the memory rule fails the command.
    sys.exit(0 if all(row['status'] == 'ok' and sink_check.is_ok(row['output_ok'])
                      and row['rule'] in ('pass', '-')
                      for row in main()) else 1)
