"""Streaming word counts: windowed counts over an endless stream, runnable at once.

A generated stream of words (one every `1 / --rate` seconds, each stamped with
the time it was generated; no external system needed) is cut into fixed
event-time windows of `--window_s` seconds and the words of each window are
counted; every pane is printed (or written under `--output`) with its window
and its timing::

    python -m beam_streams_runner.examples.streaming_counts --runner=StreamsSparkRunner

It runs until Ctrl-C (which cancels the pipeline: `Pipeline cancelled`, exit
status 130), or stops by itself after `--num_elements` words or `--duration_s`
seconds, once the last windows have fired. Each line reads::

    [2026-11-25T10:00:00Z, 2026-11-25T10:00:05Z) fox: 6 (ON_TIME pane 0)

Spark options such as `--spark_master=local[2]` pass through; with the runner's
logger at INFO (as here) it logs one progress line per epoch. Any other Beam
runner works too (e.g. `--runner=DirectRunner`).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import time
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineResult
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming

import beam_streams_runner  # noqa: F401 - registers the short runner name

WORDS = 'the quick brown fox jumps over the lazy dog'.split()


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """This example's options, and the rest (the pipeline's options).

    A plain parser, as Beam's own examples use, not a `PipelineOptions` subclass:
    Beam parses every subclass's flags for any options object, so two examples
    imported in one process would both claim `--output`.
    """
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], allow_abbrev=False)
    parser.add_argument('--rate', type=float, default=10.0,
                        help='Words generated per second.')
    parser.add_argument('--window_s', type=float, default=5.0,
                        help='Length of the fixed event-time windows, in seconds.')
    parser.add_argument('--num_elements', type=int, default=None,
                        help='Stop after this many words (default: run until Ctrl-C).')
    parser.add_argument('--duration_s', type=float, default=None,
                        help='Stop after generating words for this many seconds.')
    parser.add_argument('--output', default=None,
                        help='Path prefix of files to write the panes to, a file per '
                             'bundle (default: print them).')
    return parser.parse_known_args(argv)


class WordStream(beam.PTransform):
    """Words cycling through `WORDS`, `rate` a second, each stamped with its time;
    `num_elements` words, or `duration_s` seconds of them, or never ending."""

    def __init__(self, rate: float, num_elements: int | None = None,
                 duration_s: float | None = None) -> None:
        super().__init__()
        self._rate = rate
        interval = 1.0 / rate
        # On the grid of whole intervals, so that a tick's time tells its place in
        # the cycle of words (`word_at`) without float noise.
        start = Timestamp.of(math.ceil(time.time() * rate) / rate)
        if num_elements is not None:
            # Half an interval short: the stop time is exclusive and float steps inexact.
            stop = start + (num_elements - 0.5) * interval
        elif duration_s is not None:
            stop = start + duration_s
        else:
            stop = MAX_TIMESTAMP
        self._ticks = PeriodicImpulse(start, stop, interval)

    def expand(self, pbegin):
        return (pbegin
                | 'Ticks' >> self._ticks
                | 'Word' >> beam.Map(word_at, self._rate).with_output_types(str))


def word_at(tick: Timestamp, rate: float) -> str:
    """The word of the tick at time `tick` of a stream of `rate` ticks a second."""
    return WORDS[round(float(tick) * rate) % len(WORDS)]


def format_pane(word: str, count: int, win: window.IntervalWindow, pane: PaneInfo) -> str:
    return (f'[{win.start.to_rfc3339()}, {win.end.to_rfc3339()}) {word}: {count} '
            f'({PaneInfoTiming.to_string(pane.timing)} pane {pane.index})')


class FormatPane(beam.DoFn):
    def process(self, element, win=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        word, count = element
        yield format_pane(word, count, win, pane)


class PrintPanes(beam.DoFn):
    """Prints each pane. It runs in a Spark worker: Spark copies the workers' output
    to the driver's stderr, so on a local master the panes reach the console."""

    def process(self, line: str) -> None:
        print(line, flush=True)


class WritePanes(beam.DoFn):
    """Writes each bundle's panes to a new file `<prefix>-<unique id>`: a streaming
    pipeline never ends a file, so each file is complete once it appears."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    def start_bundle(self) -> None:
        self._lines: list[str] = []

    def process(self, line: str) -> None:
        self._lines.append(line)

    def finish_bundle(self) -> None:
        if self._lines:
            path = os.path.abspath(f'{self._prefix}-{uuid.uuid4().hex}')
            directory, name = os.path.split(path)
            os.makedirs(directory, exist_ok=True)
            # Written under a hidden name and renamed: a reader never sees half a file.
            hidden = os.path.join(directory, f'.{name}.tmp')
            with open(hidden, 'w', encoding='utf-8') as f:
                f.write('\n'.join(self._lines) + '\n')
            os.replace(hidden, path)


def build_pipeline(p: beam.Pipeline, options: argparse.Namespace) -> None:
    """Adds the counts to `p`, configured by `options` (see `parse_args`)."""
    panes = (p
             | 'Words' >> WordStream(options.rate, options.num_elements, options.duration_s)
             | 'Window' >> beam.WindowInto(window.FixedWindows(options.window_s))
             | 'Count' >> beam.combiners.Count.PerElement()
             | 'Format' >> beam.ParDo(FormatPane()))
    if options.output:
        _ = panes | 'Write' >> beam.ParDo(WritePanes(options.output))
    else:
        _ = panes | 'Print' >> beam.ParDo(PrintPanes())


def main(argv: list[str] | None = None) -> PipelineResult:
    """Runs the streaming counts; returns the pipeline's result once it ended."""
    counts_options, pipeline_args = parse_args(argv)
    options = PipelineOptions(pipeline_args)
    options.view_as(StandardOptions).streaming = True
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, counts_options)
    result = pipeline.run()
    result.wait_until_finish()
    return result


if __name__ == '__main__':
    # The runner's progress lines at INFO; Beam's own INFO chatter stays out.
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    logging.getLogger('beam_streams_runner').setLevel(logging.INFO)
    main()
