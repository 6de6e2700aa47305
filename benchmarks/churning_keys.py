"""The churning-keys stateful DoFn: a streaming workload whose keys never recur.

Event n has event time `START + INTERVAL_S * n` (`PeriodicImpulse` over past timestamps,
so the source is read as fast as the epochs go) and key `n // EVENTS_PER_KEY`; in fixed
windows of `WINDOW_S` (1 s) each window has its own `KEYS_PER_WINDOW` (1,000) keys that
never come back. `CountUntilWindowEnd` (the keyed-state GC benchmark's) counts per key in
combining state and, on an event-time timer at the window's end, emits the count and
clears the state; the stream ends, so the watermark passes every window and every key
is flushed.

Case `gbk` counts the same events with a windowed GroupByKey and a sum instead of the
stateful DoFn (the same output). Two cases measure what the stateful DoFn stands on, so
a profile's shares have figures to go with them: `source` ends the pipeline right after
the window assignment (the source's read and the fused stateless steps, no shuffle), and
`noop_state` sends the events through the shuffle into a stateful DoFn that touches no
state (the cost of reaching a stateful DoFn). Neither writes output: their verdict is
that a counter of the events reaching their last step equals `--events`.

`run_one` runs it once in this process and returns its wall time, the verdict of its
output (`expected_lines`: one `key TAB window start TAB count` per key and window,
computed with the same float arithmetic and timestamp rounding as the source), its
steady rate (events/s from the epoch by which `STEADY_FROM` of the events were read to
the last, from the runner's progress records), how the partitions loaded their state
(`state_loads`, `state_load_ms` per kind) and the Python workers' memory (PSS, MB)
once a tenth of the events were read and at the end, as the JSON line
`python -m benchmarks.churning_keys --events N [--case dofn|gbk] [runner options]`
prints.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import userstate, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.utils.timestamp import Timestamp

import beam_streams_runner  # noqa: F401 - makes runner='StreamsSparkRunner' known
from benchmarks import sink_check
from benchmarks.keyed_state_gc import CountUntilWindowEnd, WorkerMemorySampler

START = 1_000_000_000.0  # event time of event 0 (2001): long past, read at full speed
WINDOW_S = 1
KEYS_PER_WINDOW = 1000
EVENTS_PER_KEY = 5
INTERVAL_S = WINDOW_S / (KEYS_PER_WINDOW * EVENTS_PER_KEY)
CASES = ('dofn', 'gbk', 'source', 'noop_state')
FLOOR_CASES = ('source', 'noop_state')  # no output: the events reaching the end are counted
REACHED = beam.metrics.Metrics.counter('churning_keys', 'reached')
STEADY_FROM = 0.2  # the steady state starts once this share of the events was read
MEMORY_EVERY_S = 0.5


def stream_end(events: int) -> float:
    """`PeriodicImpulse`'s stop for `events` events (half an interval past the last)."""
    return START + (events - 0.5) * INTERVAL_S


def event_index(t: float) -> int:
    return round((float(t) - START) / INTERVAL_S)


def build(p: beam.Pipeline, events: int, sink_prefix: str, case: str = 'dofn') -> None:
    windowed = (p
                | 'Events' >> PeriodicImpulse(START, stream_end(events), INTERVAL_S)
                # Typed, so the keys get a deterministic coder (VarInt).
                | 'Key' >> beam.Map(lambda t: (event_index(t) // EVENTS_PER_KEY, 1)
                                    ).with_output_types(tuple[int, int])
                | 'Window' >> beam.WindowInto(window.FixedWindows(WINDOW_S)))
    if case == 'source':
        _ = windowed | 'Drop' >> beam.FlatMap(count_and_drop)
        return
    if case == 'noop_state':
        _ = windowed | 'Stateful' >> beam.ParDo(TouchNoState())
        return
    if case == 'dofn':
        counts = windowed | 'Count' >> beam.ParDo(CountUntilWindowEnd())
    else:
        counts = (windowed
                  | 'Group' >> beam.GroupByKey()
                  | 'Sum' >> beam.MapTuple(lambda key, ones: (key, sum(ones))))
    _ = counts | 'Write' >> beam.ParDo(sink_check.CountingSink(sink_prefix, output_line))


def count_and_drop(element) -> tuple:
    REACHED.inc()
    return ()


class TouchNoState(beam.DoFn):
    """A stateful DoFn (it declares a state) that counts its events and touches nothing."""

    UNUSED = userstate.ReadModifyWriteStateSpec('unused', VarIntCoder())

    def process(self, element, unused=beam.DoFn.StateParam(UNUSED)):
        REACHED.inc()
        return ()


def reached_verdict(result, events: int) -> str:
    """`yes` if the counter of the events reaching the end says `events`."""
    counters = result.metrics().query(MetricsFilter().with_name('reached'))['counters']
    reached = sum(c.committed or 0 for c in counters)
    return sink_check.YES if reached == events else (
        f'{sink_check.FAILED}: {reached} of {events} events reached the end')


def output_line(counted: tuple[int, int], w: window.IntervalWindow, t: Timestamp) -> list[str]:
    key, count = counted
    return [f'{key}\t{w.start.micros}\t{count}']


def expected_lines(events: int) -> list[str]:
    window_us = WINDOW_S * 1_000_000
    counts: collections.Counter = collections.Counter()
    for n in range(events):
        micros = Timestamp.of(START + INTERVAL_S * n).micros
        counts[(n // EVENTS_PER_KEY, micros - micros % window_us)] += 1
    return [f'{key}\t{start}\t{count}' for (key, start), count in counts.items()]


def run_one(events: int, runner_args: Sequence[str], case: str = 'dofn') -> dict:
    """One run in this process: {'wall_s', 'state', 'verdict', 'events_per_s',
    'steady_events_per_s', 'lines', 'state_loads', 'state_load_ms', 'pss_mb_tenth',
    'pss_mb_end'} (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix='churn-') as sink_dir:
        p = beam.Pipeline(runner='StreamsSparkRunner',
                          options=PipelineOptions(['--streaming', *runner_args]))
        build(p, events, os.path.join(sink_dir, 'out'), case)
        memory = WorkerMemorySampler(MEMORY_EVERY_S)
        started = time.monotonic()
        result = p.run()
        with memory:
            state = result.wait_until_finish()
        wall_s = time.monotonic() - started
        lines = sink_check.read_sink(sink_dir).lines
    if state != PipelineState.DONE:
        verdict = f'failed: the run ended {state}'
    elif case in FLOOR_CASES:
        verdict = reached_verdict(result, events)
    else:
        verdict = sink_check.lines_verdict(lines, expected_lines(events))
    records = result.progress()
    loads: collections.Counter = collections.Counter()
    load_ms: collections.Counter = collections.Counter()
    for record in records:
        loads.update(record.get('state_loads') or {})
        load_ms.update(record.get('state_load_ms') or {})
    points = read_points(records)
    ok = sink_check.is_ok(verdict)
    return {'wall_s': round(wall_s, 2), 'state': str(state), 'verdict': verdict,
            'events_per_s': sink_check.throughput(verdict, events, wall_s),
            'steady_events_per_s': steady_rate(points, events) if ok else '',
            'lines': len(lines), 'state_loads': dict(loads),
            'state_load_ms': {kind: round(ms, 1) for kind, ms in load_ms.items()},
            'pss_mb_tenth': memory.pss_at(_time_reaching(points, events / 10)),
            'pss_mb_end': memory.pss_at(None)}


def read_points(records: Sequence[dict]) -> list[tuple[float, int]]:
    """(end of the epoch, seconds since the Unix epoch; events read so far) of each kept
    progress record (the runner keeps the last 100: the count starts at the first)."""
    points, read = [], 0
    for record in records:
        start = datetime.datetime.fromisoformat(record['timestamp'].replace('Z', '+00:00'))
        read += sum(source['elements'] for source in record['sources'].values())
        points.append((start.timestamp() + record['duration_ms'] / 1000, read))
    return points


def steady_rate(points: Sequence[tuple[float, int]], events: int) -> int | str:
    """Events/s from the end of the first epoch by which `STEADY_FROM` of `events` were
    read to the end of the last; '' without enough epochs."""
    start = next((p for p in points if p[1] >= STEADY_FROM * events), None)
    if start is None or points[-1][0] <= start[0]:
        return ''
    return round((points[-1][1] - start[1]) / (points[-1][0] - start[0]))


def _time_reaching(points: Sequence[tuple[float, int]], read: float) -> float | None:
    return next((t for t, n in points if n >= read), None)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    events = next((int(a.split('=', 1)[1]) for a in args if a.startswith('--events=')),
                  100_000)
    case = next((a.split('=', 1)[1] for a in args if a.startswith('--case=')), 'dofn')
    if case not in CASES:
        raise SystemExit(f'--case={case}: not one of {", ".join(CASES)}')
    runner_args = [a for a in args if not a.startswith(('--events=', '--case='))]
    print(json.dumps(run_one(events, runner_args, case)), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
