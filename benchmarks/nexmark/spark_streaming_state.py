"""The state variant of the Spark streaming baselines: `transformWithStateInPandas`.

Spark 4's Python stateful processor API (state variables in the RocksDB state store,
event-time timers) running NEXMark's stateful queries the way a Spark user would write
them, the "Python state API" baseline against which the report sets this runner's
stateful queries. `spark_streaming` (the program: source, watermark, sink, end of the
stream) builds them with `STATE_BUILDERS`; each takes the watermarked events and returns
a DataFrame with the program's output columns (`spark_streaming.output_columns`).

What runs where: the events' parsing, filters, projections and window assignment are
Spark SQL before the processor (JVM); the processor gets each key's new rows of a
micro-batch as pandas DataFrames, and every state access is a call from the Python
worker to the JVM's state server, so the processors batch their state writes: one list
append per key and micro-batch where the logic allows.

* Q7 (`HighestBidProcessor`), keyed by fixed window: the highest price so far and the
  bids having it in state, an event-time timer at the window's end that emits those
  bids and clears the state.
* Q5 (`HotItemsProcessor`), keyed by sliding window (Spark's `window(ts, size, period)`
  assigns them): each micro-batch appends its bid counts per auction to a list; the
  timer at the window's end sums them and emits the auctions with the highest count.
* Q3 (`LocalItemProcessor`), keyed by seller: Beam's query3 as it runs in streaming.
  Beam fires a seller's pane each time 30 of its elements (category-10 auctions, and
  its person if in OR, ID or CA) have arrived (`Repeatedly(AfterCount(30))`, global
  window) and joins each fired pane in a stateful DoFn (`JoinFn`): the person is kept
  (an event-time timer clears it `max_auctions_waiting_time` s after the person's
  time), auctions of a pane without a known person wait for it. The processor keeps the
  unfired elements (< 30) in a list, fires each full pane through the same join logic,
  and keeps the person and the waiting auctions likewise. Elements that never fill a
  pane are never output, as in Beam.

A window's elements that arrive after the watermark passed its end are dropped, as
Beam and Spark's own aggregations drop late data (none arrive within the out-of-order
bound the watermark waits for).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.spark_streaming_queries import (
    DICT_KIND,
    Q3_CATEGORY,
    Q3_STATES,
    bids,
    model_columns,
    output_columns,
)

BID_COLUMNS = ('auction', 'bidder', 'price', 'date_time', 'extra')
BID_SCHEMA = 'auction long, bidder long, price long, date_time long, extra string'
# Beam's query3 `num_events_in_pane`.
Q3_PANE_COUNT = 30
PANE_SCHEMA = ('kind string, name string, city string, state string, auction_id long, '
               'date_time long')
PERSON_SCHEMA = 'name string, city string, state string'
PERSON = 'P'
AUCTION = 'A'


def _frame(rows: Iterator[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(list(rows), ignore_index=True)


def _is_late(window_end_ms: int, timer_values: Any) -> bool:
    return window_end_ms <= timer_values.getCurrentWatermarkInMs()


# ---------------------------------------------------------------- Q7


class HighestBidProcessor(StatefulProcessor):
    """Q7 keyed by window start (ms): the bids with the highest price, at the window's end."""

    def __init__(self, size_ms: int) -> None:
        self._size_ms = size_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        self._top = handle.getValueState('top', 'price long')
        self._bids = handle.getListState('bids', BID_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                        ) -> Iterator[pd.DataFrame]:
        frame = _frame(rows)
        end = int(key[0]) + self._size_ms
        if _is_late(end, timerValues):
            return iter(())
        top = int(frame['price'].max())
        best = [tuple(r[c] for c in BID_COLUMNS)
                for r in frame[frame['price'] == top].to_dict('records')]
        if not self._top.exists():
            self._handle.registerTimer(end)
            current = None
        else:
            current = self._top.get()[0]
        if current is None or top > current:
            self._top.update((top,))
            self._bids.put(best)
        elif top == current:
            self._bids.appendList(best)
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                           ) -> Iterator[pd.DataFrame]:
        frame = pd.DataFrame(list(self._bids.get()), columns=list(BID_COLUMNS))
        self._top.clear()
        self._bids.clear()
        frame.insert(0, 'start', int(key[0]))
        yield frame


def state_query7(events: Any, config: NexmarkConfig) -> Any:
    size_ms = config.window_size_sec * 1000
    keyed = (bids(events)
             .withColumn('start', F.unix_millis(
                 F.window('ts', f'{config.window_size_sec} seconds').start))
             .select('start', *model_columns('Bid')))
    out = keyed.groupBy('start').transformWithStateInPandas(
        HighestBidProcessor(size_ms), f'start long, {BID_SCHEMA}', 'Append', 'EventTime')
    return out.select(*output_columns('Bid', F.col('start'), F.col('start') + size_ms,
                                      F.col('date_time')), *BID_COLUMNS)


# ---------------------------------------------------------------- Q5


class HotItemsProcessor(StatefulProcessor):
    """Q5 keyed by window start (ms): bid counts per auction, the highest at the end."""

    def __init__(self, size_ms: int) -> None:
        self._size_ms = size_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        self._counts = handle.getListState('counts', 'auction long, num long')

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                        ) -> Iterator[pd.DataFrame]:
        counts = _frame(rows)['auction'].value_counts()
        end = int(key[0]) + self._size_ms
        if _is_late(end, timerValues):
            return iter(())
        if not self._counts.exists():
            self._handle.registerTimer(end)
        # One append of this micro-batch's counts: summed when the window closes.
        self._counts.appendList(list(zip(counts.index.tolist(), counts.tolist(),
                                         strict=True)))
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                           ) -> Iterator[pd.DataFrame]:
        partial = pd.DataFrame(list(self._counts.get()), columns=['auction', 'num'])
        self._counts.clear()
        totals = partial.groupby('auction')['num'].sum()
        hot = totals[totals == totals.max()]
        yield pd.DataFrame({'start': int(key[0]), 'auction_id': hot.index.to_numpy(),
                            'num': hot.to_numpy()})


def state_query5(events: Any, config: NexmarkConfig) -> Any:
    size_ms = config.window_size_sec * 1000
    window = F.window('ts', f'{config.window_size_sec} seconds',
                      f'{config.window_period_sec} seconds')
    keyed = bids(events).select(F.unix_millis(window.start).alias('start'), 'auction')
    out = keyed.groupBy('start').transformWithStateInPandas(
        HotItemsProcessor(size_ms), 'start long, auction_id long, num long', 'Append',
        'EventTime')
    return out.select(*output_columns(DICT_KIND, F.col('start'), F.col('start') + size_ms),
                      'auction_id', 'num')


# ---------------------------------------------------------------- Q3


class LocalItemProcessor(StatefulProcessor):
    """Q3 keyed by seller: panes of 30 elements, each joined as Beam's `JoinFn` does."""

    def __init__(self, wait_ms: int) -> None:
        self._wait_ms = wait_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        self._pane = handle.getListState('pane', PANE_SCHEMA)
        self._person = handle.getValueState('person', PERSON_SCHEMA)
        self._waiting = handle.getListState('auctions', 'auction_id long')

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                        ) -> Iterator[pd.DataFrame]:
        arrived = [self._element(r) for r in _frame(rows).to_dict('records')]
        unfired = list(self._pane.get()) if self._pane.exists() else []
        if len(unfired) + len(arrived) < Q3_PANE_COUNT:
            self._pane.appendList(arrived)
            return iter(())
        elements = unfired + arrived
        fired = len(elements) // Q3_PANE_COUNT * Q3_PANE_COUNT
        pairs: list[tuple] = []
        for i in range(0, fired, Q3_PANE_COUNT):
            pairs.extend(self._join(elements[i:i + Q3_PANE_COUNT]))
        if fired < len(elements):
            self._pane.put(elements[fired:])
        else:
            self._pane.clear()
        if not pairs:
            return iter(())
        return iter([pd.DataFrame(pairs, columns=['name', 'city', 'state', 'auction_id'])])

    @staticmethod
    def _element(row: dict[str, Any]) -> tuple:
        if row['kind'] == PERSON:
            return PERSON, row['name'], row['city'], row['state'], None, int(row['date_time'])
        # Arrow gives a long column with nulls (the persons') to pandas as floats.
        return AUCTION, None, None, None, int(row['auction_id']), int(row['date_time'])

    def _join(self, pane: list[tuple]) -> list[tuple]:
        """Beam's `JoinFn.process` for one fired pane: the (name, city, state, auction)
        pairs it outputs, the state updated."""
        auctions = [e[4] for e in pane if e[0] == AUCTION]
        if self._person.exists():
            name, city, state = self._person.get()
            return [(name, city, state, a) for a in auctions]
        persons = [e for e in pane if e[0] == PERSON]
        if not persons:
            self._waiting.appendList([(a,) for a in auctions])
            return []
        _, name, city, state, _, date_time = persons[0]  # Beam logs and skips the others
        waiting = [w[0] for w in self._waiting.get()] if self._waiting.exists() else []
        self._waiting.clear()
        self._person.update((name, city, state))
        self._handle.registerTimer(date_time + self._wait_ms)
        return [(name, city, state, a) for a in waiting + auctions]

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                           ) -> Iterator[pd.DataFrame]:
        self._person.clear()  # Beam's `expiry`: later auctions wait for a new person
        return iter(())


def state_query3(events: Any, config: NexmarkConfig) -> Any:
    is_person = F.col('emailAddress').isNotNull() & F.col('state').isin(*Q3_STATES)
    is_auction = F.col('itemName').isNotNull() & (F.col('category') == Q3_CATEGORY)
    keyed = (events.filter(is_person | is_auction)
             .select(F.when(is_person, F.col('id')).otherwise(F.col('seller')).alias('seller'),
                     F.when(is_person, PERSON).otherwise(AUCTION).alias('kind'),
                     'name', 'city', 'state',
                     F.when(is_person, None).otherwise(F.col('id')).alias('auction_id'),
                     F.col('dateTime').alias('date_time')))
    out = keyed.groupBy('seller').transformWithStateInPandas(
        LocalItemProcessor(config.max_auctions_waiting_time * 1000),
        'name string, city string, state string, auction_id long', 'Append', 'EventTime')
    return out.select(*output_columns(DICT_KIND), 'name', 'city', 'state', 'auction_id')


STATE_BUILDERS = {3: state_query3, 5: state_query5, 7: state_query7}


def _ship_by_value() -> None:
    # The processors travel to Spark's Python workers pickled; by value, so a worker
    # need not import this repository (its working directory and path are Spark's).
    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_ship_by_value()
