"""A streaming pipeline for the driver-crash tests, run as a program of its own.

    python counting_pipeline.py OUT_DIR MARKER KILL_AT [runner flags...]

It counts `ELEMENTS` elements of a `PeriodicImpulse` over past timestamps per key
in one window that fires when the stream ends, and writes each count to a file of
its own under OUT_DIR. At element KILL_AT, the first time (MARKER remembers it),
a DoFn SIGKILLs the driver: the run dies at once, as on a crashed host.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

import beam_streams_runner  # noqa: F401 - makes --runner=StreamsSparkRunner known

ELEMENTS = 3000
KEYS = 5
START = 1_000_000_000.0  # past timestamps: read as fast as the epochs go


class KillDriverOnce(beam.DoFn):
    def __init__(self, marker: str, at: int, driver_pid: int) -> None:
        self.marker, self.at, self.driver_pid = marker, at, driver_pid

    def process(self, element):
        if element == self.at and not os.path.exists(self.marker):
            open(self.marker, 'w').close()
            os.kill(self.driver_pid, signal.SIGKILL)
        yield element


class WriteLines(beam.DoFn):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def process(self, element):
        with open(os.path.join(self.directory, uuid.uuid4().hex), 'w') as f:
            f.write(f'{element}\n')


def main(argv: list[str]) -> None:
    out, marker, kill_at, *flags = argv
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger('beam_streams_runner').setLevel(logging.INFO)  # the resume line
    options = PipelineOptions(['--streaming', *flags])
    with beam.Pipeline(options=options) as p:
        (p
         | PeriodicImpulse(START, START + ELEMENTS * 0.01, 0.01)
         | beam.Map(lambda t: round((float(t) - START) * 100))
         | beam.ParDo(KillDriverOnce(marker, int(kill_at), os.getpid()))
         | beam.WindowInto(window.FixedWindows(4_000_000_000))
         | beam.Map(lambda n: (n % KEYS, 1))
         | beam.CombinePerKey(sum)
         | beam.ParDo(WriteLines(out)))


if __name__ == '__main__':
    main(sys.argv[1:])
