"""NEXMark events in a JSON-lines file: written from the generator, read as Beam reads them.

A batch run with `--input=PATH` reads its events from a file instead of generating
them in the pipeline, so the read path (a text file's splits, a JSON decode per line)
is timed instead of the generator, which costs every runner alike. The file holds the
events of the run's NEXMark configuration in position order, one JSON object per line
in the format of Beam's own NEXMark launcher (`nexmark_util.ParseJsonEventFn`: the
model's fields in camel case, times in milliseconds); `ReadNexmarkEventsFromFile` is
Beam's launcher's `read_from_file` (`ReadFromText`, that parser, then each event at
its `date_time`). The events are those `ReadNexmarkEvents` generates, so the outputs
of the two reads compare equal.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import NamedTuple

import apache_beam as beam
from apache_beam.testing.benchmarks.nexmark import nexmark_util
from apache_beam.testing.benchmarks.nexmark.models import nexmark_model
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import Event, events

PROGRESS_EVERY = 200_000


def json_line(event: Event) -> str:
    """`event` as Beam's NEXMark JSON (its fields in camel case, times in ms)."""
    return json.dumps({_camel(name): nexmark_model.unnest_to_json(value)
                       for name, value in vars(event).items()}, separators=(',', ':'))


def _camel(name: str) -> str:
    first, *rest = name.split('_')
    return first + ''.join(part.title() for part in rest)


def write_events(config: NexmarkConfig, path: str) -> int:
    """Writes the events of `config` to `path` (through a temporary file, so a file at
    `path` is always whole); returns their number. Prints a progress line every
    `PROGRESS_EVERY` events."""
    started, count = time.monotonic(), 0
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
        for event in events(config):
            f.write(json_line(event.event) + '\n')
            count += 1
            if count % PROGRESS_EVERY == 0:
                print(f'  wrote {count:,} of {config.max_events:,} events to {path} '
                      f'({time.monotonic() - started:.0f} s)', file=sys.stderr, flush=True)
    os.replace(path + '.tmp', path)
    return count


def count_lines(path: str) -> int:
    with open(path, 'rb') as f:
        return sum(1 for _ in f)


def ensure_events(config: NexmarkConfig, path: str) -> None:
    """Writes the events of `config` to `path` unless it already holds that many lines;
    a file with another number of events is an error (it is another event set)."""
    if not os.path.exists(path):
        write_events(config, path)
        return
    found = count_lines(path)
    if found != config.max_events:
        raise ValueError(
            f'--input {path} holds {found:,} events, the run asks for '
            f'{config.max_events:,}: remove the file (it is written again) or give '
            '--events equal to its count.')


class FileEvent(NamedTuple):
    """An event read from the file, with the parts of a generated `TimestampedEvent`
    that the native baselines use."""

    event: Event
    timestamp_ms: int

    @property
    def timestamp(self) -> Timestamp:
        return Timestamp(micros=self.timestamp_ms * 1000)


_PARSER = nexmark_util.ParseJsonEventFn()


def parse_line(line: str) -> FileEvent:
    """A line of the file as Beam's launcher parses it, with its event time."""
    (event,) = _PARSER.process(line)
    return FileEvent(event, event.date_time.micros // 1000)


class ReadNexmarkEventsFromFile(beam.PTransform):
    """The NEXMark events of a JSON-lines file, as timestamped Beam model objects."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (pbegin
                | 'ReadLines' >> beam.io.ReadFromText(self._path)
                | 'Parse' >> beam.ParDo(nexmark_util.ParseJsonEventFn())
                | 'Timestamp' >> beam.Map(lambda e: TimestampedValue(e, e.date_time)))
