"""The Flink SQL variant of the PyFlink streaming programs (`flink_streaming --variant=sql`).

NEXMark Q0, Q1, Q2, Q5, Q7 and Q8 in Flink SQL, JVM-native from the files to the sink: the
event files' lines (`flink_streaming.line_stream`, Flink's file monitoring source, which
reads them in stream order) become a table of one string column with an event-time
column from the line's `dateTime` and a watermark `rowtime - bound`
(`sources.out_of_order_bound_ms`); fields are read with `JSON_VALUE`; windows are the
`TUMBLE`/`HOP` window TVFs, Q7's highest bids a join with the window's maximum (so ties
all stay, as Beam's queries keep them), Q8's new sellers a window join. The result goes
to the DataStream API (`to_data_stream`), where the Python `flink_streaming.RecordSink`
writes each row as a record with its `emitted` time.

Why not the filesystem connector with the `json` format: it reads a directory through
`FileSource`, whose files come in hash order (see `flink_streaming`), so the watermark
passes most events before they are read and windows drop them; Flink SQL has no
function that parses a JSON line into a row, hence `JSON_VALUE` per field.

Q3 has no SQL program: Beam's Q3 fires a seller's join each time 30 of its elements
arrived (`Repeatedly(AfterCount(30))`) and joins a pane's auctions with a person seen
in an earlier pane; a SQL join emits every pair as soon as both sides are there, which
is neither Beam's streaming nor its batch output. Q4 has none either: Beam's Q4 averages
the winning bids of closed auctions per category over sliding windows, and an auction
closes at its own `expires`; in SQL the winning bid per auction is an updating
aggregate, which no window aggregation can read (nexmark-flink's Q4 is that updating
aggregate, another query).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.flink_baselines import USD_TO_EURO, record
from benchmarks.nexmark.flink_stream_io import (
    event_kind,
    line_stream,
    model_fields,
    primer_lines,
    to_sink,
)
from benchmarks.nexmark.sources import out_of_order_bound_ms

EPOCH = datetime.datetime(1970, 1, 1)
ONE_MS = datetime.timedelta(milliseconds=1)


def _ms(value: datetime.datetime) -> int:
    """A window bound (TIMESTAMP(3) in the UTC session time zone) in ms since the epoch."""
    return (value - EPOCH) // ONE_MS


def _long(json_field: str, column: str = 'line') -> str:
    # JSON_VALUE ... RETURNING BIGINT is not supported (INT, DOUBLE, BOOLEAN, STRING are).
    return f"CAST(JSON_VALUE({column}, '$.{json_field}') AS BIGINT)"


def _field(name: str, alias: str, sql_type: str = 'BIGINT') -> str:
    if sql_type == 'BIGINT':
        return f'{_long(name)} AS {alias}'
    return f"JSON_VALUE(line, '$.{name}') AS {alias}"


# DATETIME is a keyword of Flink SQL: `dateTime` is `date_time` (ms) here.
BID_COLUMNS = ', '.join([_field('auction', 'auction'), _field('bidder', 'bidder'),
                         _field('price', 'price'), _field('dateTime', 'date_time'),
                         _field('extra', 'extra', 'STRING'), 'rowtime'])


def register_events(t_env: Any, lines: Any, config: NexmarkConfig) -> None:
    """Views `raw_events` (every line, with `rowtime` and the watermark), `events` (less
    the sentinel), `bids`, `persons` and `auctions`."""
    from pyflink.table import DataTypes, Schema
    bound_s = out_of_order_bound_ms(config) / 1000
    schema = (Schema.new_builder()
              .column('f0', DataTypes.STRING())
              .column_by_expression(
                  'rowtime', f"TO_TIMESTAMP_LTZ({_long('dateTime', 'f0')}, 3)")
              .watermark('rowtime', f"rowtime - INTERVAL '{bound_s:.3f}' SECOND")
              .build())
    t_env.create_temporary_view('raw_events', t_env.from_data_stream(lines, schema))
    # The sentinel: a bid of auction -1 (stream_files.END_AUCTION); persons and auctions
    # have no auction field (NULL is distinct from -1).
    t_env.create_temporary_view('events', t_env.sql_query(
        "SELECT f0 AS line, rowtime FROM raw_events "
        f"WHERE {_long('auction', 'f0')} IS DISTINCT FROM -1"))
    t_env.create_temporary_view('bids', t_env.sql_query(
        f"SELECT {BID_COLUMNS} FROM events WHERE JSON_VALUE(line, '$.bidder') IS NOT NULL"))
    t_env.create_temporary_view('persons', t_env.sql_query(
        f"SELECT {_field('id', 'id')}, {_field('name', 'name', 'STRING')}, rowtime "
        "FROM events WHERE JSON_VALUE(line, '$.emailAddress') IS NOT NULL"))
    t_env.create_temporary_view('auctions', t_env.sql_query(
        f"SELECT {_field('seller', 'seller')}, {_field('reserve', 'reserve')}, rowtime "
        "FROM events WHERE JSON_VALUE(line, '$.itemName') IS NOT NULL"))


def end_markers(t_env: Any) -> Any:
    """The sentinel's event time (ms), as a stream for the sink's end timer."""
    table = t_env.sql_query(
        f"SELECT {_long('dateTime', 'f0')} AS t FROM raw_events "
        f"WHERE {_long('auction', 'f0')} = -1")
    return t_env.to_data_stream(table).map(lambda row: row[0])


# ---------------------------------------------------------------- the queries


def query0(config: NexmarkConfig) -> tuple[str, Callable[[Any], dict[str, Any]]]:
    def to_record(row: Any) -> dict[str, Any]:
        event = json.loads(row[0])
        return record({'model': event_kind(event), 'fields': model_fields(event)}, None,
                      event['dateTime'] * 1000)
    return 'SELECT line FROM events', to_record


def _bid_fields(auction: int, bidder: int, price: Any, date_time: int, extra: str
                ) -> dict[str, Any]:
    return {'auction': auction, 'bidder': bidder, 'price': price,
            'date_time': date_time * 1000, 'extra': extra}


def query1(config: NexmarkConfig) -> tuple[str, Callable[[Any], dict[str, Any]]]:
    def to_record(row: Any) -> dict[str, Any]:
        return record({'model': 'Bid', 'fields': _bid_fields(*row)}, None, row[3] * 1000)
    # DOUBLE as Beam's Python float (a DECIMAL product would print differently).
    return (f'SELECT auction, bidder, CAST(price AS DOUBLE) * CAST({USD_TO_EURO} AS DOUBLE), '
            'date_time, extra FROM bids'), to_record


def query2(config: NexmarkConfig) -> tuple[str, Callable[[Any], dict[str, Any]]]:
    def to_record(row: Any) -> dict[str, Any]:
        return record({'dict': {'auction_id': row[0], 'price': row[1]}}, None, row[2] * 1000)
    return (f'SELECT auction, price, date_time FROM bids '
            f'WHERE MOD(auction, {config.auction_skip}) = 0'), to_record


def query5(config: NexmarkConfig) -> tuple[str, Callable[[Any], dict[str, Any]]]:
    def to_record(row: Any) -> dict[str, Any]:
        return record({'dict': {'auction_id': row[2], 'num': row[3]}},
                      (_ms(row[0]), _ms(row[1])), 'end')
    counts = (f"SELECT window_start, window_end, auction, COUNT(*) AS num FROM TABLE(HOP("
              f"TABLE bids, DESCRIPTOR(rowtime), INTERVAL '{config.window_period_sec}' SECOND, "
              f"INTERVAL '{config.window_size_sec}' SECOND)) "
              "GROUP BY window_start, window_end, auction")
    top = ('SELECT window_start, window_end, MAX(num) AS top FROM C '
           'GROUP BY window_start, window_end')
    return (f"WITH C AS ({counts}) SELECT C.window_start, C.window_end, C.auction, C.num "
            f"FROM C JOIN ({top}) T ON C.window_start = T.window_start "
            "AND C.window_end = T.window_end AND C.num = T.top"), to_record


def _tumble(view: str, config: NexmarkConfig) -> str:
    return (f"SELECT * FROM TABLE(TUMBLE(TABLE {view}, DESCRIPTOR(rowtime), "
            f"INTERVAL '{config.window_size_sec}' SECOND))")


def query7(config: NexmarkConfig) -> tuple[str, Callable[[Any], dict[str, Any]]]:
    def to_record(row: Any) -> dict[str, Any]:
        return record({'model': 'Bid', 'fields': _bid_fields(*row[2:7])},
                      (_ms(row[0]), _ms(row[1])), row[5] * 1000)
    windowed = _tumble('bids', config)
    top = f'SELECT window_start, window_end, MAX(price) AS top FROM ({windowed}) ' \
        'GROUP BY window_start, window_end'
    return ("SELECT B.window_start, B.window_end, B.auction, B.bidder, B.price, B.date_time, "
            f"B.extra FROM ({windowed}) B JOIN ({top}) T ON B.window_start = T.window_start "
            "AND B.window_end = T.window_end AND B.price = T.top"), to_record


def query8(config: NexmarkConfig) -> tuple[str, Callable[[Any], dict[str, Any]]]:
    def to_record(row: Any) -> dict[str, Any]:
        return record({'dict': {'id': row[2], 'name': row[3], 'reserve': row[4]}},
                      (_ms(row[0]), _ms(row[1])), 'end')
    # A window join: both sides windowed alike, emitted when the watermark passes the
    # window's end, its state dropped then (as Beam's CoGroupByKey per window).
    return ("SELECT P.window_start, P.window_end, P.id, P.name, A.reserve "
            f"FROM ({_tumble('persons', config)}) P JOIN ({_tumble('auctions', config)}) A "
            "ON P.id = A.seller AND P.window_start = A.window_start "
            "AND P.window_end = A.window_end"), to_record


SQL_QUERIES: dict[int, Callable[[NexmarkConfig], tuple[str, Callable[[Any], dict]]]] = {
    0: query0, 1: query1, 2: query2, 5: query5, 7: query7, 8: query8}


def build_sql(env: Any, query: int, config: NexmarkConfig, events_dir: str,
              continuous: bool, records_path: str, flags_dir: str) -> int:
    """The SQL job of `query` into the records sink; how many primers the sink must see
    to be ready (one: the sink is its only Python function)."""
    from pyflink.table import StreamTableEnvironment
    t_env = StreamTableEnvironment.create(env)
    t_env.get_config().set('table.local-time-zone', 'UTC')
    register_events(t_env, line_stream(env, events_dir, continuous), config)
    sql, to_record = SQL_QUERIES[query](config)
    outputs = t_env.to_data_stream(t_env.sql_query(sql)).map(to_record)
    primers = primer_lines(env, 1) if continuous else None
    to_sink(outputs, end_markers(t_env), primers, records_path, flags_dir, config)
    return 1
