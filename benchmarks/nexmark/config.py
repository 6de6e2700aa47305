"""NEXMark configuration: Beam's Java `NexmarkConfiguration` and `GeneratorConfig`.

`NexmarkConfig` holds the fields of Java's `org.apache.beam.sdk.nexmark.NexmarkConfiguration`
that shape the generated events and the queries, in snake_case, with Java's defaults
(100,000 events, 100 generators, 10,000 events/s, 1 000 active people, 100 in-flight
auctions, average sizes 200/500/100 bytes, hot ratios 2/4/4, ...). Two differences:

* `rate_shape` defaults to `SQUARE` (Java's default is `SINE`). With the default
  `first_event_rate == next_event_rate` both shapes give the same single inter-event
  delay, so the events are the same; the shapes differ only when the rates differ.
* `base_time_ms`: Java's `NexmarkUtils.standardGeneratorConfig` uses the fixed
  `BASE_TIME` (2015-07-15T00:00:00Z) unless `useWallclockEventTime`, then the wall
  clock when the configuration is made. Here it is a field: `None` resolves the same
  way when the `NexmarkConfig` is made, and the resolved value travels with it, so
  every worker sees the same event times.

`GeneratorConfig` mirrors `org.apache.beam.sdk.nexmark.sources.generator.GeneratorConfig`:
the inter-event delays of the rate shape (`NexmarkUtils.RateShape.interEventDelayUs`,
`RateUnit.rateToPeriodUs`, `stepLengthSec`), the epoch of a multi-step shape, the event
timestamp of an event number (`timestampAndInterEventDelayUsForEvent`), the out-of-order
permutation (`nextAdjustedEventNumber`, `nextEventNumberForWatermark`) and `split(n)`,
which Java's `BoundedEventSource`/`UnboundedEventSource` apply with `numEventGenerators`:
each generator gets a contiguous block of event ids but its own timeline starting at
event number 0 (parallel timelines), so the whole source emits `first_event_rate` events
per second of event time.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.nexmark.java_random import LONG_MAX, java_round, to_int32

# GeneratorConfig's constants: ids start high so that small runs still find matches.
FIRST_AUCTION_ID = 1000
FIRST_PERSON_ID = 1000
FIRST_CATEGORY_ID = 10
# Proportions of people / auctions / bids: event id % 50 picks the kind.
PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
BID_PROPORTION = 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION

# NexmarkUtils.BASE_TIME: Instant.parse("2015-07-15T00:00:00.000Z").getMillis().
BASE_TIME_MS = 1_436_918_400_000

RATE_SHAPES = ('SQUARE', 'SINE')
# RateUnit: microseconds per unit.
RATE_UNITS = {'PER_SECOND': 1_000_000, 'PER_MINUTE': 60_000_000}
# RateShape.N: steps approximating the sine wave.
SINE_STEPS = 10

# Beam's Python launcher passes this in its query arguments; no query reads it.
NUM_MAX_WORKERS = 5


def rate_to_period_us(rate: int, rate_unit: str = 'PER_SECOND') -> int:
    """`RateUnit.rateToPeriodUs`: microseconds between events at `rate`, rounded."""
    us_per_unit = RATE_UNITS[rate_unit]
    return (us_per_unit + rate // 2) // rate


def inter_event_delays_us(
        rate_shape: str, first_rate: int, next_rate: int, rate_unit: str,
        num_generators: int) -> tuple[int, ...]:
    """`RateShape.interEventDelayUs(firstRate, nextRate, unit, numGenerators)`.

    The delay of each step, per generator (the overall rate is shared by the
    `num_generators` parallel timelines, hence the multiplication).
    """
    if first_rate == next_rate:
        return (rate_to_period_us(first_rate, rate_unit) * num_generators,)
    if rate_shape == 'SQUARE':
        return (rate_to_period_us(first_rate, rate_unit) * num_generators,
                rate_to_period_us(next_rate, rate_unit) * num_generators)
    mid = (first_rate + next_rate) / 2.0
    amp = (first_rate - next_rate) / 2.0  # may be negative
    delays = []
    for i in range(SINE_STEPS):
        r = (2.0 * math.pi * i) / SINE_STEPS
        rate = mid + amp * math.cos(r)
        delays.append(rate_to_period_us(java_round(rate), rate_unit) * num_generators)
    return tuple(delays)


def step_length_sec(rate_shape: str, rate_period_sec: int) -> int:
    """`RateShape.stepLengthSec`: seconds per step, to cycle every `rate_period_sec`."""
    n = 2 if rate_shape == 'SQUARE' else SINE_STEPS
    return (rate_period_sec + n - 1) // n


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ('1', 'true', 'yes', 'on'):
        return True
    if lowered in ('0', 'false', 'no', 'off'):
        return False
    raise argparse.ArgumentTypeError(f'not a boolean: {text!r}')


@dataclass(frozen=True)
class NexmarkConfig:
    """The event and query parameters of Java's `NexmarkConfiguration` (its defaults)."""

    # Number of events; 0 = as many as possible (Java: Long.MAX_VALUE scaled down).
    num_events: int = 100_000
    # Generators, each with its own timeline (sharing the overall rate).
    num_event_generators: int = 100
    # Shape of the event rate curve: SQUARE or SINE (Java's default: SINE, see above).
    rate_shape: str = 'SQUARE'
    # Initial and next overall event rate, in rate_unit.
    first_event_rate: int = 10_000
    next_event_rate: int = 10_000
    rate_unit: str = 'PER_SECOND'
    # Overall period of the rate shape, in seconds.
    rate_period_sec: int = 600
    # Streaming: emit events only when due according to their timestamp.
    is_rate_limited: bool = False
    # Event times from the wall clock (base_time_ms = now) instead of BASE_TIME.
    use_wallclock_event_time: bool = False
    # Time of the first event, ms since the epoch; None = BASE_TIME or now (see above).
    base_time_ms: int | None = None
    # Average sizes of the events, in bytes (the `extra` field pads up to them).
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    # Ratio of bids for hot auctions, auctions of hot sellers, bids of hot bidders.
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    # Window size and sliding period, seconds (queries 3, 4, 5, 7, 8, 10-12).
    window_size_sec: int = 10
    window_period_sec: int = 5
    # Seconds to hold the watermark back by.
    watermark_holdback_sec: int = 0
    # Auctions in flight at any time, per generator; people active for auctions/bids.
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    # Query 2 keeps bids on every auction_skip'th auction.
    auction_skip: int = 123
    # Fanout of the global combines (queries 4, 5, 7).
    fanout: int = 5
    # Query 3: seconds a person waits in state for its auctions.
    max_auctions_waiting_time: int = 600
    # Streaming and rate limited only: an event is held back by up to occasional_delay_sec
    # with probability prob_delayed_event.
    occasional_delay_sec: int = 3
    prob_delayed_event: float = 0.1
    # Query 10: events per log file.
    max_log_events: int = 100_000
    # Events per out-of-order group; 1 = in order.
    out_of_order_group_size: int = 1

    def __post_init__(self) -> None:
        if self.base_time_ms is None:
            base = int(time.time() * 1000) if self.use_wallclock_event_time else BASE_TIME_MS
            object.__setattr__(self, 'base_time_ms', base)
        if self.rate_shape not in RATE_SHAPES:
            raise ValueError(f'rate_shape must be one of {RATE_SHAPES}: {self.rate_shape!r}')
        if self.rate_unit not in RATE_UNITS:
            raise ValueError(f'rate_unit must be one of {tuple(RATE_UNITS)}: {self.rate_unit!r}')
        for name in ('num_event_generators', 'first_event_rate', 'next_event_rate',
                     'out_of_order_group_size', 'hot_auction_ratio', 'hot_sellers_ratio',
                     'hot_bidders_ratio', 'num_active_people', 'num_in_flight_auctions'):
            if getattr(self, name) <= 0:
                raise ValueError(f'{name} must be positive: {getattr(self, name)}')
        if self.num_events < 0:
            raise ValueError(f'num_events must be >= 0: {self.num_events}')

    # ---- derived values (GeneratorConfig) ----

    @property
    def base_time(self) -> int:
        """Time of the first event of every timeline, ms since the epoch."""
        assert self.base_time_ms is not None  # resolved in __post_init__
        return self.base_time_ms

    @functools.cached_property
    def inter_event_delay_us(self) -> tuple[int, ...]:
        """Per-generator delay between events of each rate step, microseconds."""
        return inter_event_delays_us(self.rate_shape, self.first_event_rate,
                                     self.next_event_rate, self.rate_unit,
                                     self.num_event_generators)

    @property
    def step_length_sec(self) -> int:
        """Seconds before the inter-event delay moves to the next step."""
        return step_length_sec(self.rate_shape, self.rate_period_sec)

    @functools.cached_property
    def _epoch(self) -> tuple[int, int]:
        events_per_epoch = 0
        epoch_period_ms = 0
        delays = self.inter_event_delay_us
        if len(delays) > 1:
            for delay in delays:
                events_in_step = (self.step_length_sec * 1_000_000) // delay
                events_per_epoch += events_in_step
                epoch_period_ms += (events_in_step * delay) // 1000
        return events_per_epoch, epoch_period_ms

    @property
    def events_per_epoch(self) -> int:
        """Events of one cycle through all rate steps (0 with a single step)."""
        return self._epoch[0]

    @property
    def epoch_period_ms(self) -> int:
        """Event time of one cycle through all rate steps, ms (0 with a single step)."""
        return self._epoch[1]

    @property
    def max_events(self) -> int:
        """Events of the whole source: num_events, or Java's bound when it is 0."""
        if self.num_events:
            return self.num_events
        biggest = max(self.avg_person_byte_size, self.avg_auction_byte_size,
                      self.avg_bid_byte_size)
        # Java: Long.MAX_VALUE / (PROPORTION_DENOMINATOR * max(...)), an int product.
        return LONG_MAX // to_int32(PROPORTION_DENOMINATOR * biggest)

    def generator_config(self) -> GeneratorConfig:
        """`NexmarkUtils.standardGeneratorConfig`: all events, one timeline."""
        return GeneratorConfig(self, first_event_id=0, max_events=self.max_events,
                               first_event_number=0)

    def generator_configs(self) -> tuple[GeneratorConfig, ...]:
        """The `num_event_generators` parallel timelines of Java's event sources."""
        return _split_cached(self)

    def query_args(self) -> dict[str, Any]:
        """The `metadata` dict Beam's Python NEXMark queries read (as its launcher builds it)."""
        return {
            'auction_skip': self.auction_skip,
            'window_size_sec': self.window_size_sec,
            'window_period_sec': self.window_period_sec,
            'fanout': self.fanout,
            'num_max_workers': NUM_MAX_WORKERS,
            'max_log_events': self.max_log_events,
            'occasional_delay_sec': self.occasional_delay_sec,
            'max_auction_waiting_time': self.max_auctions_waiting_time,
        }

    # ---- construction from command lines and mappings ----

    def replace(self, **changes: Any) -> NexmarkConfig:
        """A copy with `changes` (a new wall-clock base time only if base_time_ms=None)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one `--<field>` option per field (default None: keep the config's default)."""
        for field in dataclasses.fields(cls):
            default = field.default
            if field.name == 'base_time_ms':
                kind: Any = int
            elif isinstance(default, bool):
                kind = _parse_bool
            elif isinstance(default, float):
                kind = float
            elif isinstance(default, int):
                kind = int
            else:
                kind = str
            kwargs: dict[str, Any] = {'type': kind, 'default': None,
                                      'help': f'NEXMark {field.name} (default {default})'}
            if field.name == 'rate_shape':
                kwargs['choices'] = RATE_SHAPES
            elif field.name == 'rate_unit':
                kwargs['choices'] = tuple(RATE_UNITS)
            parser.add_argument(f'--{field.name}', **kwargs)
        return parser

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | argparse.Namespace) -> NexmarkConfig:
        """A config from the fields present (and not None) in `values`; others ignored."""
        if isinstance(values, argparse.Namespace):
            values = vars(values)
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> tuple[NexmarkConfig, list[str]]:
        """Parse `--<field>=value` options out of `argv`; return the config and the rest."""
        parser = cls.add_arguments(argparse.ArgumentParser(add_help=False))
        known, rest = parser.parse_known_args(argv)
        return cls.from_mapping(known), rest


@functools.lru_cache(maxsize=32)
def _split_cached(config: NexmarkConfig) -> tuple[GeneratorConfig, ...]:
    return tuple(config.generator_config().split(config.num_event_generators))


@dataclass(frozen=True)
class GeneratorConfig:
    """Java's `GeneratorConfig`: one timeline of events of a `NexmarkConfig`.

    Event ids are unique over all timelines and seed each event's data; event numbers
    (from `first_event_number`) place the events on the timeline's clock.
    """

    config: NexmarkConfig
    # Id of the first event of this timeline.
    first_event_id: int
    # Events of this timeline.
    max_events: int
    # Event number of the first event (a serial split continues its parent's clock).
    first_event_number: int

    @property
    def base_time(self) -> int:
        return self.config.base_time

    def split(self, n: int) -> list[GeneratorConfig]:
        """`split(n)`: n timelines of contiguous id blocks, all from this event number."""
        if n == 1:
            return [self]
        results = []
        sub_max_events = self.max_events // n
        sub_first_event_id = self.first_event_id
        for i in range(n):
            if i == n - 1:
                # Don't lose any events to round-down.
                sub_max_events = self.max_events - sub_max_events * (n - 1)
            results.append(self.copy_with(sub_first_event_id, sub_max_events,
                                          self.first_event_number))
            sub_first_event_id += sub_max_events
        return results

    def copy_with(self, first_event_id: int, max_events: int,
                  first_event_number: int) -> GeneratorConfig:
        return GeneratorConfig(self.config, first_event_id, max_events, first_event_number)

    def split_at_event_id(self, event_id: int) -> tuple[GeneratorConfig, GeneratorConfig]:
        """`Generator.splitAtEventId`: (events before `event_id`, the rest), one timeline."""
        new_max_events = event_id - (self.first_event_id + self.first_event_number)
        head = self.copy_with(self.first_event_id, new_max_events, self.first_event_number)
        rest = self.copy_with(self.first_event_id, self.max_events - new_max_events,
                              self.first_event_number + new_max_events)
        return head, rest

    @property
    def start_event_id(self) -> int:
        return self.first_event_id + self.first_event_number

    @property
    def stop_event_id(self) -> int:
        return self.first_event_id + self.first_event_number + self.max_events

    def next_event_number(self, num_events: int) -> int:
        """Event number of the next event after `num_events` emitted ones."""
        return self.first_event_number + num_events

    def next_adjusted_event_number(self, num_events: int) -> int:
        """`nextAdjustedEventNumber`: the next event number, permuted within its group."""
        n = self.config.out_of_order_group_size
        event_number = self.next_event_number(num_events)
        base = (event_number // n) * n
        offset = (event_number * 953) % n
        return base + offset

    def next_event_number_for_watermark(self, num_events: int) -> int:
        """Event number whose time is a watermark for the next event (its group's first)."""
        n = self.config.out_of_order_group_size
        event_number = self.next_event_number(num_events)
        return (event_number // n) * n

    def timestamp_and_inter_event_delay_us_for_event(self, event_number: int) -> tuple[int, int]:
        """Event time (ms since the epoch) of `event_number`, and the current delay (us)."""
        config = self.config
        delays = config.inter_event_delay_us
        if len(delays) == 1:
            return config.base_time + (event_number * delays[0]) // 1000, delays[0]
        events_per_epoch = config.events_per_epoch
        epoch = event_number // events_per_epoch
        n = event_number % events_per_epoch
        offset_in_epoch_ms = 0
        step_us = config.step_length_sec * 1_000_000
        for delay in delays:
            events_in_step = step_us // delay
            if n < events_in_step:
                timestamp = (config.base_time + epoch * config.epoch_period_ms
                             + offset_in_epoch_ms + (n * delay) // 1000)
                return timestamp, delay
            n -= events_in_step
            offset_in_epoch_ms += (events_in_step * delay) // 1000
        raise AssertionError('internal events_per_epoch incorrect')  # unreachable

    def timestamp_for_event(self, event_number: int) -> int:
        return self.timestamp_and_inter_event_delay_us_for_event(event_number)[0]

    def estimated_bytes_for_events(self, num_events: int) -> int:
        """`estimatedBytesForEvents`: expected bytes of `num_events` events."""
        config = self.config
        return ((num_events * PERSON_PROPORTION) // PROPORTION_DENOMINATOR
                * config.avg_person_byte_size
                + (num_events * AUCTION_PROPORTION) // PROPORTION_DENOMINATOR
                * config.avg_auction_byte_size
                + (num_events * BID_PROPORTION) // PROPORTION_DENOMINATOR
                * config.avg_bid_byte_size)
