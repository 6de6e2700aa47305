"""Native PyFlink baselines of NEXMark Q0, Q1, Q2, Q3, Q5 and Q7 (DataStream API, batch).

The optional extra of `--native flink`: hand-written PyFlink programs computing what Beam's
Python queries compute, over the same generated events, as the `FlinkNative` rows next to
the `SparkNative` ones (`spark_baselines`, whose programs these mirror query for query).

PyFlink (`apache-flink` on PyPI, which ships Flink itself) pins an old apache-beam
(apache-flink 2.3: apache-beam <= 2.61), so it cannot live in the project's environment
(Beam 2.77). This module runs under the python of a separate virtualenv, `.venv-flink`
(`benchmarks/nexmark/setup_flink_venv.sh` creates it); the launcher starts it in a
subprocess:

    .venv-flink/bin/python -m benchmarks.nexmark.flink_baselines --query=5 \\
        --records=q5.jsonl [--parallelism=2] [--num_events=100000 ...]

It imports only `benchmarks.nexmark.config` and `benchmarks.nexmark.generator` (plus
`java_random`) of this repository; the generator builds Beam's NEXMark model objects,
which the venv's older apache-beam provides with the same fields. The events are
generated inside the Flink tasks by position ranges (a `from_collection` of ranges,
then `flat_map`), never on the client, and travel as plain tuples.

Output: one JSON record per output element (`--records`, JSON lines):
`{"element": E, "window": W, "timestamp": T}`, where E is `{"model": "Bid", "fields":
{...}}` (a NEXMark model object: its attributes, `date_time`/`expires` in microseconds)
or `{"dict": {...}}`; W is `null` (the global window) or `[start_ms, end_ms]` (an
interval window); T is the output timestamp in microseconds or `"end"` (the window's
end-of-window timestamp). The launcher (`launcher.flink_record_line`, in the project's
environment) turns each record into the canonical line `output_line(element, window,
timestamp)` exactly as the Spark baselines do (windows and end-of-window timestamps as
Beam's DirectRunner gives them, in ms), so the equality check is the same.

Query by query (see `spark_baselines` for how each matches Beam's output):

* Q0: every event through its model `CODER` and back, global window, event timestamp.
* Q1: bids with `price * 0.89`.
* Q2: bids with `auction % auction_skip == 0` as `{'auction_id', 'price'}`.
* Q3: persons in OR/ID/CA joined with category-10 auctions on seller id, keeping only
  sellers with >= 30 grouped elements (Beam's batch `AfterCount(30)` panes), at the end
  of the global window.
* Q5: per sliding window, the auctions with the most bids, `{'auction_id', 'num'}`.
* Q7: per fixed window, the bids with the highest price, at their own timestamps.

Keyed reductions use `key_by(...).reduce(...)`, which in Flink's BATCH execution mode emits
one final value per key.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import TimestampedEvent, events

BASELINE_QUERIES = (0, 1, 2, 3, 5, 7)
NATIVE_RUNNER = 'FlinkNative'
# Beam's query1.USD_TO_EURO.
USD_TO_EURO = 0.89
# Beam's query3: persons of these states, auctions of this category; its AfterCount.
Q3_STATES = ('OR', 'ID', 'CA')
Q3_CATEGORY = 10
Q3_PANE_COUNT = 30
# Model attributes holding a Beam Timestamp (sent as microseconds).
TIMESTAMP_FIELDS = ('date_time', 'expires')

# A plain event: (kind, timestamp_ms, fields with timestamps in micros).
PlainEvent = tuple[str, int, dict[str, Any]]


def position_ranges(config: NexmarkConfig, num_slices: int) -> list[tuple[int, int]]:
    """[start, stop) position ranges covering the config's events in `num_slices` parts."""
    total = config.max_events
    num_slices = max(1, min(num_slices, total))
    bounds = [total * i // num_slices for i in range(num_slices + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if a < b]


def model_fields(model: Any) -> dict[str, Any]:
    """A model object's attributes, Beam `Timestamp`s as microseconds."""
    return {k: (v.micros if k in TIMESTAMP_FIELDS else v) for k, v in vars(model).items()}


def plain_event(e: TimestampedEvent, round_trip: bool = False) -> PlainEvent:
    model = e.event
    if round_trip:  # Beam's query0 RoundTripFn: through the model's coder and back
        coder = model.CODER
        model = coder.decode(coder.encode(model))
    return type(model).__name__, e.timestamp_ms, model_fields(model)


def record(element: dict[str, Any], window: tuple[int, int] | None,
           timestamp: int | str) -> dict[str, Any]:
    """One output record (see the module docstring)."""
    return {'element': element, 'window': None if window is None else list(window),
            'timestamp': timestamp}


def model_element(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {'model': kind, 'fields': fields}


# ---------------------------------------------------------------- queries


def query0(stream: Any, config: NexmarkConfig) -> Any:
    return stream.map(lambda e: record(model_element(e[0], e[2]), None, e[1] * 1000))


def query1(stream: Any, config: NexmarkConfig) -> Any:
    def to_euro(e: PlainEvent) -> dict[str, Any]:
        fields = dict(e[2])
        fields['price'] = fields['price'] * USD_TO_EURO
        return record(model_element('Bid', fields), None, e[1] * 1000)
    return stream.filter(lambda e: e[0] == 'Bid').map(to_euro)


def query2(stream: Any, config: NexmarkConfig) -> Any:
    skip = config.auction_skip
    return (stream.filter(lambda e: e[0] == 'Bid' and e[2]['auction'] % skip == 0)
            .map(lambda e: record({'dict': {'auction_id': e[2]['auction'],
                                            'price': e[2]['price']}}, None, e[1] * 1000)))


def query3(stream: Any, config: NexmarkConfig) -> Any:
    def keyed(e: PlainEvent) -> Iterator[tuple[int, list[tuple]]]:
        kind, _, x = e
        if kind == 'Person' and x['state'] in Q3_STATES:
            yield x['id'], [('P', x['name'], x['city'], x['state'])]
        elif kind == 'Auction' and x['category'] == Q3_CATEGORY:
            yield x['seller'], [('A', x['id'])]

    def join(group: tuple[int, list[tuple]]) -> Iterator[dict[str, Any]]:
        records = group[1]
        if len(records) < Q3_PANE_COUNT:  # the key's pane never fires
            return
        persons = [r for r in records if r[0] == 'P']
        if not persons:
            return
        _, name, city, state = persons[0]
        for r in records:
            if r[0] == 'A':
                yield record({'dict': {'name': name, 'city': city, 'state': state,
                                       'auction_id': r[1]}}, None, 'end')
    return (stream.flat_map(keyed)
            .key_by(lambda kv: kv[0])
            .reduce(lambda a, b: (a[0], a[1] + b[1]))
            .flat_map(join))


def query5(stream: Any, config: NexmarkConfig) -> Any:
    size_ms = config.window_size_sec * 1000
    period_ms = config.window_period_sec * 1000

    def windows(e: PlainEvent) -> Iterator[tuple[int, int, int]]:
        # Beam's SlidingWindows.assign (offset 0).
        t = e[1]
        start = t - t % period_ms
        while start > t - size_ms:
            yield start, e[2]['auction'], 1
            start -= period_ms

    def hottest(a: tuple[int, int, list[int]], b: tuple[int, int, list[int]]
                ) -> tuple[int, int, list[int]]:
        if a[1] != b[1]:
            return a if a[1] > b[1] else b
        return a[0], a[1], a[2] + b[2]

    def lines(item: tuple[int, int, list[int]]) -> Iterator[dict[str, Any]]:
        start, count, auctions = item
        for auction in auctions:
            yield record({'dict': {'auction_id': auction, 'num': count}},
                         (start, start + size_ms), 'end')
    return (stream.filter(lambda e: e[0] == 'Bid')
            .flat_map(windows)
            .key_by(lambda w: (w[0], w[1]))
            .reduce(lambda a, b: (a[0], a[1], a[2] + b[2]))
            .map(lambda w: (w[0], w[2], [w[1]]))
            .key_by(lambda w: w[0])
            .reduce(hottest)
            .flat_map(lines))


def query7(stream: Any, config: NexmarkConfig) -> Any:
    size_ms = config.window_size_sec * 1000

    def keyed(e: PlainEvent) -> tuple[int, int, list[PlainEvent]]:
        t = e[1]
        return t - t % size_ms, e[2]['price'], [e]

    def highest(a: tuple[int, int, list], b: tuple[int, int, list]) -> tuple[int, int, list]:
        if a[1] != b[1]:
            return a if a[1] > b[1] else b
        return a[0], a[1], a[2] + b[2]

    def lines(item: tuple[int, int, list[PlainEvent]]) -> Iterator[dict[str, Any]]:
        start, _, bids = item
        for e in bids:
            yield record(model_element('Bid', e[2]), (start, start + size_ms), e[1] * 1000)
    return (stream.filter(lambda e: e[0] == 'Bid')
            .map(keyed)
            .key_by(lambda w: w[0])
            .reduce(highest)
            .flat_map(lines))


QUERIES: dict[int, Callable[[Any, NexmarkConfig], Any]] = {
    0: query0, 1: query1, 2: query2, 3: query3, 5: query5, 7: query7}


# ---------------------------------------------------------------- running


def environment(parallelism: int) -> Any:
    """A local Flink environment in BATCH mode whose Python workers use this python."""
    from pyflink.common import Configuration
    from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment
    conf = Configuration()
    conf.set_string('python.executable', sys.executable)
    conf.set_string('python.client.executable', sys.executable)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_runtime_mode(RuntimeExecutionMode.BATCH)
    env.set_parallelism(parallelism)
    return env


def event_stream(env: Any, config: NexmarkConfig, query: int, num_slices: int) -> Any:
    """The config's events as plain tuples, generated in the Flink tasks by position range."""
    ranges = position_ranges(config, num_slices)
    round_trip = query == 0
    return env.from_collection(ranges).flat_map(
        lambda r: (plain_event(e, round_trip) for e in events(config, r[0], r[1])))


def run_baseline(query: int, config: NexmarkConfig, parallelism: int = 2,
                 num_slices: int | None = None) -> list[dict[str, Any]]:
    """Run the PyFlink baseline of `query`; its output records."""
    if query not in QUERIES:
        raise ValueError(f'no native Flink baseline for Q{query} (have {BASELINE_QUERIES})')
    env = environment(parallelism)
    stream = event_stream(env, config, query, num_slices or 4 * parallelism)
    with QUERIES[query](stream, config).execute_and_collect(
            f'nexmark-q{query}-flink-native') as results:
        return list(results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m benchmarks.nexmark.flink_baselines')
    parser.add_argument('--query', type=int, required=True)
    parser.add_argument('--records', required=True, help='output JSON lines file')
    parser.add_argument('--parallelism', type=int, default=os.cpu_count() or 2)
    known, rest = parser.parse_known_args(argv)
    config, unknown = NexmarkConfig.from_args(rest)
    if unknown:
        parser.error(f'unknown arguments: {unknown}')
    start = time.perf_counter()
    records = run_baseline(known.query, config, known.parallelism)
    with open(known.records, 'w', encoding='utf-8') as f:
        f.writelines(json.dumps(r, sort_keys=True) + '\n' for r in records)
    print(f'Q{known.query}: {len(records)} records in {time.perf_counter() - start:.1f} s',
          file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
