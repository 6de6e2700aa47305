"""The bounded NEXMark source: generated events, split by event-number ranges.

`NexmarkSource` is a Beam `BoundedSource` over positions [0, num_events) of
the generator (`generator.event_at`: event n depends only on the config and n),
so every split generates its events independently and identically on every
runner. It splits into at least `MIN_SPLITS` ranges whatever the desired bundle
size, so that a small benchmark is still read in parallel. `ReadNexmarkEvents`
reads it and yields Beam's Python NEXMark model objects (Person, Auction, Bid)
timestamped with their event time, which is what Beam's Python queries expect.

`ReadUnboundedNexmarkEvents` is the streaming source: an unbounded splittable DoFn
(`UnboundedNexmarkFn`) over the same events, see its docstring.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.io import iobase
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms.core import RestrictionProvider, WatermarkEstimatorProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import events, next_event

MIN_SPLITS = 16
# Parts of the unbounded source (each a block of whole timelines), at most.
UNBOUNDED_SPLITS = 8
# Events one `process` call emits before it checkpoints (as fast as possible mode), so a
# streaming runner gets control (outputs, watermark) regularly.
MAX_EVENTS_PER_CALL = 10_000


class NexmarkSource(iobase.BoundedSource):
    def __init__(self, config: NexmarkConfig) -> None:
        self.config = config

    def _average_event_bytes(self) -> int:
        c = self.config
        # Person:auction:bid = 1:3:46.
        return (c.avg_person_byte_size + 3 * c.avg_auction_byte_size
                + 46 * c.avg_bid_byte_size) // 50

    def estimate_size(self) -> int:
        return self.config.max_events * self._average_event_bytes()

    def split(self, desired_bundle_size: int, start_position: int | None = None,
              stop_position: int | None = None) -> Iterator[iobase.SourceBundle]:
        start = 0 if start_position is None else start_position
        stop = self.config.max_events if stop_position is None else stop_position
        by_size = max(1, desired_bundle_size // self._average_event_bytes())
        step = max(1, min(by_size, -(-(stop - start) // MIN_SPLITS)))
        for begin in range(start, stop, step):
            end = min(begin + step, stop)
            yield iobase.SourceBundle(
                weight=end - begin, source=self, start_position=begin, stop_position=end)

    def get_range_tracker(self, start_position: int | None,
                          stop_position: int | None) -> OffsetRangeTracker:
        start = 0 if start_position is None else start_position
        stop = self.config.max_events if stop_position is None else stop_position
        return OffsetRangeTracker(start, stop)

    def read(self, range_tracker: OffsetRangeTracker) -> Iterator[TimestampedValue]:
        position = range_tracker.start_position()
        for event in events(self.config, position, range_tracker.stop_position()):
            if not range_tracker.try_claim(event.position):
                return
            yield event.timestamped_value()


class ReadNexmarkEvents(beam.PTransform):
    """The NEXMark events of `config`, as timestamped Beam model objects."""

    def __init__(self, config: NexmarkConfig) -> None:
        super().__init__()
        self._config = config

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return pbegin | 'ReadNexmark' >> beam.io.Read(NexmarkSource(self._config))


# ---------------------------------------------------------------- unbounded source


@dataclass(frozen=True)
class UnboundedPart:
    """One part of the unbounded source: the timelines [first_generator, stop_generator).

    Java's generator runs `num_event_generators` parallel timelines (`generator` module
    docstring); a part is a block of whole timelines, i.e. the contiguous positions
    [start_position, start_position + size) (positions = event ids when in order). Its
    offsets 0..size-1 are the emission order of those events: by event number on the
    timelines, then by timeline, so event times rise along the offsets (up to the
    out-of-order groups) and every part's clock advances at the same pace.
    """

    first_generator: int
    stop_generator: int
    # Events of every timeline but the config's last one; the last one may hold more.
    block: int
    last_generator_events: int
    num_generators: int

    @property
    def width(self) -> int:
        return self.stop_generator - self.first_generator

    @property
    def has_last(self) -> bool:
        return self.stop_generator == self.num_generators

    @property
    def size(self) -> int:
        extra = self.last_generator_events - self.block if self.has_last else 0
        return self.width * self.block + extra

    @property
    def start_position(self) -> int:
        return self.first_generator * self.block

    def locate(self, offset: int) -> tuple[int, int]:
        """(timeline, events emitted before it on that timeline) of emission `offset`."""
        if not 0 <= offset < self.size:
            raise IndexError(f'offset {offset} outside [0, {self.size})')
        interleaved = self.width * self.block
        if offset < interleaved:
            return self.first_generator + offset % self.width, offset // self.width
        # Past the common length only the config's last timeline has events.
        return self.num_generators - 1, self.block + offset - interleaved

    def position(self, offset: int) -> int:
        """Position (in `generator.events` order) of the event at emission `offset`."""
        generator, count = self.locate(offset)
        return generator * self.block + count

    def element(self) -> tuple[int, int]:
        """The PCollection element naming this part."""
        return self.first_generator, self.stop_generator


def unbounded_parts(config: NexmarkConfig, num_splits: int = UNBOUNDED_SPLITS
                    ) -> list[UnboundedPart]:
    """The config's timelines in at most `num_splits` parts of whole timelines, none
    empty (with fewer events than timelines only the last timeline has events)."""
    num_generators = config.num_event_generators
    block = config.max_events // num_generators
    last = config.max_events - block * (num_generators - 1)
    if block == 0:
        ranges = [(num_generators - 1, num_generators)] if last else []
    else:
        n = max(1, min(num_splits, num_generators))
        bounds = [num_generators * i // n for i in range(n + 1)]
        ranges = [(a, b) for a, b in itertools.pairwise(bounds) if a < b]
    return [UnboundedPart(a, b, block, last, num_generators) for a, b in ranges]


def part_of(config: NexmarkConfig, element: tuple[int, int]) -> UnboundedPart:
    num_generators = config.num_event_generators
    block = config.max_events // num_generators
    last = config.max_events - block * (num_generators - 1)
    return UnboundedPart(element[0], element[1], block, last, num_generators)


def out_of_order_bound_ms(config: NexmarkConfig) -> int:
    """How far (ms) a later event of a timeline can be older than an earlier one, plus
    the config's `watermark_holdback_sec`.

    Within a timeline, the event numbers of an out-of-order group of
    `out_of_order_group_size` (n) events are permuted (`next_adjusted_event_number`), and
    timestamps rise with event numbers by at most ceil(d / 1000) ms per event, d being the
    largest per-timeline inter-event delay of the rate shape in microseconds
    (`inter_event_delay_us`, already multiplied by the number of timelines; a step
    boundary of a multi-step shape adds no more, its offsets being floored). An emitted
    event is at most n - 1 event numbers above the first of its group, and no later event
    is older than that first one, so the bound is (n - 1) * ceil(d / 1000) ms (0 in
    order). Java's occasional emission delays (`delay_ms`, only when `is_rate_limited`)
    are not applied by this source: events leave each part in emission order, so they
    need no bound; `watermark_holdback_sec` (Java's `watermarkHoldbackSec`) is added.
    """
    delay_ms = -(-max(config.inter_event_delay_us) // 1000)
    return ((config.out_of_order_group_size - 1) * delay_ms
            + config.watermark_holdback_sec * 1000)


# -- pacing


def due_count(elapsed_s: float, part_rate: float) -> int:
    """How many events of a part are due `elapsed_s` after its pacing origin at
    `part_rate` events/s: event k is due at k / part_rate, so floor(elapsed * rate) + 1."""
    if elapsed_s < 0:
        return 0
    return math.floor(elapsed_s * part_rate + 1e-9) + 1


def resume_delay_s(offset: int, elapsed_s: float, part_rate: float) -> float:
    """Seconds from now (`elapsed_s` after the origin) until event `offset` is due."""
    return max(0.0, offset / part_rate - elapsed_s)


def end_call(tracker, watermark_estimator, end: int, delay: float | None,
             rate: float | None, elapsed_s: Callable[[], float]) -> None:
    """Ends one `process` call of a paced part after it emitted offsets up to `end`
    (`pacing_step` gave `delay`): the part is exhausted (delay None), or it resumes
    when its next event is due, recomputed after the emission, which took time
    (`elapsed_s()`: seconds since the part's pacing origin), or at once if unpaced."""
    if delay is None:
        watermark_estimator.exhaust()
        return
    if rate is not None:
        delay = resume_delay_s(end, elapsed_s(), rate)
    tracker.defer_remainder(Duration(seconds=delay))


def part_rate(rate: float, part_size: int, total_events: int) -> float:
    """A part's share of the overall `rate` (events/s over all parts): proportional to its
    size, so every part ends at the same time."""
    return rate * part_size / total_events


def pacing_step(next_offset: int, stop: int, elapsed_s: float, rate: float | None,
                max_batch: int = MAX_EVENTS_PER_CALL) -> tuple[int, float | None]:
    """What one `process` call of a part does: (emit offsets [next_offset, end), then
    resume after this many seconds, or None when `end == stop`).

    `rate`: the part's events/s (None: as fast as possible); `elapsed_s`: seconds since the
    part's pacing origin. At most `max_batch` events per call.
    """
    if rate is None:
        end = min(stop, next_offset + max_batch)
        return end, (None if end >= stop else 0.0)
    end = min(stop, next_offset + max_batch, max(next_offset, due_count(elapsed_s, rate)))
    if end >= stop:
        return stop, None
    return end, resume_delay_s(end, elapsed_s, rate)


# -- watermark


class NexmarkWatermarkEstimator(iobase.WatermarkEstimator):
    """Watermark = event time of the last emitted event minus the out-of-order bound
    (never going back), +inf once the part is exhausted.

    The state also carries the part's pacing origin (wall-clock seconds), the only
    per-restriction value a checkpoint must keep besides the restriction:
    `(watermark micros, origin or None)`.
    """

    def __init__(self, state: tuple[int, float | None], bound_ms: int) -> None:
        self._watermark = Timestamp(micros=state[0])
        self._origin = state[1]
        self._bound_us = bound_ms * 1000

    def observe_timestamp(self, timestamp: Timestamp) -> None:
        # The DoFn drives the watermark (`advance`), knowing the bound.
        pass

    def current_watermark(self) -> Timestamp:
        return self._watermark

    def get_estimator_state(self) -> tuple[int, float | None]:
        return self._watermark.micros, self._origin

    def advance(self, event_timestamp: Timestamp) -> None:
        """An event of `event_timestamp` was emitted."""
        candidate = Timestamp(micros=event_timestamp.micros - self._bound_us)
        if candidate > self._watermark:
            self._watermark = candidate

    def exhaust(self) -> None:
        """No event follows: the watermark goes to +inf."""
        self._watermark = MAX_TIMESTAMP

    def pacing_origin(self, default: float) -> float:
        """The pacing origin, set to `default` the first time (and when a runner dropped
        the estimator state)."""
        if self._origin is None:
            self._origin = default
        return self._origin


class NexmarkWatermarkEstimatorProvider(WatermarkEstimatorProvider):
    def __init__(self, config: NexmarkConfig) -> None:
        self._bound_ms = out_of_order_bound_ms(config)

    def initial_estimator_state(self, element, restriction) -> tuple[int, None]:
        return MIN_TIMESTAMP.micros, None

    def create_watermark_estimator(self, estimator_state) -> NexmarkWatermarkEstimator:
        return NexmarkWatermarkEstimator(estimator_state, self._bound_ms)


class NexmarkRestrictionProvider(RestrictionProvider):
    """Offsets [0, part size) of a part, in emission order (`UnboundedPart`)."""

    def __init__(self, config: NexmarkConfig) -> None:
        self._config = config

    def initial_restriction(self, element: tuple[int, int]) -> OffsetRange:
        return OffsetRange(0, part_of(self._config, element).size)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction: OffsetRange) -> int:
        return restriction.size()

    def split(self, element, restriction: OffsetRange) -> Iterator[OffsetRange]:
        # The parts are the parallelism; splitting a part's offsets further would cut it
        # into slices of event time, which would hold the watermark back.
        yield restriction


class UnboundedNexmarkFn(beam.DoFn, NexmarkRestrictionProvider,
                         NexmarkWatermarkEstimatorProvider):
    """The unbounded NEXMark source: an unbounded splittable DoFn over the events.

    Input: one element per `UnboundedPart` (a block of whole timelines; the parts are
    read in parallel). Restriction: the part's emission offsets, an `OffsetRange` with
    an `OffsetRestrictionTracker`. Output: the generated events (`generator.next_event`,
    identical to the bounded source's, Beam's model objects) timestamped with their event
    time, in emission order.

    Pacing: with `rate` (events/s over all parts), a part emits its event k at
    origin + k / (its share of the rate), origin being the wall time of its first
    `process` call (kept in the watermark estimator state), or, with wall-clock event
    times (`use_wallclock_event_time`, Java's `useWallclockEventTime`), the base time:
    at `rate` = the config's event rate an event is then due at its own event time, so
    the wall time at a sink minus an output's timestamp is its latency. Each call emits what is due,
    then self-checkpoints with `tracker.defer_remainder(delay until the next event)`:
    it never sleeps (a runner that ignores the resume delay just calls back sooner and
    finds nothing or little due). Without `rate` it emits as fast as possible,
    checkpointing every `MAX_EVENTS_PER_CALL` events.

    Watermark (`NexmarkWatermarkEstimator`): the event time of the last emitted event
    minus `out_of_order_bound_ms(config)`, so no later event of the part is behind it,
    and +inf when the part is exhausted: a finite number of events ends the stream.

    The DoFn is its own restriction and watermark estimator provider (both depend on the
    config): `RestrictionParam()` and `WatermarkEstimatorParam()` without an argument
    mean the DoFn itself.
    """

    def __init__(self, config: NexmarkConfig, rate: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f'rate must be positive: {rate}')
        beam.DoFn.__init__(self)
        NexmarkRestrictionProvider.__init__(self, config)
        NexmarkWatermarkEstimatorProvider.__init__(self, config)
        self._config = config
        self._rate = rate
        self._clock = clock

    @beam.DoFn.unbounded_per_element()
    def process(self, element: tuple[int, int],
                tracker=beam.DoFn.RestrictionParam(),
                watermark_estimator=beam.DoFn.WatermarkEstimatorParam()):
        config = self._config
        part = part_of(config, element)
        restriction = tracker.current_restriction()
        start, stop = restriction.start, restriction.stop
        now = self._clock()
        rate = None
        elapsed = 0.0
        if self._rate is not None:
            rate = part_rate(self._rate, part.size, config.max_events)
            # A first call starts the clock; a resumed call whose runner lost the state
            # assumes it is on schedule.
            origin = watermark_estimator.pacing_origin(
                config.base_time / 1000.0 if config.use_wallclock_event_time
                else now - start / rate)
            elapsed = now - origin
        end, delay = pacing_step(start, stop, elapsed, rate)
        generator_configs = config.generator_configs()
        for offset in range(start, end):
            if not tracker.try_claim(offset):
                return
            generator, count = part.locate(offset)
            event = next_event(generator_configs[generator], count,
                               generator * part.block + count, generator)
            timestamp = event.timestamp
            watermark_estimator.advance(timestamp)
            yield TimestampedValue(event.event, timestamp)
        end_call(tracker, watermark_estimator, end, delay, rate,
                 lambda: self._clock() - origin)


class ReadUnboundedNexmarkEvents(beam.PTransform):
    """The NEXMark events of `config` as an unbounded stream (`UnboundedNexmarkFn`), at
    `rate` events/s over all parts or as fast as possible (None), in at most
    `num_splits` parallel parts."""

    def __init__(self, config: NexmarkConfig, rate: float | None = None,
                 num_splits: int = UNBOUNDED_SPLITS) -> None:
        super().__init__()
        self._config = config
        self._rate = rate
        self._num_splits = num_splits

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        parts = [part.element() for part in unbounded_parts(self._config, self._num_splits)]
        return (pbegin
                | 'Parts' >> beam.Create(parts)
                | 'ReadUnboundedNexmark' >> beam.ParDo(
                    UnboundedNexmarkFn(self._config, self._rate)))
