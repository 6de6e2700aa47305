"""The NEXMark event generator of Beam's Java implementation, event for event.

Mirrors `org.apache.beam.sdk.nexmark.sources.generator.Generator` and the model generators
of `...sources.generator.model`: `PersonGenerator`, `AuctionGenerator`, `BidGenerator`,
`PriceGenerator`, `StringsGenerator`, `LongGenerator`. Every event is drawn from a
`JavaRandom(event_id)` (Java: `new Random(getNextEventId())`) with the same calls in the
same order, so the events (ids, names, prices, `extra` padding, timestamps) are the ones
Java generates for the same configuration.

Events come out as Beam's Python NEXMark model objects (`nexmark_model.Person`,
`Auction`, `Bid`) with `date_time`/`expires` as Beam `Timestamp`s, the form Beam's Python
NEXMark launcher feeds its queries (`ParseJsonEventFn`, then each element timestamped
with its `date_time`); `TimestampedEvent.timestamped_value()` gives that element.

Positions. Like Java's `BoundedEventSource`/`UnboundedEventSource`, the source is split
into `num_event_generators` timelines (`GeneratorConfig.split`): timeline `g` holds a
contiguous block of event ids and emits its k-th event at event number k, so all
timelines run in parallel in event time. Position `n` (0 <= n < max_events) is the n-th
event of that concatenation: timeline `g` = the block holding `n`, `k` = `n` minus the
block's start. With `out_of_order_group_size == 1` the event id is `n`; otherwise ids are
permuted within groups as in Java. `event_at(config, n)` depends on `(config, n)` only.
Timestamps are non-decreasing along each timeline (up to the out-of-order groups), not
along positions; `wallclock_order` lists positions in emission-time order. One deliberate
difference: when num_events < num_event_generators, Java's split gives the first timelines
0 events, which its `GeneratorConfig` constructor reads as "unbounded" (0 = as many as
possible), so they never end; here they stay empty and the last timeline has all events.

Delays. Java's unbounded source, when rate limited, holds an event back by
1..occasionalDelaySec*1000 ms with probability probDelayedEvent, drawn from
`ThreadLocalRandom` (not reproducible); it changes only when the event is emitted, not
its timestamp. Here the draw is deterministic (a `JavaRandom` seeded from the event id) and
reported as `TimestampedEvent.delay_ms`; it is 0 unless `is_rate_limited`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Union

# nexmark_util first: in Beam 2.61 (the apache-beam PyFlink pins, see flink_baselines),
# importing nexmark_model first fails on a circular import through nexmark_util.
from apache_beam.testing.benchmarks.nexmark import nexmark_util  # noqa: F401
from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Auction, Bid, Person
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from benchmarks.nexmark.config import (
    AUCTION_PROPORTION,
    FIRST_AUCTION_ID,
    FIRST_CATEGORY_ID,
    FIRST_PERSON_ID,
    PERSON_PROPORTION,
    PROPORTION_DENOMINATOR,
    GeneratorConfig,
    NexmarkConfig,
)
from benchmarks.nexmark.java_random import (
    INT_MAX,
    JavaRandom,
    java_div,
    java_rem,
    java_round,
    to_int32,
)

Event = Union[Person, Auction, Bid]

# PersonGenerator / AuctionGenerator: yet-to-be-created ids a random choice may reach.
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
# Hot sellers/auctions/bidders: the first (second for bidders) of each batch of 100.
HOT_SELLER_RATIO = 100
HOT_AUCTION_RATIO = 100
HOT_BIDDER_RATIO = 100
NUM_CATEGORIES = 5
MIN_STRING_LENGTH = 3

US_STATES = ('AZ', 'CA', 'ID', 'OR', 'WA', 'WY')
US_CITIES = ('Phoenix', 'Los Angeles', 'San Francisco', 'Boise', 'Portland', 'Bend',
             'Redmond', 'Seattle', 'Kent', 'Cheyenne')
FIRST_NAMES = ('Peter', 'Paul', 'Luke', 'John', 'Saul', 'Vicky', 'Kate', 'Julie', 'Sarah',
               'Deiter', 'Walter')
LAST_NAMES = ('Shultz', 'Abrams', 'Spencer', 'White', 'Bartels', 'Walton', 'Smith', 'Jones',
              'Noris')

# Seed salt of the deterministic stand-in for Java's ThreadLocalRandom event delays.
DELAY_SALT = 0x6E65786D61726B  # "nexmark"

_ORD_A = ord('a')


# ---- LongGenerator, PriceGenerator, StringsGenerator ----

def next_long(random: JavaRandom, n: int) -> int:
    """`LongGenerator.nextLong`: a long in [0, n) (skewed above Integer.MAX_VALUE, as Java)."""
    if n < INT_MAX:
        return random.next_int(n)
    return abs(java_rem(random.next_long(), n))


def next_price(random: JavaRandom) -> int:
    """`PriceGenerator.nextPrice`: 10**(6u) * 100 cents, rounded: 100 .. 100,000,000."""
    return java_round(10.0 ** (random.next_double() * 6.0) * 100.0)


def next_string(random: JavaRandom, max_length: int) -> str:
    """`StringsGenerator.nextString`: 3..max_length-1 letters and spaces, trimmed."""
    length = MIN_STRING_LENGTH + random.next_int(max_length - MIN_STRING_LENGTH)
    chars = []
    for _ in range(length):
        if random.next_int(13) == 0:
            chars.append(' ')
        else:
            chars.append(chr(_ORD_A + random.next_int(26)))
    return ''.join(chars).strip(' ')


def next_exact_string(random: JavaRandom, length: int) -> str:
    """`StringsGenerator.nextExactString`: six characters per `nextInt()`.

    Java's `'a' + rnd % 26` with a negative `rnd` gives characters below 'a'
    (uppercase letters and `[\\]^_``), kept as is.
    """
    chars = []
    rnd = 0
    n = 0  # random characters left in rnd
    for _ in range(length):
        if n == 0:
            rnd = random.next_int()
            n = 6  # log_26(2^31)
        chars.append(chr(_ORD_A + java_rem(rnd, 26)))
        rnd = java_div(rnd, 26)
        n -= 1
    return ''.join(chars)


def next_extra(random: JavaRandom, current_size: int, desired_average_size: int) -> str:
    """`StringsGenerator.nextExtra`: padding so that the event is `desired_average_size` on
    average (uniform within +-20%)."""
    if current_size > desired_average_size:
        return ''
    desired_average_size -= current_size
    delta = to_int32(java_round(desired_average_size * 0.2))
    min_size = desired_average_size - delta
    desired_size = min_size + (0 if delta == 0 else random.next_int(2 * delta))
    return next_exact_string(random, desired_size)


# ---- PersonGenerator ----

def last_base0_person_id(event_id: int) -> int:
    """The last person id (base 0) created at `event_id`: this one if it is a person."""
    epoch = event_id // PROPORTION_DENOMINATOR
    offset = event_id % PROPORTION_DENOMINATOR
    if offset >= PERSON_PROPORTION:
        # About to generate an auction or a bid: the last person of this epoch.
        offset = PERSON_PROPORTION - 1
    return epoch * PERSON_PROPORTION + offset


def next_base0_person_id(event_id: int, random: JavaRandom, config: NexmarkConfig) -> int:
    """A random person among the active ones, plus PERSON_ID_LEAD not yet created."""
    num_people = last_base0_person_id(event_id) + 1
    active_people = min(num_people, config.num_active_people)
    n = next_long(random, active_people + PERSON_ID_LEAD)
    return num_people - active_people + n


def _next_person_name(random: JavaRandom) -> str:
    first = FIRST_NAMES[random.next_int(len(FIRST_NAMES))]
    return first + ' ' + LAST_NAMES[random.next_int(len(LAST_NAMES))]


def _next_email(random: JavaRandom) -> str:
    return next_string(random, 7) + '@' + next_string(random, 5) + '.com'


def _next_credit_card(random: JavaRandom) -> str:
    return ' '.join(f'{random.next_int(10000):04d}' for _ in range(4))


def next_person(event_id: int, random: JavaRandom, timestamp_ms: int,
                config: NexmarkConfig) -> Person:
    """`PersonGenerator.nextPerson`: the person of `event_id`."""
    person_id = last_base0_person_id(event_id) + FIRST_PERSON_ID
    name = _next_person_name(random)
    email = _next_email(random)
    credit_card = _next_credit_card(random)
    city = US_CITIES[random.next_int(len(US_CITIES))]
    state = US_STATES[random.next_int(len(US_STATES))]
    current_size = 8 + len(name) + len(email) + len(credit_card) + len(city) + len(state)
    extra = next_extra(random, current_size, config.avg_person_byte_size)
    return Person(person_id, name, email, credit_card, city, state,
                  _timestamp(timestamp_ms), extra)


# ---- AuctionGenerator ----

def last_base0_auction_id(event_id: int) -> int:
    """The last auction id (base 0) created at `event_id`: this one if it is an auction."""
    epoch = event_id // PROPORTION_DENOMINATOR
    offset = event_id % PROPORTION_DENOMINATOR
    if offset < PERSON_PROPORTION:
        # About to generate a person: the last auction of the previous epoch.
        epoch -= 1
        offset = AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:
        # About to generate a bid: the last auction of this epoch.
        offset = AUCTION_PROPORTION - 1
    else:
        # About to generate an auction.
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


def next_base0_auction_id(event_id: int, random: JavaRandom, config: NexmarkConfig) -> int:
    """A random auction likely still in flight, plus AUCTION_ID_LEAD not yet created."""
    max_auction = last_base0_auction_id(event_id)
    min_auction = max(max_auction - config.num_in_flight_auctions, 0)
    return min_auction + next_long(random, max_auction - min_auction + 1 + AUCTION_ID_LEAD)


def _next_auction_length_ms(events_count_so_far: int, random: JavaRandom, timestamp_ms: int,
                            generator_config: GeneratorConfig) -> int:
    # The time at which the auction num_in_flight_auctions ahead will be generated...
    current_event_number = generator_config.next_adjusted_event_number(events_count_so_far)
    num_events_for_auctions = ((generator_config.config.num_in_flight_auctions
                                * PROPORTION_DENOMINATOR) // AUCTION_PROPORTION)
    future_auction = generator_config.timestamp_for_event(
        current_event_number + num_events_for_auctions)
    # ... gives the average length.
    horizon_ms = future_auction - timestamp_ms
    return 1 + next_long(random, max(horizon_ms * 2, 1))


def next_auction(events_count_so_far: int, event_id: int, random: JavaRandom,
                 timestamp_ms: int, generator_config: GeneratorConfig) -> Auction:
    """`AuctionGenerator.nextAuction`: the auction of `event_id`."""
    config = generator_config.config
    auction_id = last_base0_auction_id(event_id) + FIRST_AUCTION_ID
    # P(hot seller) = 1 - 1/hot_sellers_ratio.
    if random.next_int(config.hot_sellers_ratio) > 0:
        seller = (last_base0_person_id(event_id) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
    else:
        seller = next_base0_person_id(event_id, random, config)
    seller += FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + random.next_int(NUM_CATEGORIES)
    initial_bid = next_price(random)
    expires = timestamp_ms + _next_auction_length_ms(events_count_so_far, random, timestamp_ms,
                                                     generator_config)
    name = next_string(random, 20)
    desc = next_string(random, 100)
    reserve = initial_bid + next_price(random)
    current_size = 8 + len(name) + len(desc) + 8 + 8 + 8 + 8 + 8
    extra = next_extra(random, current_size, config.avg_auction_byte_size)
    return Auction(auction_id, name, desc, initial_bid, reserve, _timestamp(timestamp_ms),
                   _timestamp(expires), seller, category, extra)


# ---- BidGenerator ----

def next_bid(event_id: int, random: JavaRandom, timestamp_ms: int,
             config: NexmarkConfig) -> Bid:
    """`BidGenerator.nextBid`: the bid of `event_id`."""
    # P(hot auction) = 1 - 1/hot_auction_ratio.
    if random.next_int(config.hot_auction_ratio) > 0:
        auction = (last_base0_auction_id(event_id) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    else:
        auction = next_base0_auction_id(event_id, random, config)
    auction += FIRST_AUCTION_ID
    # P(hot bidder) = 1 - 1/hot_bidders_ratio; the second of the batch (not a hot seller).
    if random.next_int(config.hot_bidders_ratio) > 0:
        bidder = (last_base0_person_id(event_id) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    else:
        bidder = next_base0_person_id(event_id, random, config)
    bidder += FIRST_PERSON_ID
    price = next_price(random)
    current_size = 8 + 8 + 8 + 8
    extra = next_extra(random, current_size, config.avg_bid_byte_size)
    return Bid(auction, bidder, price, _timestamp(timestamp_ms), extra)


# ---- Generator ----

def _timestamp(millis: int) -> Timestamp:
    return Timestamp(micros=millis * 1000)


@dataclass(frozen=True, eq=False)
class TimestampedEvent:
    """One generated event with its times (Java's `Generator.NextEvent`)."""

    # Position of the event in the source (see the module docstring).
    position: int
    # Java's event id: the seed of the event's data; id % 50 gives its kind.
    event_id: int
    # Timeline (generator) of the event, and its event number on that timeline.
    generator_index: int
    event_number: int
    # Event time, ms since the epoch: the element timestamp and the model's date_time.
    timestamp_ms: int
    # When to emit the event, ms after the timeline's first emission (Java's wallclock
    # timestamp minus its wallclock base time): the event number's time, before jitter.
    wallclock_offset_ms: int
    # The minimum of this and all later event times of the timeline.
    watermark_ms: int
    # Extra emission delay of a held-back (late) event; 0 unless rate limited.
    delay_ms: int
    event: Event

    @property
    def timestamp(self) -> Timestamp:
        return _timestamp(self.timestamp_ms)

    @property
    def kind(self) -> str:
        """'person', 'auction' or 'bid'."""
        return type(self.event).__name__.lower()

    def timestamped_value(self) -> TimestampedValue:
        """The element Beam's Python NEXMark queries read: the model, at its event time."""
        return TimestampedValue(self.event, self.timestamp)

    def key(self) -> tuple:
        """Everything of the event, comparable (the model classes have no equality)."""
        fields = tuple(sorted(vars(self.event).items()))
        return (self.position, self.event_id, self.generator_index, self.event_number,
                self.timestamp_ms, self.wallclock_offset_ms, self.watermark_ms, self.delay_ms,
                type(self.event).__name__, fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TimestampedEvent):
            return NotImplemented
        return self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return (f'TimestampedEvent(position={self.position}, event_id={self.event_id}, '
                f'timestamp_ms={self.timestamp_ms}, event={self.event!r})')


def event_kind(event_id: int) -> str:
    """'person', 'auction' or 'bid': the kind Java generates for `event_id`."""
    rem = event_id % PROPORTION_DENOMINATOR
    if rem < PERSON_PROPORTION:
        return 'person'
    if rem < PERSON_PROPORTION + AUCTION_PROPORTION:
        return 'auction'
    return 'bid'


def next_event(generator_config: GeneratorConfig, events_count_so_far: int,
               position: int | None = None, generator_index: int = 0) -> TimestampedEvent:
    """`Generator.nextEvent` of a generator of `generator_config` that emitted
    `events_count_so_far` events."""
    config = generator_config.config
    event_number = generator_config.next_event_number(events_count_so_far)
    adjusted_number = generator_config.next_adjusted_event_number(events_count_so_far)
    # When, in event time, the event is due (monotonic), and the time it says it has
    # (jittered within its out-of-order group).
    event_timestamp = generator_config.timestamp_for_event(event_number)
    adjusted_timestamp = generator_config.timestamp_for_event(adjusted_number)
    watermark = generator_config.timestamp_for_event(
        generator_config.next_event_number_for_watermark(events_count_so_far))
    event_id = generator_config.first_event_id + adjusted_number
    random = JavaRandom(event_id)
    rem = event_id % PROPORTION_DENOMINATOR
    event: Event
    if rem < PERSON_PROPORTION:
        event = next_person(event_id, random, adjusted_timestamp, config)
    elif rem < PERSON_PROPORTION + AUCTION_PROPORTION:
        event = next_auction(events_count_so_far, event_id, random, adjusted_timestamp,
                             generator_config)
    else:
        event = next_bid(event_id, random, adjusted_timestamp, config)
    return TimestampedEvent(
        position=event_id if position is None else position,
        event_id=event_id,
        generator_index=generator_index,
        event_number=event_number,
        timestamp_ms=adjusted_timestamp,
        wallclock_offset_ms=event_timestamp - generator_config.base_time,
        watermark_ms=watermark,
        delay_ms=delay_ms(config, event_id),
        event=event)


def delay_ms(config: NexmarkConfig, event_id: int) -> int:
    """Emission delay of a held-back event: 0, or 1..occasional_delay_sec*1000 with
    probability prob_delayed_event when rate limited (deterministic stand-in for Java's
    `ThreadLocalRandom` draw in `UnboundedEventSource`)."""
    if not (config.is_rate_limited and config.prob_delayed_event > 0.0
            and config.occasional_delay_sec > 0):
        return 0
    random = JavaRandom(_mix64(event_id ^ DELAY_SALT))
    if random.next_double() >= config.prob_delayed_event:
        return 0
    return next_long(random, config.occasional_delay_sec * 1000) + 1


def _mix64(value: int) -> int:
    """SplitMix64's finalizer: the first draws of `java.util.Random`s with nearby seeds are
    nearly equal, so consecutive event ids are scattered before seeding."""
    value &= 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return value ^ (value >> 31)


def locate(config: NexmarkConfig, n: int) -> tuple[int, int]:
    """(timeline index, events emitted before it on that timeline) of position `n`."""
    if not 0 <= n < config.max_events:
        raise IndexError(f'position {n} outside [0, {config.max_events})')
    num_generators = config.num_event_generators
    if num_generators == 1:
        return 0, n
    block = config.max_events // num_generators
    index = num_generators - 1 if block == 0 else min(n // block, num_generators - 1)
    return index, n - index * block


def event_at(config: NexmarkConfig, n: int) -> TimestampedEvent:
    """The event at position `n` (0 <= n < config.max_events)."""
    index, count = locate(config, n)
    return next_event(config.generator_configs()[index], count, n, index)


def events(config: NexmarkConfig, start: int = 0,
           stop: int | None = None) -> Iterator[TimestampedEvent]:
    """The events at positions [start, stop) in position order (stop None: max_events)."""
    stop = config.max_events if stop is None else min(stop, config.max_events)
    if start >= stop:
        return
    generator_configs = config.generator_configs()
    index, first_count = locate(config, start)
    n = start
    while n < stop:
        generator_config = generator_configs[index]
        last_count = min(generator_config.max_events, first_count + stop - n)
        for count in range(first_count, last_count):
            yield next_event(generator_config, count, n, index)
            n += 1
        index += 1
        first_count = 0


def wallclock_order(config: NexmarkConfig) -> Iterator[int]:
    """All positions in the order Java's parallel generators emit them: by event number
    on the timelines (so by emission time), then by timeline."""
    generator_configs = config.generator_configs()
    starts = []
    position = 0
    for generator_config in generator_configs:
        starts.append(position)
        position += generator_config.max_events
    longest = max(generator_config.max_events for generator_config in generator_configs)
    for count in range(longest):
        for start, generator_config in zip(starts, generator_configs, strict=True):
            if count < generator_config.max_events:
                yield start + count
