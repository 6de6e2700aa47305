"""The churning-keys stateful DoFn: a streaming workload whose keys never recur.

Event n has event time `START + INTERVAL_S * n` (`PeriodicImpulse` over past timestamps,
so the source is read as fast as the epochs go) and key `n // EVENTS_PER_KEY`; in fixed
windows of `WINDOW_S` (1 s) each window has its own `KEYS_PER_WINDOW` (1,000) keys that
never come back. `CountUntilWindowEnd` (the keyed-state GC benchmark's) counts per key in
combining state and, on an event-time timer at the window's end, emits the count and
clears the state; the stream ends, so the watermark passes every window and every key
is flushed.

`run_one` runs it once in this process and returns its wall time and the verdict of its
output (`expected_lines`: one `key TAB window start TAB count` per key and window,
computed with the same float arithmetic and timestamp rounding as the source), as the
JSON line `python -m benchmarks.churning_keys --events N [runner options]` prints.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.utils.timestamp import Timestamp

import beam_streams_runner  # noqa: F401 - makes runner='StreamsSparkRunner' known
from benchmarks import sink_check
from benchmarks.keyed_state_gc import CountUntilWindowEnd

START = 1_000_000_000.0  # event time of event 0 (2001): long past, read at full speed
WINDOW_S = 1
KEYS_PER_WINDOW = 1000
EVENTS_PER_KEY = 5
INTERVAL_S = WINDOW_S / (KEYS_PER_WINDOW * EVENTS_PER_KEY)


def stream_end(events: int) -> float:
    """`PeriodicImpulse`'s stop for `events` events (half an interval past the last)."""
    return START + (events - 0.5) * INTERVAL_S


def event_index(t: float) -> int:
    return round((float(t) - START) / INTERVAL_S)


def build(p: beam.Pipeline, events: int, sink_prefix: str) -> None:
    _ = (p
         | 'Events' >> PeriodicImpulse(START, stream_end(events), INTERVAL_S)
         # Typed, so the keys get a deterministic coder (VarInt).
         | 'Key' >> beam.Map(lambda t: (event_index(t) // EVENTS_PER_KEY, 1)
                             ).with_output_types(tuple[int, int])
         | 'Window' >> beam.WindowInto(window.FixedWindows(WINDOW_S))
         | 'Count' >> beam.ParDo(CountUntilWindowEnd())
         | 'Write' >> beam.ParDo(sink_check.CountingSink(sink_prefix, output_line)))


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


def run_one(events: int, runner_args: Sequence[str]) -> dict:
    """One run in this process: {'wall_s', 'state', 'verdict', 'events_per_s', 'lines'}."""
    with tempfile.TemporaryDirectory(prefix='churn-') as sink_dir:
        p = beam.Pipeline(runner='StreamsSparkRunner',
                          options=PipelineOptions(['--streaming', *runner_args]))
        build(p, events, os.path.join(sink_dir, 'out'))
        started = time.monotonic()
        state = p.run().wait_until_finish()
        wall_s = time.monotonic() - started
        lines = sink_check.read_sink(sink_dir).lines
    verdict = (sink_check.lines_verdict(lines, expected_lines(events))
               if state == PipelineState.DONE else f'failed: the run ended {state}')
    return {'wall_s': round(wall_s, 2), 'state': str(state), 'verdict': verdict,
            'events_per_s': sink_check.throughput(verdict, events, wall_s),
            'lines': len(lines)}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    events = next((int(a.split('=', 1)[1]) for a in args if a.startswith('--events=')),
                  100_000)
    runner_args = [a for a in args if not a.startswith('--events=')]
    print(json.dumps(run_one(events, runner_args)), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
