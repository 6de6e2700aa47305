"""NEXMark Q0, Q1, Q2, Q3, Q5, Q7, Q8 on PyFlink's Python DataStream API (`flink_streaming
--variant=datastream`): lines parsed by `json.loads` in Python, timestamps and a bounded
out-of-orderness watermark, Python event-time windows and keyed process functions,
mirroring `flink_baselines` (and Beam's queries) so the outputs equal Beam's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.flink_baselines import record  # the records of the batch baselines
from benchmarks.nexmark.flink_stream_io import (
    END,
    EVENT,
    PRIME,
    ParseLine,
    event_kind,
    line_stream,
    model_fields,
    primer_lines,
    to_sink,
    watermark_strategy,
)

try:  # only the PyFlink virtualenv has pyflink; the definitions below need its base classes
    from pyflink.datastream.functions import (
        AggregateFunction,
        KeyedProcessFunction,
        ProcessWindowFunction,
    )
    from pyflink.datastream.state import ValueStateDescriptor
except ImportError:  # pragma: no cover - outside the venv only the helpers are importable
    AggregateFunction = KeyedProcessFunction = ProcessWindowFunction = object
    ValueStateDescriptor = None

def query0(events: Any, config: NexmarkConfig) -> Any:
    def round_trip(e: tuple[int, bool, Any]) -> dict[str, Any]:
        from benchmarks.nexmark.flink_baselines import model_element
        from benchmarks.nexmark.flink_baselines import model_fields as beam_fields
        coder = e[2].CODER  # Beam's query0: through the model's coder and back
        model = coder.decode(coder.encode(e[2]))
        return record(model_element(type(model).__name__, beam_fields(model)), None,
                      e[0] * 1000)
    return events.map(round_trip)


def query1(events: Any, config: NexmarkConfig) -> Any:
    from benchmarks.nexmark.flink_baselines import USD_TO_EURO

    def to_euro(e: tuple[int, bool, dict[str, Any]]) -> dict[str, Any]:
        fields = model_fields(e[2])
        fields['price'] = fields['price'] * USD_TO_EURO
        return record({'model': 'Bid', 'fields': fields}, None, e[0] * 1000)
    return events.filter(lambda e: 'bidder' in e[2]).map(to_euro)


def query2(events: Any, config: NexmarkConfig) -> Any:
    skip = config.auction_skip
    return (events.filter(lambda e: 'bidder' in e[2] and e[2]['auction'] % skip == 0)
            .map(lambda e: record({'dict': {'auction_id': e[2]['auction'],
                                            'price': e[2]['price']}}, None, e[0] * 1000)))


def query3(events: Any, config: NexmarkConfig) -> Any:
    from benchmarks.nexmark.flink_baselines import Q3_CATEGORY, Q3_STATES

    def keyed(e: tuple[int, bool, dict[str, Any]]) -> Iterator[tuple[int, tuple]]:
        x = e[2]
        kind = event_kind(x)
        if kind == 'Person' and x['state'] in Q3_STATES:
            yield x['id'], ('P', x['name'], x['city'], x['state'], x['dateTime'])
        elif kind == 'Auction' and x['category'] == Q3_CATEGORY:
            yield x['seller'], ('A', x['id'])
    return (events.flat_map(keyed).key_by(lambda kv: kv[0])
            .process(Query3Join(config.max_auctions_waiting_time * 1000)))


class Query3Join(KeyedProcessFunction):
    """Q3 keyed by seller (person) id, as Beam's query3 runs in streaming: its
    `Repeatedly(AfterCount(30))` panes fire each time 30 more of the key's elements
    arrived (what arrived after the last firing never fires: `verdicts` names that), and
    each pane goes through Beam's `JoinFn`: a stored person joins the pane's auctions;
    else the pane's first person joins the pending and the pane's auctions and is kept
    for `max_wait_ms` of event time; else the auctions wait."""

    def __init__(self, max_wait_ms: int) -> None:
        self._max_wait_ms = max_wait_ms

    def open(self, runtime_context: Any) -> None:
        def state(name: str) -> Any:
            return runtime_context.get_state(ValueStateDescriptor(name, _pickled()))
        self._pane, self._person, self._pending = state('pane'), state('person'), state('pending')

    def process_element(self, value: tuple[int, tuple], ctx: Any) -> Iterator[dict[str, Any]]:
        from benchmarks.nexmark.flink_baselines import Q3_PANE_COUNT
        pane = (self._pane.value() or []) + [value[1]]
        if len(pane) < Q3_PANE_COUNT:
            self._pane.update(pane)
            return
        self._pane.clear()
        auctions = [x[1] for x in pane if x[0] == 'A']
        person = self._person.value()
        if person is None:
            persons = [x for x in pane if x[0] == 'P']
            if not persons:
                self._pending.update((self._pending.value() or []) + auctions)
                return
            person = persons[0]
            auctions = (self._pending.value() or []) + auctions
            self._pending.clear()
            self._person.update(person)
            ctx.timer_service().register_event_time_timer(person[4] + self._max_wait_ms)
        _, name, city, state, _ = person
        for auction in auctions:
            yield record({'dict': {'name': name, 'city': city, 'state': state,
                                   'auction_id': auction}}, None, 'end')

    def on_timer(self, timestamp: int, ctx: Any) -> Iterator[Any]:
        self._person.clear()  # Beam's JoinFn forgets the person after max_wait
        yield from ()


class CountBids(AggregateFunction):
    """Q5: the number of bids (of one auction in one window)."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


class WithWindow(ProcessWindowFunction):
    """Q5: (window start, end, auction, count) of a window's count."""

    def process(self, key: int, context: Any, counts: Any) -> Iterator[tuple]:
        window = context.window()
        for count in counts:
            yield window.start, window.end, key, count


class HottestAuctions(KeyedProcessFunction):
    """Q5, keyed by window start: the auctions with the most bids, when the watermark
    passes the window (its counts are stamped with the window's last ms)."""

    def open(self, runtime_context: Any) -> None:
        self._best = runtime_context.get_state(ValueStateDescriptor('best', _pickled()))

    def process_element(self, value: tuple, ctx: Any) -> Iterator[Any]:
        _, end, auction, count = value
        best = self._best.value()
        if best is None:
            ctx.timer_service().register_event_time_timer(end - 1)
            best = (end, count, [auction])
        elif count > best[1]:
            best = (end, count, [auction])
        elif count == best[1]:
            best = (end, count, best[2] + [auction])
        self._best.update(best)
        yield from ()

    def on_timer(self, timestamp: int, ctx: Any) -> Iterator[dict[str, Any]]:
        end, count, auctions = self._best.value()
        start = ctx.get_current_key()
        for auction in auctions:
            yield record({'dict': {'auction_id': auction, 'num': count}}, (start, end), 'end')
        self._best.clear()


def query5(events: Any, config: NexmarkConfig) -> Any:
    from pyflink.common import Time
    from pyflink.datastream.window import SlidingEventTimeWindows
    return (events.filter(lambda e: 'bidder' in e[2])
            .key_by(lambda e: e[2]['auction'])
            .window(SlidingEventTimeWindows.of(Time.seconds(config.window_size_sec),
                                               Time.seconds(config.window_period_sec)))
            .aggregate(CountBids(), window_function=WithWindow())
            .key_by(lambda w: w[0])
            .process(HottestAuctions()))


class HighestBids(AggregateFunction):
    """Q7: (highest price, the bids with it) of a window."""

    def create_accumulator(self) -> tuple[int, list]:
        return -1, []

    def add(self, value: Any, accumulator: tuple[int, list]) -> tuple[int, list]:
        price = value[2]['price']
        if price > accumulator[0]:
            return price, [value[2]]
        if price == accumulator[0]:
            return price, accumulator[1] + [value[2]]
        return accumulator

    def get_result(self, accumulator: tuple[int, list]) -> tuple[int, list]:
        return accumulator

    def merge(self, a: tuple[int, list], b: tuple[int, list]) -> tuple[int, list]:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return a[0], a[1] + b[1]


class HighestBidRecords(ProcessWindowFunction):
    """Q7: a record per highest bid of the window, at the bid's own timestamp."""

    def process(self, key: int, context: Any, results: Any) -> Iterator[dict[str, Any]]:
        window = context.window()
        for _, bids in results:
            for bid in bids:
                yield record({'model': 'Bid', 'fields': model_fields(bid)},
                             (window.start, window.end), bid['dateTime'] * 1000)


def query7(events: Any, config: NexmarkConfig) -> Any:
    from pyflink.common import Time
    from pyflink.datastream.window import TumblingEventTimeWindows
    size_ms = config.window_size_sec * 1000
    return (events.filter(lambda e: 'bidder' in e[2])
            .key_by(lambda e: e[0] - e[0] % size_ms)  # the window: windows run in parallel
            .window(TumblingEventTimeWindows.of(Time.seconds(config.window_size_sec)))
            .aggregate(HighestBids(), window_function=HighestBidRecords()))


class JoinPersonAuctions(ProcessWindowFunction):
    """Q8, keyed by person (seller) id in a tumbling window: Beam's CoGroupByKey of the
    window's person and auctions, then its `JoinPersonAuctionFn` (a record per auction of
    a person who joined in the window)."""

    def process(self, key: int, context: Any, elements: Any) -> Iterator[dict[str, Any]]:
        window = context.window()
        values = [value for _, value in elements]
        person = next((value for value in values if value[0] == 'P'), None)
        if person is None:
            return
        for kind, reserve in values:
            if kind == 'A':
                yield record({'dict': {'id': key, 'name': person[1], 'reserve': reserve}},
                             (window.start, window.end), 'end')


def query8(events: Any, config: NexmarkConfig) -> Any:
    from pyflink.common import Time
    from pyflink.datastream.window import TumblingEventTimeWindows

    def keyed(e: tuple[int, bool, dict[str, Any]]) -> Iterator[tuple[int, tuple]]:
        x = e[2]
        kind = event_kind(x)
        if kind == 'Person':
            yield x['id'], ('P', x['name'])
        elif kind == 'Auction':
            yield x['seller'], ('A', x['reserve'])
    return (events.flat_map(keyed).key_by(lambda kv: kv[0])
            .window(TumblingEventTimeWindows.of(Time.seconds(config.window_size_sec)))
            .process(JoinPersonAuctions()))


QUERIES: dict[int, Callable[[Any, NexmarkConfig], Any]] = {
    0: query0, 1: query1, 2: query2, 3: query3, 5: query5, 7: query7, 8: query8}


def _pickled() -> Any:
    from pyflink.common import Types
    return Types.PICKLED_BYTE_ARRAY()


def build_datastream(env: Any, query: int, config: NexmarkConfig, events_dir: str,
                     continuous: bool, records_path: str, flags_dir: str) -> int:
    """The DataStream job of `query`; how many primers the sink must see to be ready."""
    lines = line_stream(env, events_dir, continuous)
    if continuous:
        lines = lines.union(primer_lines(env, env.get_parallelism()))
    parsed = (lines.map(ParseLine(query == 0, flags_dir)).name('parse json')
              .assign_timestamps_and_watermarks(watermark_strategy(config)))
    events = parsed.filter(lambda e: e[1] == EVENT)  # the sentinel goes no further
    markers = parsed.filter(lambda e: e[1] == END).map(lambda e: e[0])
    primers = parsed.filter(lambda e: e[1] == PRIME) if continuous else None
    to_sink(QUERIES[query](events, config), markers, primers, records_path, flags_dir, config)
    return env.get_parallelism()
