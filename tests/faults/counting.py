"""A streaming count per key whose output must be exact after a fault, a reset or a drain.

Elements 0..n-1 of a `PeriodicImpulse` go through a step of the test's own (which
fails, sleeps or marks a file once), then are counted per key in one window that
fires only when the stream ends; each count goes to a file of its own, so a reset
that lost state or replayed a source twice shows as a wrong count.
"""

from __future__ import annotations

import glob
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beam_streams_runner import StreamsSparkRunner

KEYS = 5


class WriteLines(beam.DoFn):
    """Writes each element to a file of its own, `<prefix>-<uuid>`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def process(self, element):
        with open(f'{self.prefix}-{uuid.uuid4().hex}', 'w') as f:
            f.write(f'{element}\n')


def counts_pipeline(tmp_path, flags: list[str], start: float, elements: int,
                    interval: float, step: beam.DoFn | None = None) -> beam.Pipeline:
    """Elements 0..elements-1, one every `interval` s from `start`, through `step`,
    counted per key; the counts go to files tmp_path/out-*."""
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(flags))
    numbers = (p
               | PeriodicImpulse(start, start + elements * interval, interval)
               | beam.Map(lambda t, s=start, i=interval: round((float(t) - s) / i)))
    if step is not None:
        numbers = numbers | beam.ParDo(step)
    (numbers
     | beam.WindowInto(window.FixedWindows(4_000_000_000))  # fires when the stream ends
     | beam.Map(lambda n: (n % KEYS, 1))
     | beam.CombinePerKey(sum)
     | beam.ParDo(WriteLines(str(tmp_path / 'out'))))
    return p


def output(tmp_path) -> list[str]:
    """The counts written, sorted."""
    return sorted(line for path in glob.glob(str(tmp_path / 'out-*'))
                  for line in open(path).read().splitlines())


def expected(elements: int) -> list[str]:
    return sorted(str((k, elements // KEYS)) for k in range(KEYS))
