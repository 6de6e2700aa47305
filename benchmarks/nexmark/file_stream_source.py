"""The streaming comparison's events directory read as an unbounded Beam source.

`ReadNexmarkEventFiles(directory, num_events, config)` reads the event files of the
`stream_files` contract the way a streaming job reads files landing in a directory:
an unbounded splittable DoFn (`EventFilesFn`, modelled on `sources.UnboundedNexmarkFn`)
over `parts` parallel parts (default 2, the cores). File `events-<i>` belongs to part
`i % parts`; a part reads its files in name order, parses each line as Beam's launcher
does (`nexmark_util.ParseJsonEventFn`, as `event_file`) and emits each event at its
`date_time`, which is what Beam's Python queries expect.

Restriction: a part's position, `ordinal * FILE_STRIDE + byte offset`, `ordinal` being
the index of the file among the part's files; a restriction `[start, stop)` holds the
lines that *start* at a position in it, so any position is a valid place to resume
(`lines_from`: a resumed read skips the rest of the line it lands in), whatever cut a
checkpoint makes. The tracker (`FileStreamTracker`) only checkpoints: every split cuts
right after the last claimed line, as the runner's checkpoints ask (a fraction ~0) and
as Beam's `defer_remainder` does; how many bytes are still to come is unknown, so a
fractional split has nothing to go by (the parts are the parallelism).

Each `process` call emits at most `MAX_EVENTS_PER_CALL` events, then self-checkpoints,
so epochs stay short. When a part's next file is not there yet it defers the rest of its
restriction by `POLL_DELAY_S` (it never sleeps). When the next file is missing and the
end file is there (it is written after every events file) the part is at its end: it
takes the sentinel's time into its watermark, never emits it, and finishes.

Watermark: `sources.NexmarkWatermarkEstimator`, the last emitted event time minus
`out_of_order_bound_ms(config)` (never going back), +inf once the part has read the end
file. With `started_dir` every part records the wall time of its first `process` call
(`started-<part>`: the first event read), and with `ready_file` that first call also
writes the ready file, telling a feeder the stream runs. Workers must share this
machine's file system (a local master), as the events directory itself requires.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.io.iobase import RestrictionProgress, RestrictionTracker
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.metrics import Metrics
from apache_beam.testing.benchmarks.nexmark import nexmark_util
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.sources import (
    MAX_EVENTS_PER_CALL,
    NexmarkWatermarkEstimator,
    NexmarkWatermarkEstimatorProvider,
)
from benchmarks.nexmark.stream_files import END_FILE, EVENTS_PATTERN, is_end_event

# Positions of one file: byte offsets below 1 TiB.
FILE_STRIDE = 1 << 40
# Files of one part at most; the last position of the range is the end of the part.
MAX_FILES_PER_PART = 1 << 22
END_POSITION = FILE_STRIDE * MAX_FILES_PER_PART
# How long a part waiting for its next file defers its restriction (s): the feeder
# moves a file in every `stream_files.FEED_SECONDS`.
POLL_DELAY_S = 0.05
DEFAULT_PARTS = 2
METRICS_NAMESPACE = 'file_stream_source'
EVENTS_COUNTER = 'events'
STARTED_PREFIX = 'started-'


def position(ordinal: int, offset: int) -> int:
    """The restriction position of byte `offset` of the part's `ordinal`-th file."""
    return ordinal * FILE_STRIDE + offset


def file_name(part: int, parts: int, ordinal: int) -> str:
    """The name of the part's `ordinal`-th events file."""
    return EVENTS_PATTERN.format(part + ordinal * parts)


def lines_from(path: str, offset: int) -> Iterator[tuple[int, bytes]]:
    """(start offset, line) of every line of `path` starting at `offset` or later.

    A resumed restriction may start inside a line (a checkpoint cuts right after the
    start of the last line read): the rest of that line belongs to the read before.
    """
    with open(path, 'rb') as f:
        if offset > 0:
            f.seek(offset - 1)
            # The byte before `offset` ends the line it is in, or is that line's newline.
            offset += len(f.readline()) - 1
        for line in f:
            yield offset, line
            offset += len(line)


class FileStreamTracker(RestrictionTracker):
    """Claims increasing positions of an `OffsetRange`; every split is a checkpoint
    right after the last claimed position (see the module docstring)."""

    def __init__(self, restriction: OffsetRange) -> None:
        self._range = restriction
        self._last_attempt: int | None = None

    def current_restriction(self) -> OffsetRange:
        return self._range

    def try_claim(self, position: int) -> bool:
        if position < self._range.start or (
                self._last_attempt is not None and position <= self._last_attempt):
            raise ValueError(
                f'Positions are claimed in increasing order from {self._range.start}: got '
                f'{position} after {self._last_attempt}')
        self._last_attempt = position
        if position >= self._range.stop:
            return False  # past the end or past a checkpoint: the DoFn stops
        return True

    def _done(self) -> bool:
        return self._range.start >= self._range.stop or (
            self._last_attempt is not None and self._last_attempt >= self._range.stop - 1)

    def try_split(self, fraction_of_remainder: float
                  ) -> tuple[OffsetRange, OffsetRange] | None:
        if self._done():
            return None
        if self._last_attempt is None and fraction_of_remainder > 0:
            # Nothing read yet: a cut here would only leave an empty primary.
            return None
        cut = self._range.start if self._last_attempt is None else self._last_attempt + 1
        primary, residual = OffsetRange(self._range.start, cut), OffsetRange(
            cut, self._range.stop)
        self._range = primary
        return primary, residual

    def check_done(self) -> None:
        if not self._done():
            raise ValueError(
                f'The read of the events files ended before its restriction did: '
                f'positions from {self._last_attempt or self._range.start} to '
                f'{self._range.stop} were not claimed')

    def current_progress(self) -> RestrictionProgress:
        # How much is still to come is unknown: nothing done until all is. A fraction,
        # not completed/remaining work: Beam's harness replaces `completed` with the
        # bytes output so far, which is NaN before its byte counter has a sample (a
        # NaN progress fails its split arithmetic); a fraction it keeps as it is.
        return RestrictionProgress(fraction=1.0 if self._done() else 0.0)

    def is_bounded(self) -> bool:
        return False


class FileStreamRestrictionProvider(RestrictionProvider):
    """A part's positions [0, END_POSITION); backlog sizes are unknown (1)."""

    def initial_restriction(self, element: tuple[int, int]) -> OffsetRange:
        return OffsetRange(0, END_POSITION)

    def create_tracker(self, restriction: OffsetRange) -> FileStreamTracker:
        return FileStreamTracker(restriction)

    def restriction_size(self, element, restriction: OffsetRange) -> int:
        return 1 if restriction.start < restriction.stop else 0

    def split(self, element, restriction: OffsetRange) -> Iterator[OffsetRange]:
        yield restriction  # the parts are the parallelism


_PARSER = nexmark_util.ParseJsonEventFn()


class EventFilesFn(beam.DoFn, FileStreamRestrictionProvider,
                   NexmarkWatermarkEstimatorProvider):
    """The unbounded read of one part of the events directory (module docstring).
    Input: `(part, parts)`. Output: Beam's NEXMark model objects at their event time."""

    def __init__(self, directory: str, config: NexmarkConfig,
                 started_dir: str | None = None, ready_file: str | None = None) -> None:
        beam.DoFn.__init__(self)
        NexmarkWatermarkEstimatorProvider.__init__(self, config)
        self._directory = directory
        self._started_dir = started_dir
        self._ready_file = ready_file
        self._marked: set[int] = set()
        self._events = Metrics.counter(METRICS_NAMESPACE, EVENTS_COUNTER)

    @beam.DoFn.unbounded_per_element()
    def process(self, element: tuple[int, int],
                tracker=beam.DoFn.RestrictionParam(),
                watermark_estimator=beam.DoFn.WatermarkEstimatorParam()):
        part, parts = element
        if part not in self._marked:
            self._mark_started(part)
        ordinal, offset = divmod(tracker.current_restriction().start, FILE_STRIDE)
        budget = MAX_EVENTS_PER_CALL
        while ordinal < MAX_FILES_PER_PART - 1:
            path = os.path.join(self._directory, file_name(part, parts, ordinal))
            if not os.path.exists(path):
                if not os.path.exists(os.path.join(self._directory, END_FILE)):
                    tracker.defer_remainder(Duration(seconds=POLL_DELAY_S))
                    return
                # The end file comes after every events file: look again, then end.
                if not os.path.exists(path):
                    self._end(part, parts, ordinal, tracker, watermark_estimator)
                    return
            count = 0
            for start, line in lines_from(path, offset):
                if count == budget:
                    self._events.inc(count)
                    tracker.defer_remainder(Duration())
                    return
                if not tracker.try_claim(position(ordinal, start)):
                    self._events.inc(count)
                    return
                if not line.strip():
                    continue
                (event,) = _PARSER.process(line)
                watermark_estimator.advance(event.date_time)
                count += 1
                yield TimestampedValue(event, event.date_time)
            self._events.inc(count)
            budget -= count
            ordinal, offset = ordinal + 1, 0
        raise ValueError(f'{self._directory}: more than {MAX_FILES_PER_PART - 1} events '
                         f'files for part {part}: write fewer, larger files')

    def _end(self, part: int, parts: int, ordinal: int, tracker,
             watermark_estimator: NexmarkWatermarkEstimator) -> None:
        """The part's next file is missing and the end file is there: check that no
        later file of the part exists (a gap would lose events), take the sentinel's
        time into the watermark, finish the restriction and the watermark."""
        later = os.path.join(self._directory, file_name(part, parts, ordinal + 1))
        if os.path.exists(later):
            raise ValueError(
                f'{self._directory}: {file_name(part, parts, ordinal)} is missing but '
                f'{os.path.basename(later)} and the end file are there: the events '
                'directory is incomplete; write it again (stream_files.write_event_files)')
        if not tracker.try_claim(END_POSITION - 1):
            return  # a checkpoint cut before the end: the residual reads it
        with open(os.path.join(self._directory, END_FILE), encoding='utf-8') as f:
            sentinels = [json.loads(line) for line in f if line.strip()]
        if len(sentinels) != 1 or not is_end_event(sentinels[0]):
            raise ValueError(f'{self._directory}/{END_FILE} must hold exactly one '
                             f'sentinel bid (stream_files.end_line), found {sentinels!r:.200}')
        watermark_estimator.advance(Timestamp(micros=sentinels[0]['dateTime'] * 1000))
        watermark_estimator.exhaust()

    def _mark_started(self, part: int) -> None:
        """On a part's first call: its start time (`started-<part>`, kept from the first
        call ever, replays included) and the ready file, each written whole."""
        now = time.time()
        if self._started_dir is not None:
            marker = os.path.join(self._started_dir, f'{STARTED_PREFIX}{part}')
            if not os.path.exists(marker):
                _write_whole(marker, repr(now))
        if self._ready_file is not None and not os.path.exists(self._ready_file):
            _write_whole(self._ready_file, repr(now))
        self._marked.add(part)


def _write_whole(path: str, text: str) -> None:
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'w', encoding='utf-8') as f:
        f.write(text)
    os.replace(tmp, path)


def started_time(started_dir: str) -> float | None:
    """When the first part started reading (wall time, s), None if none did."""
    times = []
    for name in os.listdir(started_dir):
        if name.startswith(STARTED_PREFIX) and not name.endswith('.tmp'):
            with open(os.path.join(started_dir, name), encoding='utf-8') as f:
                times.append(float(f.read()))
    return min(times, default=None)


class ReadNexmarkEventFiles(beam.PTransform):
    """The events of the `stream_files` directory `directory` (`num_events` events before
    the end file) as an unbounded stream of timestamped Beam model objects, read by
    `parts` parallel parts; see the module docstring for `started_dir`, `ready_file`."""

    def __init__(self, directory: str, num_events: int, config: NexmarkConfig,
                 parts: int = DEFAULT_PARTS, started_dir: str | None = None,
                 ready_file: str | None = None) -> None:
        super().__init__()
        if parts < 1:
            raise ValueError(f'parts must be at least 1: {parts}')
        if num_events < 0:
            raise ValueError(f'num_events must be >= 0: {num_events}')
        if not os.path.isdir(directory):
            raise ValueError(f'events directory {directory!r} does not exist: create it '
                             '(stream_files.write_event_files, or feed) first')
        self.num_events = num_events
        self._directory = os.path.abspath(directory)
        self._config = config
        self._parts = parts
        self._started_dir = started_dir
        self._ready_file = ready_file

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (pbegin
                | 'Parts' >> beam.Create([(p, self._parts) for p in range(self._parts)])
                | 'ReadEventFiles' >> beam.ParDo(EventFilesFn(
                    self._directory, self._config, self._started_dir, self._ready_file)))
