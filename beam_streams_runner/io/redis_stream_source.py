"""`ReadFromRedisStream`: a Redis Stream read as a splittable DoFn, replayable from a cut.

Design sections 8 and 12. The restriction is a position in the stream: the last
id read (exclusive) up to `stop_after_id` (inclusive), or unbounded. Ids `ms-seq`
compare as `(ms, seq)` integer tuples. The DoFn reads with non-blocking XREAD
COUNT (it never blocks a task): while the stream has a backlog it reads on, and
the runner's checkpoints (`try_split`, fraction ~0) cut the read into slices; once
caught up it defers the rest (`defer_remainder`, `poll_interval_s`). Every split,
runner-initiated or a self-checkpoint, leaves primary = what was claimed and
residual = from after the last claimed id: the runner saves residuals with its
consistent cuts and replays from them after a reset, so the source replays
exactly what came after the cut (as long as the stream still holds those entries:
do not trim it past an uncommitted cut).

Each element is `(id, fields)`, `fields` a `dict[str, str]` (UTF-8 decoded),
timestamped at the id's milliseconds. A `ManualWatermarkEstimator` holds the
watermark at the last id read (Redis gives later entries ids, hence
milliseconds, no smaller), and at the stop once the restriction is done; an
idle stream holds the watermark where it is. With `stop_after_id` the read is
bounded: it ends after that id, or once the stream's last generated id passes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import apache_beam as beam
from apache_beam import coders
from apache_beam.io.iobase import RestrictionProgress, RestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.transforms.core import RestrictionProvider, WatermarkEstimatorProvider
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.utils.timestamp import Duration, Timestamp
from redis import exceptions as redis_errors

from beam_streams_runner.io.redis_sink import connect, unavailable
from beam_streams_runner.stores.urls import redacted_url

StreamId = tuple[int, int]
_MAX_SEQ = 2 ** 64 - 1
_ID = re.compile(r'(\d+)(?:-(\d+))?')


def parse_id(text: str | bytes, *, as_end: bool = False) -> StreamId:
    """`'ms-seq'` as `(ms, seq)`; a bare `'ms'` is `ms-0`, or `ms-<max>` `as_end`
    (as Redis reads it at the end of XRANGE)."""
    if isinstance(text, bytes):
        text = text.decode('ascii')
    match = _ID.fullmatch(text.strip())
    if match is None:
        raise ValueError(f'Not a Redis stream id: {text!r} (expected "<ms>-<seq>", e.g. '
                         "'1700000000000-0')")
    seq = match.group(2)
    return int(match.group(1)), int(seq) if seq is not None else (_MAX_SEQ if as_end else 0)


def format_id(stream_id: StreamId) -> str:
    return f'{stream_id[0]}-{stream_id[1]}'


def id_timestamp(stream_id: StreamId) -> Timestamp:
    return Timestamp(micros=stream_id[0] * 1000)


@dataclass(frozen=True)
class StreamRange:
    """The entries with `after < id <= stop` (`stop` None: no end)."""

    after: StreamId
    stop: StreamId | None = None

    def is_empty(self) -> bool:
        return self.stop is not None and self.after >= self.stop


class StreamRestrictionTracker(RestrictionTracker):
    """Claims stream ids in increasing order; splits right after the last claimed one."""

    def __init__(self, restriction: StreamRange) -> None:
        self._range = restriction
        self._last_attempt: StreamId | None = None
        self._claimed = 0

    def current_restriction(self) -> StreamRange:
        return self._range

    def try_claim(self, position: StreamId | str) -> bool:
        if not isinstance(position, tuple):
            position = parse_id(position)
        if position <= self._range.after or (
                self._last_attempt is not None and position <= self._last_attempt):
            raise ValueError(
                f'Stream ids are claimed in increasing order, after '
                f'{format_id(self._last_attempt or self._range.after)}: got '
                f'{format_id(position)}')
        self._last_attempt = position
        if self._range.stop is not None and position > self._range.stop:
            return False  # past the end (or past a split): the DoFn stops
        self._claimed += 1
        return True

    def _position(self) -> StreamId:
        """The last id claimed, or the start: where a residual would begin (exclusive)."""
        if self._last_attempt is None:
            return self._range.after
        return min(self._last_attempt, self._range.stop or self._last_attempt)

    def _done(self) -> bool:
        stop = self._range.stop
        return stop is not None and (self._range.is_empty() or (
            self._last_attempt is not None and self._last_attempt >= stop))

    def try_split(self, fraction_of_remainder: float) -> tuple[StreamRange, StreamRange] | None:
        # How ids are spread over the rest of a stream is unknown, so every split is a
        # checkpoint, whatever the fraction: the runner asks with fraction ~0 anyway.
        if self._done():
            return None
        position = self._position()
        primary = StreamRange(self._range.after, position)
        residual = StreamRange(position, self._range.stop)
        self._range = primary
        return primary, residual

    def check_done(self) -> None:
        if not self._done():
            raise ValueError(
                f'The read of the Redis stream ended before its restriction did: entries '
                f'after {format_id(self._position())} up to '
                f'{format_id(self._range.stop) if self._range.stop else "no end"} '
                'were not claimed')

    def current_progress(self) -> RestrictionProgress:
        # What is left of a stream is unknown: progress counts entries, 1 left until done.
        return RestrictionProgress(completed=self._claimed,
                                   remaining=0 if self._done() else 1)

    def is_bounded(self) -> bool:
        return self._range.stop is not None


class StreamRestrictionProvider(RestrictionProvider):
    """Element `(after, stop)` -> `StreamRange(after, stop)`; sizes are unknown (1)."""

    def initial_restriction(self, element: tuple[StreamId, StreamId | None]) -> StreamRange:
        after, stop = element
        return StreamRange(tuple(after), tuple(stop) if stop is not None else None)

    def create_tracker(self, restriction: StreamRange) -> StreamRestrictionTracker:
        return StreamRestrictionTracker(restriction)

    def restriction_size(self, element, restriction: StreamRange) -> float:
        return 0 if restriction.is_empty() else 1

    def restriction_coder(self) -> coders.Coder:
        return coders.PickleCoder()


class StreamWatermarkProvider(WatermarkEstimatorProvider):
    """A manual watermark starting at the restriction's start: nothing before it is read."""

    def initial_estimator_state(self, element, restriction: StreamRange) -> Timestamp:
        return id_timestamp(restriction.after)

    def create_watermark_estimator(self, state: Timestamp | None) -> ManualWatermarkEstimator:
        return ManualWatermarkEstimator(state)

    def estimator_state_coder(self) -> coders.Coder:
        return coders.NullableCoder(coders.TimestampCoder())


_RESTRICTIONS = StreamRestrictionProvider()
_WATERMARKS = StreamWatermarkProvider()


class _ReadStreamFn(beam.DoFn):
    """Reads a bounded restriction (`stop_after_id` given)."""

    def __init__(self, url: str, stream: str, poll_interval_s: float, batch_size: int) -> None:
        self._url = url
        self._stream = stream
        self._poll_interval_s = poll_interval_s
        self._batch_size = batch_size
        self._client = None  # made in setup(): a client does not pickle

    def __repr__(self) -> str:
        return f'ReadFromRedisStream({redacted_url(self._url)!r}, {self._stream!r})'

    def display_data(self) -> dict:
        return {'url': DisplayDataItem(redacted_url(self._url), label='Redis URL'),
                'stream': DisplayDataItem(self._stream, label='Stream')}

    def setup(self) -> None:
        self._client = connect(self._url, 'ReadFromRedisStream')

    def teardown(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def process(self, element,
                tracker=beam.DoFn.RestrictionParam(_RESTRICTIONS),
                estimator=beam.DoFn.WatermarkEstimatorParam(_WATERMARKS)):
        yield from self._read(tracker, estimator)

    def _read(self, tracker, estimator):
        position = tracker.current_restriction().after
        stop = tracker.current_restriction().stop
        while True:
            # Asked before the read: an entry XADDed between a read and this question
            # would otherwise count as passed without having been read.
            passed = stop is not None and self._passed(stop)
            entries = self._xread(position)
            for raw_id, raw_fields in entries:
                entry_id = parse_id(raw_id)
                if not tracker.try_claim(entry_id):
                    # Past the stop, or past a split the runner made while we read.
                    _advance(estimator, tracker.current_restriction().stop)
                    return
                timestamp = id_timestamp(entry_id)
                _advance(estimator, entry_id)
                yield beam.window.TimestampedValue(
                    (format_id(entry_id), _decoded(raw_fields)), timestamp)
                position = entry_id
                if stop is not None and entry_id >= stop:
                    return
            if len(entries) >= self._batch_size:
                continue  # a backlog: read on (the runner's checkpoints cut slices)
            if passed:
                # No entry at the stop, and none can come (ids only grow): done.
                tracker.try_claim((stop[0], stop[1] + 1))
                _advance(estimator, tracker.current_restriction().stop)
                return
            tracker.defer_remainder(Duration.of(self._poll_interval_s))
            return

    def _xread(self, position: StreamId) -> list:
        try:
            # No BLOCK: XREAD answers at once, with at most COUNT entries after `position`.
            reply = self._client.xread({self._stream: format_id(position)},
                                       count=self._batch_size)
        except redis_errors.RedisError as error:
            raise unavailable('ReadFromRedisStream', self._url, 'could not read from',
                              error) from None
        if isinstance(reply, dict):  # RESP3
            return next(iter(reply.values()), [[]])[0]
        return reply[0][1] if reply else []

    def _passed(self, stop: StreamId) -> bool:
        """Whether the stream's last generated id is at or past `stop`."""
        try:
            info = self._client.xinfo_stream(self._stream)
        except redis_errors.ResponseError:
            return False  # no such stream (yet)
        except redis_errors.RedisError as error:
            raise unavailable('ReadFromRedisStream', self._url, 'could not read from',
                              error) from None
        return parse_id(info['last-generated-id']) >= stop


class _ReadUnboundedStreamFn(_ReadStreamFn):
    """Reads an unbounded restriction: its output PCollection is unbounded."""

    @beam.DoFn.unbounded_per_element()
    def process(self, element,
                tracker=beam.DoFn.RestrictionParam(_RESTRICTIONS),
                estimator=beam.DoFn.WatermarkEstimatorParam(_WATERMARKS)):
        yield from self._read(tracker, estimator)


def _advance(estimator, to: StreamId | None) -> None:
    """Moves the watermark to `to`'s milliseconds, never back."""
    if to is None:
        return
    timestamp = id_timestamp(to)
    current = estimator.current_watermark()
    if current is None or timestamp > current:
        estimator.set_watermark(timestamp)


def _decoded(fields: dict) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in fields.items()}


def _text(value: str | bytes) -> str:
    return value.decode('utf-8') if isinstance(value, bytes) else value


def _positions(_, after: StreamId, stop: StreamId | None) -> tuple:
    return after, stop


class ReadFromRedisStream(beam.PTransform):
    """Reads the entries of Redis Stream `stream` after `start_id`, as `(id, fields)`.

    `start_id` is exclusive ('0-0': from the first entry); `stop_after_id`
    (inclusive) makes the read bounded. Replays exactly from a consistent cut;
    see the module docstring.
    """

    def __init__(self, url: str, stream: str, *, start_id: str = '0-0',
                 stop_after_id: str | None = None, poll_interval_s: float = 0.5,
                 batch_size: int = 500) -> None:
        super().__init__()
        if batch_size < 1 or poll_interval_s < 0:
            raise ValueError('ReadFromRedisStream: batch_size must be >= 1 and '
                             'poll_interval_s >= 0')
        self._after = parse_id(start_id)
        self._stop = parse_id(stop_after_id, as_end=True) if stop_after_id else None
        fn_class = _ReadStreamFn if self._stop is not None else _ReadUnboundedStreamFn
        self._fn = fn_class(url, stream, poll_interval_s, batch_size)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (pbegin
                | 'Impulse' >> beam.Impulse()
                | 'Position' >> beam.Map(_positions, self._after, self._stop)
                | 'Read' >> beam.ParDo(self._fn))

    def display_data(self) -> dict:
        return self._fn.display_data()
