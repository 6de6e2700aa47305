"""The streaming bundle-size sweep: throughput and per-element latency (issue 6).

    python -m benchmarks.sweep --elements=200000 --bundle_sizes=1,10,100,1000 \\
        --bundle_times_ms=10,100,1000 --rates=max,5000 --out bench-out/sweep \\
        --spark_master=local[2]

For every combination of `--rates` (events/s over the whole source, or `max`: as fast
as possible), `--bundle_times_ms`, `--target_latencies_ms` and `--bundle_sizes` it runs
with `--streaming` on StreamsSparkRunner:

* the paper's micro benchmarks (`benchmarks.micro.CASES`: 20 sequential ParDos, 1 ParDo,
  GroupByKey over sliding windows of 2 s every 1 s on 10 keys) fed by `StampedSource`, an
  unbounded splittable DoFn emitting `--elements` elements `(key, (index, creation wall
  time))` in `--source_splits` parallel parts, each timestamped with its creation time,
  with a watermark following event time (the last emitted timestamp, +inf at the end);
* the NEXMark queries `--queries` (Beam's own, through `benchmarks.nexmark.runs.run_query`
  over `ReadUnboundedNexmarkEvents`, `--nexmark_events` events at the same rate).

Every run is in this process on one SparkSession, warmed up (Spark and its Python workers
started) before the first timed run. Beam's DirectRunner (`--streaming`: its FnApiRunner
reads the unbounded source to the end, then runs the rest) gives reference rows per case
and rate when `--runners` names it, in both configurations of `micro.DIRECT_RUNNERS`:
`DirectRunner` (its default, one worker in this process) and `DirectRunner (2 processes)`
(`--direct_num_workers=2 --direct_running_mode=multi_processing`, two SDK worker processes
over gRPC, as many as the cores of `local[2]`; each run starts its own, so its wall time
includes their start-up). It has no bundle options. The second loses the elements a
splittable DoFn defers when it checkpoints (see the report's notes), so its rows fail
wherever the source checkpoints: the output check is what shows it.

Measured, per run (a row of `sweep.csv` / `sweep.md`):

* `output_ok`, whether the output arrived: a micro run's sink (`micro.sink`, a
  `sink_check.CountingSink` appending to files of its DoFn instances, read back after the
  run) must have got every element exactly as often as its windows imply (count, and the
  sum of the indices as a checksum): `yes`, or `failed: expected N, got M`. A NEXMark
  run's captured output must equal that of the same query and events run in batch on
  the DirectRunner (`nexmark_reference`, not timed; the BundleBasedDirectRunner for
  Q4/Q6/Q9), as the NEXMark launcher judges it (`verdicts.equality_verdict`,
  `nexmark_verdict`). An empty output is failed.
* throughput `elements_per_s` = elements / wall time from `Pipeline.run()` to the end,
  only for a run whose `output_ok` is `yes` (blank otherwise, and `failed` in the
  summary). A StreamsSparkRunner micro run still running after `--timeout_s` is
  cancelled (status `timeout`): its verdict counts what reached the sink by then.
  NEXMark runs have no timeout (`runs.run_query` gives no handle to cancel).
  At a fixed rate throughput cannot pass the rate: compare bundle sizes at `max`.
* latency of the micro cases, for one element in `micro.SAMPLE_EVERY`: the sink's
  `time.time()` minus the element's creation time (`latency_*`) and minus the end of its
  window (`after_window_end_*`: for the GroupByKey case, how long after its window could
  first be complete the pane reached the sink; the same as `latency_*` in the global
  window). Creation time: at a fixed rate, when the element is due (it exists from then on,
  as in a queue the source reads, so waiting to be read counts); as fast as possible,
  when the source reads it (so a ParDo chain fused with the source shows only its call
  time, microseconds). An element of the sliding-window case reaches the sink twice (two
  windows) and is sampled twice; panes of windows that end after the last sampled element
  was created (fired early by the final +inf watermark) are left out (`steady_samples`).
  Each sampled line is appended by the sink to a file of its DoFn instance, read back
  after the run.
* latency of the NEXMark queries, at a fixed rate only (`nexmark_latency_config`): the
  events get wall-clock event times at the generator's rate = the pacing rate, so an
  event is due at its own event time, and every output's latency is the sink's
  `time.time()` minus its timestamp (`nexmark_latency_line`): for Q0 that of its
  event, for the windowed aggregates (Q5, Q11, Q7's max) their window's end. Q3's
  outputs carry no event time (its CoGroupByKey in the global window stamps them at
  the window's end): no latency. At a fixed rate these runs use windows of 2 s every
  1 s (session gap 2 s), so that a short run closes several windows, and their wall
  time starts when the first event is due (`NEXMARK_START_S` after set-up); as fast
  as possible, Beam's defaults and no latency.
* epochs (StreamsSparkRunner): the streaming driver's epoch count (an epoch is one Spark
  job over the pipeline), `epoch_s` = wall time / epochs, and
  `p99_over_bundle_time_plus_epoch` = after-window-end p99 / (bundle time + epoch_s). The
  count is read from the driver behind the pipeline result (`epochs_of`: the runner does
  not publish it), so it is blank if the runner's internals change.

Report (`--out`): `sweep.md` (summary: throughput per bundle size and "throughput at bundle
10 / at bundle 1000" per case, rate, bundle time and target latency, against the goal of
0.5, with both DirectRunner rows' throughput beside it; a failed run shows `failed` there
and counts in no ratio or goal; notes; then every run with its `output_ok`),
`sweep.csv`, `sweep_summary.csv`, `sweep_throughput.png` (throughput vs bundle size, log x,
a line per case, a panel per rate / bundle time / target latency, the DirectRunner rows
as horizontal lines), `sweep_latency.png` (latency p50/p99 vs bundle size) and
`sweep_latency_vs_epoch.png` (after-window-end latency vs bundle time + epoch length).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from itertools import product
from typing import Any

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms.core import RestrictionProvider, WatermarkEstimatorProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Duration, Timestamp

from beam_streams_runner import StreamsSparkRunner
from benchmarks import micro, sink_check
from benchmarks.nexmark import launcher, report, runs, verdicts
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.early_bids import WINNING_BIDS_QUERIES
from benchmarks.nexmark.sources import (
    NexmarkWatermarkEstimator,
    pacing_step,
    part_rate,
    resume_delay_s,
)

SPARK = micro.SPARK
DIRECT = micro.DIRECT
DIRECT_2 = micro.DIRECT_2


def direct_args(label: str) -> list[str]:
    """The streaming options of DirectRunner configuration `label` (`micro.DIRECT_RUNNERS`,
    which keep it on its FnApiRunner)."""
    return ['--streaming', *micro.DIRECT_RUNNERS[label]]


DIRECT_ARGS = direct_args(DIRECT)
DEFAULT_QUERIES = '0,3,5,7,11'
WARM_UP_CASE = 'GBK sliding 2s every 1s on 10 keys'
METRICS_NAMESPACE = 'sweep'
GOAL_RATIO = 0.5  # issue 6: throughput at bundle 10 >= half of that at bundle 1000
SMALL, LARGE = 10, 1000
LATENCY_DIGITS = 5  # seconds to 10 us: a fused ParDo chain's latency is well below 1 ms
NEXMARK_START_S = 3.0  # NEXMark at a fixed rate: events are due from this long after set-up


# ---------------------------------------------------------------- the unbounded source


def part_bounds(n: int, parts: int, part: int) -> tuple[int, int]:
    """Element indices [start, stop) of `part` of `parts` (contiguous, sizes differ by at
    most one)."""
    return n * part // parts, n * (part + 1) // parts


class StampedSource(beam.DoFn, RestrictionProvider, WatermarkEstimatorProvider):
    """Unbounded splittable DoFn: elements `(i % KEYS, (i, created))` for i in [0, n),
    timestamped `created`: with a rate, the wall time the element is due (it exists from
    then on, as in a queue the source would read, so time spent before the runner reads it
    counts as latency); as fast as possible, `time.time()` when it is read.

    Input: a part number (of `parts`); restriction: the part's element indices
    (`part_bounds`), claimed in order. With `rate` (events/s over all parts) a part emits
    its k-th element at origin + k / (its share of the rate) (`sources.pacing_step`, origin
    = its first call, kept in the watermark estimator state) and self-checkpoints with the
    delay to the next one; without, it emits as fast as possible, checkpointing every
    `sources.MAX_EVENTS_PER_CALL` elements. Runners checkpoint it too (bundle size).
    Watermark (`sources.NexmarkWatermarkEstimator` with no out-of-order bound): the
    timestamp of the last emitted element (timestamps never go back within a part), +inf
    when the part is done. Counts its elements in the counter `sweep/emitted`.
    """

    def __init__(self, n: int, parts: int, rate: float | None = None) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f'rate must be positive: {rate}')
        super().__init__()
        self._n = n
        self._parts = parts
        self._rate = rate
        self._emitted = Metrics.counter(METRICS_NAMESPACE, 'emitted')

    # RestrictionProvider
    def initial_restriction(self, part: int) -> OffsetRange:
        return OffsetRange(*part_bounds(self._n, self._parts, part))

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, part: int, restriction: OffsetRange) -> int:
        return restriction.size()

    def split(self, part: int, restriction: OffsetRange) -> Iterator[OffsetRange]:
        # The parts are the parallelism: a slice of a part would hold the watermark back.
        yield restriction

    # WatermarkEstimatorProvider
    def initial_estimator_state(self, part: int, restriction: OffsetRange
                                ) -> tuple[int, None]:
        return MIN_TIMESTAMP.micros, None

    def create_watermark_estimator(self, state: tuple[int, float | None]
                                   ) -> NexmarkWatermarkEstimator:
        return NexmarkWatermarkEstimator(state, 0)

    @beam.DoFn.unbounded_per_element()
    def process(self, part: int, tracker=beam.DoFn.RestrictionParam(),
                watermark_estimator=beam.DoFn.WatermarkEstimatorParam()):
        first, last = part_bounds(self._n, self._parts, part)
        restriction = tracker.current_restriction()
        start, stop = restriction.start - first, restriction.stop - first
        rate = None
        elapsed = origin = 0.0
        if self._rate is not None:
            rate = part_rate(self._rate, last - first, self._n)
            now = time.time()
            origin = watermark_estimator.pacing_origin(now - start / rate)
            elapsed = now - origin
        end, delay = pacing_step(start, stop, elapsed, rate)
        emitted = 0
        last_timestamp = watermark_estimator.current_watermark()
        for offset in range(start, end):
            i = first + offset
            if not tracker.try_claim(i):
                break
            # At a rate, an element exists from its due time on (as in a queue the
            # source reads); as fast as possible, from when it is read.
            created = origin + offset / rate if rate is not None else time.time()
            timestamp = max(Timestamp.of(created), last_timestamp)
            watermark_estimator.advance(timestamp)
            last_timestamp = timestamp
            emitted += 1
            yield TimestampedValue((i % micro.KEYS, (i, created)), timestamp)
        else:
            if delay is None:
                watermark_estimator.exhaust()
            else:
                if rate is not None:
                    delay = resume_delay_s(end, time.time() - origin, rate)
                tracker.defer_remainder(Duration(seconds=delay))
        self._emitted.inc(emitted)


def stamped_stream(p: beam.Pipeline, n: int, rate: float | None,
                   splits: int) -> beam.PCollection:
    """The unbounded stamped input of the micro cases (`StampedSource`)."""
    parts = max(1, min(splits, n))
    return (p
            | 'Parts' >> beam.Create(list(range(parts)))
            | 'StampedSource' >> beam.ParDo(StampedSource(n, parts, rate)))


# ---------------------------------------------------------------- runs


def epochs_of(result: Any) -> int | None:
    """The streaming driver's epoch count behind a StreamsSparkRunner result, or None.

    The runner does not publish it: the result's run callable is the driver's bound
    `run`, whose `epochs` attribute counts finished epochs."""
    driver = getattr(getattr(result, '_run', None), '__self__', None)
    epochs = getattr(driver, 'epochs', None)
    return epochs if isinstance(epochs, int) and epochs > 0 else None


class ResultKeepingRunner(StreamsSparkRunner):
    """StreamsSparkRunner that keeps its last pipeline result (for `epochs_of`) when a
    caller (the NEXMark `runs.run_query`) does not hand it out."""

    last_result: Any = None

    def run_pipeline(self, pipeline: beam.Pipeline, options: PipelineOptions) -> Any:
        self.last_result = super().run_pipeline(pipeline, options)
        return self.last_result


def spark_args(bundle_size: int, bundle_time_ms: int, target_latency_ms: int,
               extra: Sequence[str]) -> list[str]:
    """The StreamsSparkRunner options of one sweep point (`extra`: e.g. `--spark_master`)."""
    return [f'--bundle_size={bundle_size}', f'--bundle_time_ms={bundle_time_ms}',
            f'--target_latency_ms={target_latency_ms}', *extra]


def _row(case: str, runner: str, rate: float | None, bundle_size: int | None,
         bundle_time_ms: int | None, target_latency_ms: int | None) -> dict:
    return {'case': case, 'runner': runner, 'rate': rate_label(rate),
            'bundle_size': '' if bundle_size is None else bundle_size,
            'bundle_time_ms': '' if bundle_time_ms is None else bundle_time_ms,
            'target_latency_ms': '' if target_latency_ms is None else target_latency_ms,
            'elements': 0, 'status': '', 'output_ok': '', 'wall_s': '', 'elements_per_s': '',
            'epochs': '',
            'epoch_s': '', 'latency_p50_s': '', 'latency_p99_s': '',
            'after_window_end_p50_s': '', 'after_window_end_p99_s': '',
            'p99_over_bundle_time_plus_epoch': '', 'note': ''}


def _finish_row(row: dict, elements: int, wall: float, epochs: int | None) -> dict:
    """Wall time, epochs and throughput; throughput only if `row['output_ok']` is ok."""
    row['elements'] = elements
    row['wall_s'] = round(wall, 2)
    row['elements_per_s'] = sink_check.throughput(row['output_ok'], elements, wall)
    if epochs:
        row['epochs'] = epochs
        row['epoch_s'] = round(wall / epochs, 3)
        if row['after_window_end_p99_s'] != '' and row['bundle_time_ms'] != '':
            budget = row['bundle_time_ms'] / 1000 + wall / epochs
            row['p99_over_bundle_time_plus_epoch'] = round(
                row['after_window_end_p99_s'] / budget, 2)
    return row


def steady_samples(samples: Sequence[micro.Sample]) -> list[micro.Sample]:
    """The latency samples of panes the watermark fired: those of windows that end after
    the last sampled element was created are left out (the end of the stream, watermark
    +inf, fired them early, before their end)."""
    if not samples:
        return []
    last_created = max(sample[2] for sample in samples)
    return [s for s in samples if s[3] is None or s[3] <= last_created]


def latency_fields(samples: Sequence[micro.Sample]) -> dict:
    """The row's latency percentiles (creation to sink, and after the window's end)."""
    latencies = sorted(sample[0] for sample in samples)
    after_end = sorted(sample[1] for sample in samples)
    return dict(latency_p50_s=micro.percentile(latencies, 0.5, LATENCY_DIGITS),
                latency_p99_s=micro.percentile(latencies, 0.99, LATENCY_DIGITS),
                after_window_end_p50_s=micro.percentile(after_end, 0.5, LATENCY_DIGITS),
                after_window_end_p99_s=micro.percentile(after_end, 0.99, LATENCY_DIGITS))


def run_micro(case: str, runner: str, n: int, rate: float | None, splits: int,
              bundle_size: int | None = None, bundle_time_ms: int | None = None,
              target_latency_ms: int | None = None, extra: Sequence[str] = (),
              timeout_s: float | None = None) -> dict:
    """One streaming run of micro case `case` on `runner` (StreamsSparkRunner with the
    bundle options and `extra`, or a DirectRunner label of `micro.DIRECT_RUNNERS`, which
    has none); its report row, with the sink's verdict (`micro.expected_tally`)."""
    row = _row(case, runner, rate, bundle_size, bundle_time_ms, target_latency_ms)
    if runner == SPARK:
        args = ['--streaming', *spark_args(bundle_size or 1000, bundle_time_ms or 100,
                                           target_latency_ms or 1000, extra)]
        runner_obj: Any = StreamsSparkRunner()
    else:
        args, runner_obj = direct_args(runner), DIRECT
    out_dir = tempfile.mkdtemp(prefix='sweep-')
    result: Any = None
    samples: list[micro.Sample] = []
    started = time.time()
    try:
        p = beam.Pipeline(runner=runner_obj, options=PipelineOptions(args))
        _ = (micro.CASES[case](stamped_stream(p, n, rate, splits))
             | 'Sink' >> beam.ParDo(micro.sink(os.path.join(out_dir, 'sink'))))
        started = time.time()
        result = p.run()
        state = result.wait_until_finish(
            None if timeout_s is None or runner != SPARK else int(timeout_s * 1000))
        if PipelineState.is_terminal(state):
            row['status'] = 'ok' if state == PipelineState.DONE else str(state).lower()
        else:
            result.cancel()
            row['status'] = f'timeout ({timeout_s:g} s)'
            row['note'] = 'cancelled; output_ok counts what reached the sink by then'
        wall = time.time() - started
        written = sink_check.read_sink(out_dir)
        row['output_ok'] = sink_check.verdict(micro.expected_tally(case, n), written.tally)
        samples = steady_samples(micro.parse_samples(written.lines))
    except Exception as e:  # noqa: BLE001 - a failed run is a row of the report
        wall = time.time() - started
        row['status'] = f'failed: {type(e).__name__}: {verdicts.first_line(str(e))}'
        row['output_ok'] = 'failed: the run failed'
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    row.update(latency_fields(samples))
    return _finish_row(row, n, wall, epochs_of(result) if runner == SPARK else None)


def nexmark_latency_line(ts: Timestamp, w, now: float) -> list[str]:
    """For a NEXMark output with timestamp `ts` in window `w` reaching the sink at wall
    time `now`, at a fixed rate with wall-clock event times (see
    `nexmark_latency_config`): a `micro.latency_line` whose creation time is the
    output's timestamp. An event is due (created) at its event time; an output of Q0
    carries the event time of its event, one of a windowed aggregate (Q5, Q7's max,
    Q11) its window's end; Q7's winning bids keep their own event time,
    so their after-window-end latency is the one comparable with Q5's. An output
    stamped at the end of the global window carries no event time (Q3's join, after
    a CoGroupByKey with a count trigger in the global window): no line."""
    # Within a millisecond of the end: Beam's coders keep timestamps to milliseconds.
    if isinstance(w, beam.window.GlobalWindow) and ts > w.max_timestamp() - Duration(micros=1000):
        return []
    created = ts.micros / 1e6
    end = w.end.micros / 1e6 if isinstance(w, beam.window.IntervalWindow) else None
    return [micro.sample_line(now, created, end, created if end is None else max(created, end))]


def nexmark_latency_lines(element, w, ts: Timestamp) -> list[str]:
    """The latency sink's lines of an output reaching it now (`nexmark_latency_line`)."""
    return nexmark_latency_line(ts, w, time.time())


def nexmark_latency_config(config: NexmarkConfig, rate: float,
                           now: float | None = None) -> NexmarkConfig:
    """`config` for measuring latency at `rate` events/s: event times from the wall clock
    at the generator's rate = the pacing rate (so each event is due at its event time;
    `UnboundedNexmarkFn`), starting `NEXMARK_START_S` after `now` (default: the wall
    clock; the runner's start-up), and windows of 2 s every 1 s (session gap 2 s) so
    that a run of a few seconds closes several windows before the end of the stream."""
    now = time.time() if now is None else now
    return config.replace(
        use_wallclock_event_time=True, first_event_rate=max(1, round(rate)),
        next_event_rate=max(1, round(rate)),
        base_time_ms=int((now + NEXMARK_START_S) * 1000),
        window_size_sec=2, window_period_sec=1)


# The batch reference outputs run so far, by (query, config, without early bids): at `max`
# every run of a query has the same config; at a fixed rate each has its own base time.
_REFERENCES: dict[tuple[int, NexmarkConfig, bool], verdicts.RunResult] = {}


def nexmark_reference(query: int, config: NexmarkConfig,
                      without_early_bids: bool = False) -> verdicts.RunResult:
    """The output of `query` over the events of `config` (`without_early_bids`: less the
    bids whose window closes before their auction exists, `early_bids`), in batch on the
    DirectRunner (the BundleBasedDirectRunner for the merging-window queries,
    `launcher.reference_for`), run once per (query, config)."""
    key = (query, config, without_early_bids)
    if key not in _REFERENCES:
        _REFERENCES[key] = runs.run_query(
            query, launcher.reference_for(query, DIRECT), config, streaming=False,
            without_early_bids=without_early_bids)
    return _REFERENCES[key]


def nexmark_verdict(query: int, tested: verdicts.RunResult, reference: verdicts.RunResult,
                    config: NexmarkConfig,
                    without_early_bids: verdicts.RunResult | None = None) -> tuple[str, str]:
    """(`output_ok`, note) of a streaming NEXMark run against its batch `reference`, as
    `verdicts.equality_verdict` judges it: `yes`; `yes (...)` where it names a difference
    Beam's model allows (Q3's unfired last panes, Q4/Q6/Q9's bids closed before their
    auction, against `without_early_bids`; timestamps equal to the millisecond against
    the BundleBasedDirectRunner); else `failed: ...`. An empty output is failed."""
    if tested.ok and not tested.lines:
        return sink_check.lines_verdict([], reference.lines), ''
    equal, note = verdicts.equality_verdict(query, tested, reference, config,
                                            streaming=True,
                                            without_early_bids=without_early_bids)
    if equal == 'yes' or equal.startswith('failed'):
        return equal, note
    if equal.startswith('no ('):
        return 'yes (' + equal[len('no ('):], note
    if equal.startswith('no reference'):
        return f'failed: {equal}', note
    return (f'failed: expected {reference.output_count} outputs equal to the reference, got '
            f'{tested.output_count}', note)


def run_nexmark(query: int, runner: str, events: int, rate: float | None,
                bundle_size: int | None = None, bundle_time_ms: int | None = None,
                target_latency_ms: int | None = None, extra: Sequence[str] = ()) -> dict:
    """One streaming run of NEXMark `query` (`runs.run_query` over the unbounded
    source) on `runner`; its report row, with its output checked against
    `nexmark_reference` (not timed). At a fixed rate the row has latencies
    (`nexmark_latency_lines`, every output sampled; outputs of windows that end after
    the last event is due are left out: the end of the stream fired them early)."""
    row = _row(f'NEXMark Q{query}', runner, rate, bundle_size, bundle_time_ms,
               target_latency_ms)
    config = NexmarkConfig(num_events=events)
    out_dir = tempfile.mkdtemp(prefix='sweep-nexmark-')
    tap = None
    if rate is not None:
        config = nexmark_latency_config(config, rate)

        def tap(output: beam.PCollection) -> None:
            _ = output | 'Latency' >> beam.ParDo(sink_check.CountingSink(
                os.path.join(out_dir, 'lat'), lines=nexmark_latency_lines))
    if runner == SPARK:
        runner_obj: Any = ResultKeepingRunner()
        args = spark_args(bundle_size or 1000, bundle_time_ms or 100,
                          target_latency_ms or 1000, extra)
    else:
        runner_obj, args = DIRECT, micro.DIRECT_RUNNERS[runner]
    started = time.time()
    try:
        result = runs.run_query(query, runner_obj, config, args, streaming=True, rate=rate,
                                tap=tap)
        if rate is not None:
            # No event is due before the base time: the wait for it is not the runner's.
            started = max(started, config.base_time / 1000.0)
        # (A run that lost its events may end before the first is due: no time at all.)
        wall = max(0.0, time.time() - started)
        samples = micro.read_samples(out_dir) if rate is not None else []
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    row['status'] = 'ok' if result.ok else f'failed: {result.error}'
    row['output_ok'], check_note = nexmark_verdict(
        query, result, nexmark_reference(query, config), config,
        nexmark_reference(query, config, True) if query in WINNING_BIDS_QUERIES else None)
    row['note'] = '; '.join(p for p in (f'{result.output_count} outputs', check_note) if p)
    if rate is None:
        row['note'] += '; latency not measured (as fast as possible)'
    else:
        last_due = config.base_time / 1000.0 + events / config.first_event_rate
        steady = [s for s in samples if s[3] is None or s[3] <= last_due]
        row.update(latency_fields(steady))
        if not steady:
            row['note'] += ('; no latency: no output carries an event time, or the end of '
                            'the stream fired them all')
    epochs = epochs_of(runner_obj.last_result) if runner == SPARK else None
    return _finish_row(row, events, wall, epochs)


# ---------------------------------------------------------------- the sweep


def rate_label(rate: float | None) -> str:
    return 'max' if rate is None else f'{rate:g}'


def parse_rates(spec: str) -> list[float | None]:
    """`'max,5000'` -> `[None, 5000.0]` (None: as fast as possible)."""
    rates: list[float | None] = []
    for part in spec.split(','):
        part = part.strip()
        if part in ('max', 'none', ''):
            rates.append(None)
        elif float(part) <= 0:
            raise ValueError(f'rate must be positive or max: {part!r}')
        else:
            rates.append(float(part))
    return rates


def _ints(spec: str) -> list[int]:
    return [int(s) for s in spec.split(',') if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m benchmarks.sweep', description=__doc__.split('\n')[0],
        epilog='Unknown options (e.g. --spark_master=local[2]) go to StreamsSparkRunner.')
    parser.add_argument('--elements', type=int, default=200_000,
                        help='elements of each micro run')
    parser.add_argument('--nexmark_events', type=int, default=None,
                        help='events of each NEXMark run (default: --elements)')
    parser.add_argument('--bundle_sizes', default='1,10,100,1000')
    parser.add_argument('--bundle_times_ms', default='10,100,1000')
    parser.add_argument('--target_latencies_ms', default='1000',
                        help="StreamsSparkRunner's --target_latency_ms values")
    parser.add_argument('--rates', default='max,5000',
                        help='events/s over the whole source, or max (as fast as possible)')
    parser.add_argument('--cases', default=','.join(micro.CASES),
                        help='micro cases (benchmarks.micro.CASES); empty for none')
    parser.add_argument('--queries', default=DEFAULT_QUERIES,
                        help='NEXMark queries; empty for none')
    parser.add_argument('--runners', default=f'{SPARK},{DIRECT}',
                        help=f'{SPARK} (swept) and/or {DIRECT} (reference rows per case and '
                             f'rate, as both {list(micro.DIRECT_RUNNERS)})')
    parser.add_argument('--source_splits', type=int, default=4,
                        help='parallel parts of the micro source')
    parser.add_argument('--timeout_s', type=float, default=900.0,
                        help='a StreamsSparkRunner micro run still running after this is '
                             'cancelled (its throughput is what it read so far)')
    parser.add_argument('--out', default='bench-out/sweep')
    return parser


def plan_runs(args: argparse.Namespace) -> list[tuple[str, str, float | None, tuple]]:
    """(kind 'micro'/'nexmark', case or query, rate, (runner, bundle_size, bundle_time_ms,
    target_latency_ms)) for every run, in order; `DirectRunner` gives a run in each of
    `micro.DIRECT_RUNNERS`."""
    runners = micro.runner_labels(args.runners)
    unknown = set(runners) - {SPARK, *micro.DIRECT_RUNNERS}
    if unknown:
        raise ValueError(f'unknown runners {sorted(unknown)}: use {SPARK} and/or {DIRECT}')
    sweep = list(product(_ints(args.bundle_times_ms), _ints(args.target_latencies_ms),
                         _ints(args.bundle_sizes)))
    items = [('micro', c) for c in args.cases.split(',') if c]
    unknown = [c for _, c in items if c not in micro.CASES]
    if unknown:
        raise ValueError(f'unknown cases {unknown}: use some of {list(micro.CASES)}')
    if args.queries.strip():
        items += [('nexmark', f'Q{q}') for q in launcher.parse_queries(args.queries)]
    plan = []
    for (kind, case), rate in product(items, parse_rates(args.rates)):
        if SPARK in runners:
            plan += [(kind, case, rate, (SPARK, size, time_ms, target))
                     for time_ms, target, size in sweep]
        plan += [(kind, case, rate, (runner, None, None, None)) for runner in runners
                 if runner in micro.DIRECT_RUNNERS]
    return plan


def _describe(row: dict) -> str:
    parts = [f"{row['wall_s']} s", f"{row['elements_per_s']} elements/s"]
    if row['latency_p50_s'] != '':
        parts.append(f"latency p50 {row['latency_p50_s']} s, p99 {row['latency_p99_s']} s")
    if row['epochs']:
        parts.append(f"{row['epochs']} epochs of {row['epoch_s']} s")
    if row['status'] != 'ok':
        parts.append(row['status'])
    parts.append(f"output {row['output_ok']}")
    return ', '.join(parts)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """The command line (see the module docstring); returns the rows of the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        plan = plan_runs(args)
    except ValueError as e:
        parser.error(str(e))
    if not plan:
        parser.error('nothing to run: no --cases, no --queries or no --runners')
    events = args.nexmark_events or args.elements
    if not any(a.startswith(('--spark_conf=spark.ui.showConsoleProgress',
                             'spark.ui.showConsoleProgress')) for a in extra):
        # Spark's progress bars would break the progress lines.
        extra = [*extra, '--spark_conf=spark.ui.showConsoleProgress=false']
    if any(run[3][0] == SPARK for run in plan):
        # Steady state: neither Spark's start-up nor that of its Python workers (several
        # seconds on 2 cores) is part of any timed run; a shuffle and all source parts
        # start as many workers as the runs will use.
        run_micro(WARM_UP_CASE, SPARK, 1000, None, args.source_splits, 100, extra=extra)
    rows = []
    for index, (kind, case, rate, (runner, size, time_ms, target)) in enumerate(plan, 1):
        what = f'{case} on {runner}, rate {rate_label(rate)}'
        if runner == SPARK:
            what += f', bundle size {size}, bundle time {time_ms} ms, target {target} ms'
        print(f'[{index}/{len(plan)}] {what} ...', end=' ', flush=True)
        if kind == 'micro':
            row = run_micro(case, runner, args.elements, rate, args.source_splits, size,
                            time_ms, target, extra, args.timeout_s)
        else:
            row = run_nexmark(int(case[1:]), runner, events, rate, size, time_ms, target,
                              extra)
        print(_describe(row), flush=True)
        rows.append(row)
    write_report(rows, args.out, 'python -m benchmarks.sweep ' + ' '.join(argv))
    print(open(os.path.join(args.out, 'sweep.md'), encoding='utf-8').read())
    return rows


# ---------------------------------------------------------------- report


def _group(row: dict) -> tuple:
    return (row['case'], row['runner'], row['rate'], row['bundle_time_ms'],
            row['target_latency_ms'])


def _throughput_cell(row: dict) -> Any:
    """A run's throughput for the summary: `failed` when its output was not right."""
    return row['elements_per_s'] if sink_check.is_ok(row['output_ok']) else 'failed'


def summary_rows(rows: Sequence[dict]) -> list[dict]:
    """Per (case, rate, bundle time, target latency) of StreamsSparkRunner: throughput at
    every bundle size, `throughput at bundle 10 / at bundle 1000` and whether it meets
    the goal (>= 0.5); each DirectRunner configuration's throughput for the same case and
    rate alongside. A run whose output failed shows `failed` and is in no ratio."""
    sizes = sorted({r['bundle_size'] for r in rows if r['runner'] == SPARK})
    directs = [label for label in micro.DIRECT_RUNNERS if any(r['runner'] == label
                                                               for r in rows)]
    direct = {(r['runner'], r['case'], r['rate']): _throughput_cell(r) for r in rows
              if r['runner'] in micro.DIRECT_RUNNERS}
    groups: dict[tuple, dict[int, Any]] = {}
    for row in rows:
        if row['runner'] == SPARK:
            groups.setdefault(_group(row), {})[row['bundle_size']] = _throughput_cell(row)
    out = []
    for (case, _, rate, time_ms, target), by_size in groups.items():
        summary = {'case': case, 'rate': rate, 'bundle_time_ms': time_ms,
                   'target_latency_ms': target}
        summary.update({f'elements_per_s at bundle {s}': by_size.get(s, '') for s in sizes})
        small, large = by_size.get(SMALL), by_size.get(LARGE)
        measured = all(isinstance(v, (int, float)) and v > 0 for v in (small, large))
        ratio = round(small / large, 3) if measured else ''
        summary[f'throughput at bundle {SMALL} / at bundle {LARGE}'] = ratio
        summary[f'goal (>= {GOAL_RATIO})'] = ('' if ratio == '' else
                                              'yes' if ratio >= GOAL_RATIO else 'no')
        summary.update({f'{label} elements_per_s': direct.get((label, case, rate), '')
                        for label in directs})
        out.append(summary)
    return out


NOTES = f"""\
* Every run streams (`--streaming`) in one process on one SparkSession, warmed up before
  the first timed run; wall time runs from `Pipeline.run()` to the end of the run.
  At a fixed rate throughput cannot pass the rate: compare bundle sizes at `max`.
* `output_ok`: a micro run's sink must get every element exactly as often as its windows
  imply (count, and the sum of the indices); a NEXMark run's output must equal the same
  query's over the same events in batch on the DirectRunner (BundleBasedDirectRunner for
  Q4/Q6/Q9), as the NEXMark launcher judges it (`yes (unfired last panes)`: Q3 lacks
  only what arrived after a seller's last `AfterCount(30)` pane; `yes (bids closed
  before their auction)`: Q4/Q6/Q9 equal the batch output
  without the bids Beam's streaming merging windows cannot join). An empty output is
  failed. Only runs with `yes` have a throughput; the others
  show `failed` in the summary and count in no ratio or goal.
* Micro cases: `benchmarks.sweep.StampedSource`, an unbounded splittable DoFn, emits the
  elements in parallel parts, each timestamped with its creation wall time; `rate` is
  events/s over all parts (`max`: as fast as possible). At a rate, an element's creation
  time is when it is due (as if it waited in a queue from then on), so time before the
  runner reads it counts; as fast as possible, it is when the source reads it, so a chain
  of ParDos fused with the source shows only its own call time (microseconds) and
  latency matters across shuffles (the GroupByKey case). Its watermark is the timestamp of
  the last emitted element.
* `latency_*`: sink wall time minus creation time, for 1 element in {micro.SAMPLE_EVERY}
  (twice per sampled element in the sliding-window case: it is in two windows).
  `after_window_end_*`: sink wall time minus the end of the element's window (for the
  GroupByKey case, the delay after the pane could first be complete; same as `latency_*`
  for the unwindowed cases). Samples of windows ending after the last sampled element was
  created are left out: the end of the stream (watermark +inf) fires those panes before
  their window ends, so short runs of the GroupByKey case may have no latency at all.
  `p99_over_bundle_time_plus_epoch` = after-window-end p99 / (bundle time + epoch
  length), epoch length = wall time / epochs of the streaming driver.
* NEXMark: Beam's queries over `ReadUnboundedNexmarkEvents` through the NEXMark
  `runs.run_query`, output counts in `note`. As fast as possible, throughput only (its
  events carry generator event times, not their creation wall times); at a fixed rate
  the events get wall-clock event times at the pacing rate, so each output's sink time
  minus its timestamp is its latency.
* DirectRunner (reference, no bundle options), in two configurations: `{DIRECT}` (its
  default, one worker) and `{DIRECT_2}` (`--direct_num_workers=2
  --direct_running_mode=multi_processing`: two SDK worker processes over gRPC, as many as
  the cores of `local[2]`; each run starts its own, so its wall time includes their
  start-up), both on Beam's FnApiRunner, which reads the unbounded source to the end
  (polling a paced one), then runs the rest stage by stage: a ParDo chain fused with the
  source sees each element at once, a GroupByKey only after the whole stream.
  `{DIRECT_2}` loses what a splittable DoFn defers when it checkpoints (observed here: a
  paced source delivered one call's elements per part, 4 of 2,000; unpaced, the first
  10,000 of each part; apache/beam#19842 is the open issue on SDFs in the FnApiRunner's
  multi-worker mode), so wherever the source checkpoints (at any rate; as fast as
  possible, past 10,000 elements a part) its output fails and it has no throughput.
* A StreamsSparkRunner micro run still going after `--timeout_s` is cancelled: status
  `timeout`; its `output_ok` counts what reached the sink by then (so it has a
  throughput only if everything had).
"""


def write_report(rows: Sequence[dict], out: str, command: str = '') -> None:
    """`sweep.csv`, `sweep_summary.csv`, `sweep.md` and the three plots into `out`."""
    os.makedirs(out, exist_ok=True)
    summary = summary_rows(rows)
    env = report.environment()
    text = [f'* {k}: {v}' for k, v in env.items()]
    if command:
        text += ['', 'Command:', '', '```', command, '```']
    if summary:
        micro.write_table(summary, out, 'sweep_summary', 'Streaming sweep: summary')
        text += ['', '## Throughput per bundle size', '', micro.markdown_table(summary)]
    text += ['', '![throughput vs bundle size](sweep_throughput.png)', '',
             '![latency vs bundle size](sweep_latency.png)', '',
             '![latency vs bundle time + epoch length](sweep_latency_vs_epoch.png)', '',
             '## Notes', '', NOTES, '## Every run', '']
    micro.write_table(list(rows), out, 'sweep', 'Streaming bundle-size sweep',
                      before='\n'.join(text) + '\n')
    write_plots(rows, out)


def _panels(rows: Sequence[dict]) -> list[tuple[str, str, Any]]:
    """The (rate, bundle time, target latency) panels of the StreamsSparkRunner rows."""
    keys = list(dict.fromkeys((r['rate'], r['bundle_time_ms'], r['target_latency_ms'])
                              for r in rows if r['runner'] == SPARK))
    return keys or [('', '', '')]


def _grid(plt, n: int, title: str):
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    return fig, list(axes.flat)


def _log_axes(ax, ylabel: str, title: str) -> None:
    """Log-log axes over bundle size, labelled and gridded."""
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('bundle size')
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(which='both', alpha=0.3)


def _legend_below(fig, axes) -> None:
    """One legend for all panels, under them; then the layout."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    width, height = fig.get_size_inches()
    # Case names are long: about 2.6 inches a column, so a one-panel figure is not
    # wider than its legend.
    ncol = max(1, min(4, len(entries), int(width // 2.6)))
    legend_rows = -(-len(entries) // ncol)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc='lower center', ncol=ncol,
                   fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, min(0.4, 0.3 * legend_rows / height), 1, 1))


def write_plots(rows: Sequence[dict], out: str) -> None:
    """`sweep_throughput.png`, `sweep_latency.png`, `sweep_latency_vs_epoch.png`; runs
    whose output failed are left out of all three."""
    plt = micro.pyplot()
    cases = list(dict.fromkeys(r['case'] for r in rows))
    colors = {c: f'C{i % 10}' for i, c in enumerate(cases)}
    panels = _panels(rows)
    rows = [r for r in rows if sink_check.is_ok(r['output_ok'])]
    direct_styles = dict(zip(micro.DIRECT_RUNNERS, ('--', ':'), strict=True))

    def series(panel, case, column):
        points = sorted((r['bundle_size'], r[column]) for r in rows
                        if r['runner'] == SPARK and r['case'] == case and r[column] != ''
                        and (r['rate'], r['bundle_time_ms'], r['target_latency_ms']) == panel)
        return points

    def panel_title(panel):
        rate, time_ms, target = panel
        return f'rate {rate}, bundle time {time_ms} ms, target {target} ms'

    # Throughput.
    fig, axes = _grid(plt, len(panels), f'Throughput (dashed: {DIRECT}; dotted: {DIRECT_2})')
    for ax, panel in zip(axes, panels, strict=False):
        for case in cases:
            points = series(panel, case, 'elements_per_s')
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker='o',
                        color=colors[case], label=case)
            for r in rows:
                if (r['runner'] in direct_styles and r['case'] == case
                        and r['rate'] == panel[0] and r['elements_per_s'] != ''):
                    ax.axhline(r['elements_per_s'], color=colors[case],
                               linestyle=direct_styles[r['runner']], linewidth=0.8)
        _log_axes(ax, 'elements/s', panel_title(panel))
    _legend_below(fig, axes)
    fig.savefig(os.path.join(out, 'sweep_throughput.png'), dpi=110, bbox_inches='tight')
    plt.close(fig)

    # Latency vs bundle size.
    fig, axes = _grid(plt, len(panels), 'Latency, creation to sink (solid p50, dashed p99)')
    for ax, panel in zip(axes, panels, strict=False):
        for case in cases:
            for column, style in (('latency_p50_s', '-'), ('latency_p99_s', '--')):
                points = series(panel, case, column)
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], style,
                            marker='o', color=colors[case],
                            label=case if style == '-' else None)
        _log_axes(ax, 'latency (s)', panel_title(panel))
    _legend_below(fig, axes)
    fig.savefig(os.path.join(out, 'sweep_latency.png'), dpi=110, bbox_inches='tight')
    plt.close(fig)

    # Latency vs bundle time + epoch length.
    fig, ax = plt.subplots(figsize=(7, 5))
    xs_all = []
    for case in cases:
        pts = [r for r in rows if r['runner'] == SPARK and r['case'] == case
               and r['epoch_s'] != '' and r['after_window_end_p50_s'] != '']
        if not pts:
            continue
        xs = [r['bundle_time_ms'] / 1000 + r['epoch_s'] for r in pts]
        xs_all += xs
        ax.scatter(xs, [r['after_window_end_p50_s'] for r in pts], marker='o',
                   color=colors[case], label=f'{case} p50')
        ax.scatter(xs, [r['after_window_end_p99_s'] for r in pts], marker='^',
                   facecolors='none', edgecolors=colors[case], label=f'{case} p99')
    if xs_all:
        line = [min(xs_all) * 0.8, max(xs_all) * 1.2]
        ax.plot(line, line, 'k-', linewidth=0.8, label='y = x')
        ax.plot(line, [3 * x for x in line], 'k:', linewidth=0.8, label='y = 3x')
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.legend(fontsize=7)
    ax.set_xlabel('bundle time + epoch length (s)')
    ax.set_ylabel('latency after window end (s)')
    ax.set_title('Latency vs bundle time + epoch length (StreamsSparkRunner)')
    ax.grid(which='both', alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'sweep_latency_vs_epoch.png'), dpi=110, bbox_inches='tight')
    plt.close(fig)


if __name__ == '__main__':
    main(sys.argv[1:])
