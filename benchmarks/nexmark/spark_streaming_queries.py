"""The Spark Structured Streaming baselines' input and DataFrame queries.

The event stream (Spark's JSON file source over the comparison's event files, event
time, watermark, the sentinel dropped), the output columns every query's DataFrame
carries (`model_columns`, `output_columns`), and the DataFrame-API (JVM-native,
UDF-free) programs of Q0, Q1, Q2, Q5, Q7 and Q8. `spark_streaming` runs them (and the
stateful ones of `spark_streaming_state`, which build on the same columns); see its
docstring for the whole baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import functions as F

from benchmarks.nexmark import stream_files
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.sources import out_of_order_bound_ms

VARIANTS = ('sql', 'state')
SQL_QUERIES = (0, 1, 2, 5, 7, 8)
STATE_QUERIES = (3, 5, 7)
# Files (of 20,000 events at the comparison's 1M) per micro-batch when as fast as
# possible: batches of 200,000 events; at a fixed rate a batch takes what has arrived.
DEFAULT_MAX_FILES_PER_TRIGGER = 10
ROCKSDB_PROVIDER = 'org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider'
# Beam's query1.USD_TO_EURO; query3's states and category.
USD_TO_EURO = 0.89
Q3_STATES = ('OR', 'ID', 'CA')
Q3_CATEGORY = 10
# The name of the input's observed metrics (`event_stream`).
INPUT_METRICS = 'nexmark_input'

# Beam's JSON events (`event_file.json_line`): every field of a person, an auction or a
# bid; a row has the fields of its kind, the others null.
EVENT_SCHEMA = ('id long, name string, emailAddress string, creditCard string, '
                'city string, state string, dateTime long, extra string, '
                'itemName string, description string, initialBid long, reserve long, '
                'expires long, seller long, category long, '
                'auction long, bidder long, price long')
# The attributes of Beam's model objects, in the records' `fields`.
MODEL_FIELDS = {
    'Person': ('id', 'name', 'email_address', 'credit_card', 'city', 'state', 'date_time',
               'extra'),
    'Auction': ('id', 'item_name', 'description', 'initial_bid', 'reserve', 'date_time',
                'expires', 'seller', 'category', 'extra'),
    'Bid': ('auction', 'bidder', 'price', 'date_time', 'extra'),
}
# Model attributes holding a Beam Timestamp: microseconds in a record, ms in the JSON.
TIMESTAMP_FIELDS = ('date_time', 'expires')
# The output columns every query's DataFrame has besides its element's: `_kind` (a
# model name, or 'dict' for a dict element), `_start`/`_end` (the window in ms, null in
# the global window), `_ts` (the output timestamp in us, null for end-of-window).
DICT_KIND = 'dict'


def json_name(attribute: str) -> str:
    """The JSON field of a model attribute (`event_file`: camel case)."""
    first, *rest = attribute.split('_')
    return first + ''.join(part.title() for part in rest)


# ---------------------------------------------------------------- input


def event_stream(spark: Any, events_dir: str, config: NexmarkConfig,
                 max_files_per_trigger: int) -> Any:
    """The events of `events_dir` as a streaming DataFrame (EVENT_SCHEMA plus `ts`), with
    the watermark, observed as INPUT_METRICS, the sentinel dropped."""
    delay_ms = out_of_order_bound_ms(config)
    raw = (spark.readStream.schema(EVENT_SCHEMA)
           .option('maxFilesPerTrigger', max_files_per_trigger)
           # A malformed line fails the query instead of becoming a row of nulls.
           .option('mode', 'FAILFAST')
           .json(events_dir))
    watermarked = (raw.withColumn('ts', F.timestamp_millis('dateTime'))
                   .withWatermark('ts', f'{delay_ms} milliseconds'))
    is_end = (F.col('auction') == stream_files.END_AUCTION) & (
        F.col('bidder') == stream_files.END_AUCTION)
    observed = watermarked.observe(
        INPUT_METRICS, F.count(F.lit(1)).alias('rows'),
        F.max(F.coalesce(is_end, F.lit(False)).cast('int')).alias('end'))
    # Spark pushes a filter below the watermark unless it references the event-time
    # column, and the sentinel must reach the watermark: hence the `ts` term.
    return observed.filter(~F.coalesce(is_end, F.lit(False)) | F.col('ts').isNull())


def bids(events: Any) -> Any:
    return events.filter(F.col('bidder').isNotNull())


def model_columns(kind: str, price: Any = None) -> list[Any]:
    """The columns of model `kind`'s attributes (timestamps in us), `price` replacing
    the bid's price if given."""
    columns = []
    for attribute in MODEL_FIELDS[kind]:
        column = F.col(json_name(attribute))
        if attribute in TIMESTAMP_FIELDS:
            column = column * 1000
        elif attribute == 'price' and price is not None:
            column = price
        columns.append(column.alias(attribute))
    return columns


def output_columns(kind: Any, start: Any = None, end: Any = None, ts: Any = None
                   ) -> list[Any]:
    """The `_kind`, `_start`, `_end`, `_ts` columns (module constants' comment)."""

    def value(column: Any, type_: str) -> Any:
        if column is None:
            return F.lit(None).cast(type_)
        return F.lit(column) if isinstance(column, str) else column
    return [value(kind, 'string').alias('_kind'), value(start, 'long').alias('_start'),
            value(end, 'long').alias('_end'), value(ts, 'long').alias('_ts')]


def event_ts() -> Any:
    return F.col('dateTime') * 1000


# ---------------------------------------------------------------- sql variant


def sql_query0(events: Any, config: NexmarkConfig) -> Any:
    kind = (F.when(F.col('bidder').isNotNull(), 'Bid')
            .when(F.col('itemName').isNotNull(), 'Auction').otherwise('Person'))
    attributes = dict.fromkeys(a for fields in MODEL_FIELDS.values() for a in fields)
    columns = [(F.col(json_name(a)) * 1000 if a in TIMESTAMP_FIELDS
                else F.col(json_name(a))).alias(a) for a in attributes]
    return events.select(*output_columns(kind, ts=event_ts()), *columns)


def sql_query1(events: Any, config: NexmarkConfig) -> Any:
    return bids(events).select(*output_columns('Bid', ts=event_ts()),
                               *model_columns('Bid', F.col('price') * USD_TO_EURO))


def sql_query2(events: Any, config: NexmarkConfig) -> Any:
    return (bids(events).filter(F.col('auction') % config.auction_skip == 0)
            .select(*output_columns(DICT_KIND, ts=event_ts()),
                    F.col('auction').alias('auction_id'), 'price'))


def window_ms(window: str) -> tuple[Any, Any]:
    """(start, end) in ms of a window struct column."""
    return F.unix_millis(F.col(f'{window}.start')), F.unix_millis(F.col(f'{window}.end'))


def sql_query5(events: Any, config: NexmarkConfig) -> Any:
    counts = (bids(events)
              .groupBy(F.window('ts', f'{config.window_size_sec} seconds',
                                f'{config.window_period_sec} seconds').alias('w'),
                       'auction')
              .count())
    # Grouping by the first aggregation's window chains the two stateful operators on
    # event time (Spark 4, append mode): a window's counts come out when the watermark
    # passes its end, and its hottest auctions in the same micro-batch.
    hottest = (counts.groupBy('w')
               .agg(F.max('count').alias('top'),
                    F.collect_list(F.struct('auction', 'count')).alias('counts'))
               .select('w', F.explode(F.filter('counts', lambda c: c['count'] == F.col('top')))
                       .alias('c')))
    start, end = window_ms('w')
    return hottest.select(*output_columns(DICT_KIND, start, end),
                          F.col('c.auction').alias('auction_id'), F.col('c.count').alias('num'))


def sql_query7(events: Any, config: NexmarkConfig) -> Any:
    windowed = bids(events).withColumn('w', F.window('ts', f'{config.window_size_sec} seconds'))
    highest = (windowed.groupBy('w').agg(F.max('price').alias('top'))
               .withColumnRenamed('w', 'top_w'))
    # The bids wait in the join's state for their window's maximum, which the
    # aggregation emits once the watermark passes the window's end.
    joined = windowed.join(highest, (F.col('w') == F.col('top_w'))
                           & (F.col('price') == F.col('top')))
    start, end = window_ms('w')
    return joined.select(*output_columns('Bid', start, end, event_ts()),
                         *model_columns('Bid'))


def sql_query8(events: Any, config: NexmarkConfig) -> Any:
    size = f'{config.window_size_sec} seconds'
    persons = (events.filter(F.col('emailAddress').isNotNull())
               .select(F.window('ts', size).alias('w'), F.col('id').alias('person'), 'name'))
    auctions = (events.filter(F.col('itemName').isNotNull())
                .select(F.window('ts', size).alias('aw'), 'seller', 'reserve'))
    # Window equality on both sides' event time: Spark drops a window's join state once
    # the watermark passes it (Beam's CoGroupByKey per window, then its join).
    joined = persons.join(auctions, (F.col('person') == F.col('seller'))
                          & (F.col('w') == F.col('aw')))
    start, end = window_ms('w')
    return joined.select(*output_columns(DICT_KIND, start, end),
                         F.col('person').alias('id'), 'name', 'reserve')


SQL_BUILDERS: dict[int, Callable[[Any, NexmarkConfig], Any]] = {
    0: sql_query0, 1: sql_query1, 2: sql_query2, 5: sql_query5, 7: sql_query7,
    8: sql_query8}
# The element fields of the queries whose elements are dicts.
DICT_FIELDS = {2: ('auction_id', 'price'), 3: ('name', 'city', 'state', 'auction_id'),
               5: ('auction_id', 'num'), 8: ('id', 'name', 'reserve')}
