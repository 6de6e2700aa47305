"""Native PySpark baselines of NEXMark Q0, Q1, Q2, Q3, Q5 and Q7 (RDD API, batch).

The "how much does Beam-on-Spark cost over Spark itself" figure: hand-written PySpark
programs computing what Beam's Python queries
(`apache_beam.testing.benchmarks.nexmark.queries.queryN`) compute, over the same
events. The events are generated inside Spark tasks, by position ranges
(`sc.parallelize(ranges, n).flatMap(lambda r: events(config, *r))`), never on the driver,
or read from the launcher's `--input` file (`sc.textFile`, each line parsed as Beam's
launcher parses it, `event_file`).

Each program returns its output as the launcher's canonical lines
(`capture.output_line(element, window, timestamp)`), the lines the launcher writes for
Beam's output of the same query, so `verdicts.compare_outputs` checks them against any
Beam runner's output. Windows and output timestamps are the ones Beam's DirectRunner
(FnApiRunner) gives, including its millisecond timestamps: the FnApiRunner encodes
elements between stages with the WindowedValue coder, which carries timestamps in ms,
so an end-of-window timestamp (`window.max_timestamp()`, end - 1 us) comes out as
end - 1 ms (`_coder_ms`). All six queries are compared exactly (element, window and
timestamp); none needs a content-only comparison.

* Q0 (pass-through): every event encoded and decoded with its model `CODER`, as Beam's
  `RoundTripFn`; global window, event timestamp.
* Q1 (currency conversion): bids with `price * 0.89` (Beam's `USD_TO_EURO`; a float,
  not an integer division); global window, event timestamp.
* Q2 (selection): bids with `auction % auction_skip == 0`, as
  `{'auction_id': ..., 'price': ...}`; global window, event timestamp.
* Q3 (local item suggestion): persons in OR/ID/CA joined on `seller == id` with the
  auctions of category 10, as `{'name', 'city', 'state', 'auction_id'}`. Beam's query
  windows into the global window with a `Repeatedly(AfterCount(30))` discarding trigger,
  co-groups by seller id and joins in a stateful DoFn. Its batch output on Beam's Python
  runners is NOT the full join: a batch GroupByKey hands all of a key's elements to the
  trigger at once, so a key's pane fires (with all its elements) only when the key has at
  least 30 elements (filtered persons + auctions), and the rest of a key that never
  reaches 30 is dropped when the global window ends (Python's trigger driver emits no
  final pane for an unsatisfied `AfterCount`). The baseline reproduces that
  (`Q3_PANE_COUNT`): the inner join restricted to seller ids with >= 30 grouped
  elements. With that, the stateful join (auctions wait for their seller; a person is
  kept for `max_auction_waiting_time` by an event-time timer that cannot fire before
  the input ends in batch) emits every pair of a fired key exactly once. Output in the
  global window at its end-of-window timestamp (GBK output, END_OF_WINDOW),
  `GlobalWindow().max_timestamp()` in ms. Measured on DirectRunner: at 30,000 events 69
  of the 105 joinable pairs come out, all from the two sellers with >= 30 elements.
* Q5 (hot items): bids in sliding windows of `window_size_sec` every
  `window_period_sec` (Beam's `SlidingWindows` assignment), count per auction and
  window, and per window every auction with the highest count, as
  `{'auction_id': ..., 'num': ...}`, at the end-of-window timestamp.
* Q7 (highest bid): bids in fixed windows of `window_size_sec`; per window the bids
  whose price is the window's maximum, with their own timestamps (Beam's side-input
  filter keeps the element timestamp). One shuffle: per window, the maximum price and
  the bids that have it.

`run_baseline(query, config, spark)` runs one; `python -m benchmarks.nexmark` runs them
as the `SparkNative` rows with `--native spark`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Auction, Bid, Person
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp

from benchmarks.nexmark.capture import output_line
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.event_file import parse_line
from benchmarks.nexmark.generator import TimestampedEvent, events

BASELINE_QUERIES = (0, 1, 2, 3, 5, 7)
NATIVE_RUNNER = 'SparkNative'
# Beam's query1.USD_TO_EURO.
USD_TO_EURO = 0.89
# Beam's query3: persons of these states, auctions of this category.
Q3_STATES = ('OR', 'ID', 'CA')
Q3_CATEGORY = 10
# Beam's query3 `num_events_in_pane` (the AfterCount of its trigger).
Q3_PANE_COUNT = 30


def _coder_ms(timestamp: Timestamp) -> Timestamp:
    """`timestamp` as Beam's WindowedValue coder gives it back: floored to ms."""
    return Timestamp(micros=timestamp.micros // 1000 * 1000)


def _window(start_ms: int, size_ms: int) -> IntervalWindow:
    return IntervalWindow(Timestamp(micros=start_ms * 1000),
                          Timestamp(micros=(start_ms + size_ms) * 1000))


def _end_of_window(window: Any) -> Timestamp:
    return _coder_ms(window.max_timestamp())


# ---------------------------------------------------------------- events


def position_ranges(config: NexmarkConfig, num_slices: int) -> list[tuple[int, int]]:
    """[start, stop) position ranges covering the config's events in `num_slices` parts."""
    total = config.max_events
    num_slices = max(1, min(num_slices, total))
    bounds = [total * i // num_slices for i in range(num_slices + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if a < b]


def event_rdd(sc: Any, config: NexmarkConfig, num_slices: int | None = None,
              input_path: str | None = None) -> Any:
    """An RDD of `TimestampedEvent`s, generated in the tasks by position ranges, or of
    the events of the JSON-lines file `input_path` (`event_file`)."""
    slices = num_slices or max(2, 4 * sc.defaultParallelism)
    if input_path is not None:
        return sc.textFile(input_path, slices).map(parse_line)
    ranges = position_ranges(config, slices)
    return sc.parallelize(ranges, len(ranges)).flatMap(lambda r: events(config, r[0], r[1]))


# ---------------------------------------------------------------- queries


def query0(rdd: Any, config: NexmarkConfig) -> Any:
    def round_trip(e: TimestampedEvent) -> str:
        coder = e.event.CODER
        return output_line(coder.decode(coder.encode(e.event)), GlobalWindow(), e.timestamp)
    return rdd.map(round_trip)


def query1(rdd: Any, config: NexmarkConfig) -> Any:
    def to_euro(e: TimestampedEvent) -> str:
        b = e.event
        return output_line(Bid(b.auction, b.bidder, b.price * USD_TO_EURO, b.date_time,
                               b.extra), GlobalWindow(), e.timestamp)
    return rdd.filter(lambda e: isinstance(e.event, Bid)).map(to_euro)


def query2(rdd: Any, config: NexmarkConfig) -> Any:
    skip = config.auction_skip
    return (rdd.filter(lambda e: isinstance(e.event, Bid) and e.event.auction % skip == 0)
            .map(lambda e: output_line({'auction_id': e.event.auction,
                                        'price': e.event.price},
                                       GlobalWindow(), e.timestamp)))


def query3(rdd: Any, config: NexmarkConfig) -> Any:
    def keyed(e: TimestampedEvent) -> Iterator[tuple[int, tuple]]:
        x = e.event
        if isinstance(x, Person) and x.state in Q3_STATES:
            yield x.id, ('P', x.name, x.city, x.state)
        elif isinstance(x, Auction) and x.category == Q3_CATEGORY:
            yield x.seller, ('A', x.id)

    timestamp = _end_of_window(GlobalWindow())

    def join(group: tuple[int, Iterable[tuple]]) -> Iterator[str]:
        records = list(group[1])
        if len(records) < Q3_PANE_COUNT:  # the key's pane never fires (see above)
            return
        persons = [r for r in records if r[0] == 'P']
        if not persons:
            return
        _, name, city, state = persons[0]  # person ids are unique
        for r in records:
            if r[0] == 'A':
                yield output_line({'name': name, 'city': city, 'state': state,
                                   'auction_id': r[1]}, GlobalWindow(), timestamp)
    return rdd.flatMap(keyed).groupByKey().flatMap(join)


def query5(rdd: Any, config: NexmarkConfig) -> Any:
    size_ms = config.window_size_sec * 1000
    period_ms = config.window_period_sec * 1000

    def windows(e: TimestampedEvent) -> Iterator[tuple[tuple[int, int], int]]:
        # Beam's SlidingWindows.assign (offset 0): starts t - t % period, stepping back by
        # period while the window still contains t.
        t = e.timestamp_ms
        start = t - t % period_ms
        while start > t - size_ms:
            yield (start, e.event.auction), 1
            start -= period_ms

    def hottest(a: tuple[int, list[int]], b: tuple[int, list[int]]) -> tuple[int, list[int]]:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return a[0], a[1] + b[1]

    def lines(item: tuple[int, tuple[int, list[int]]]) -> Iterator[str]:
        start, (count, auctions) = item
        window = _window(start, size_ms)
        for auction in auctions:
            yield output_line({'auction_id': auction, 'num': count}, window,
                              _end_of_window(window))
    return (rdd.filter(lambda e: isinstance(e.event, Bid))
            .flatMap(windows)
            .reduceByKey(lambda a, b: a + b)
            .map(lambda kv: (kv[0][0], (kv[1], [kv[0][1]])))
            .reduceByKey(hottest)
            .flatMap(lines))


def query7(rdd: Any, config: NexmarkConfig) -> Any:
    size_ms = config.window_size_sec * 1000

    def keyed(e: TimestampedEvent) -> tuple[int, tuple[int, list[tuple[Bid, int]]]]:
        t = e.timestamp_ms
        return t - t % size_ms, (e.event.price, [(e.event, t)])

    def highest(a: tuple[int, list], b: tuple[int, list]) -> tuple[int, list]:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return a[0], a[1] + b[1]

    def lines(item: tuple[int, tuple[int, list[tuple[Bid, int]]]]) -> Iterator[str]:
        start, (_, bids) = item
        window = _window(start, size_ms)
        for bid, t in bids:
            yield output_line(bid, window, Timestamp(micros=t * 1000))
    return (rdd.filter(lambda e: isinstance(e.event, Bid))
            .map(keyed)
            .reduceByKey(highest)
            .flatMap(lines))


QUERIES: dict[int, Callable[[Any, NexmarkConfig], Any]] = {
    0: query0, 1: query1, 2: query2, 3: query3, 5: query5, 7: query7}


def run_baseline(query: int, config: NexmarkConfig, spark: Any,
                 num_slices: int | None = None, input_path: str | None = None
                 ) -> list[str]:
    """Run the native baseline of `query` on `spark` (SparkSession or SparkContext) over
    the generated events or those of the file `input_path`; its output as sorted
    canonical lines."""
    if query not in QUERIES:
        raise ValueError(f'no native Spark baseline for Q{query} (have {BASELINE_QUERIES})')
    sc = getattr(spark, 'sparkContext', spark)
    return sorted(QUERIES[query](event_rdd(sc, config, num_slices, input_path),
                                 config).collect())


def spark_session(master: str = 'local[*]') -> Any:
    """A SparkSession for a baseline run (the launcher's `SparkNative` child)."""
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master(master).appName('nexmark-spark-native')
               .config('spark.ui.showConsoleProgress', 'false').getOrCreate())
    session.sparkContext.setLogLevel('ERROR')
    return session
