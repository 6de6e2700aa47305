"""Spark Structured Streaming baselines of the streaming NEXMark comparison.

What a Spark user would write to run NEXMark Q0, Q1, Q2, Q3, Q5, Q7 and Q8 as streaming jobs
over the comparison's event files (`stream_files`: read that contract first), as the
Spark rows next to this runner's and PyFlink's. Common interface of the comparison:

    python -m benchmarks.nexmark.spark_streaming --variant=sql|state --query=Q \\
        --events_dir=DIR --records=R.jsonl --summary=S.json [--checkpoint_dir=D \\
        --checkpoint_period_s=P] [--ready_file=F] [--parallelism=2] \\
        [--spark_master=local[2]] [--max_files_per_trigger=10] [NEXMark config options]

* **Source**: Spark's file stream source, `readStream.schema(EVENT_SCHEMA).json(DIR)`
  (the union of the fields of Beam's JSON events; no Python parsing), at most
  `--max_files_per_trigger` files per micro-batch; event time `ts` from `dateTime`,
  `withWatermark(ts, out_of_order_bound_ms(config))`, the sentinel dropped right after.
* **`--variant=sql`**: the DataFrame API, JVM-native, no Python UDF: Q0, Q1, Q2 are
  projections and filters; Q5 two chained event-time aggregations (count per sliding
  window and auction, then per window the highest count and its auctions); Q7 a
  stream-stream join of the bids with each fixed window's highest price, on (window,
  price); Q8 a stream-stream join of persons and auctions on (window, seller). Q3 is
  not expressible: Beam's streaming Q3 emits a seller's pairs per pane of
  30 arrived elements (`Repeatedly(AfterCount(30))`) and never the rest; a stream-stream
  join emits every pair at once, an aggregation in append mode only when an event-time
  window closes (the global window never does). Q3 is in the state variant only. Nor is
  Beam's Q4 (sliding-window means of the winning bids of auctions closed by their own
  `expires`): the winning bid per auction is an aggregation that no event-time window
  closes, and an updating aggregation cannot feed another in append mode.
* **`--variant=state`**: `transformWithStateInPandas` (Spark 4's Python stateful
  processor API) on the RocksDB state store: Q3, Q5, Q7 (`spark_streaming_state`).
* **Sink**: `foreachBatch` writes each output row as a `stream_files` record (element,
  window, timestamp as `native.flink_record_line` reads them; `emitted` = when the
  batch reached the driver).
* **End**: an observed metric of the input (`observe`: rows read, whether the sentinel
  was among them) in each micro-batch's progress says when the end file has been read;
  then `processAllAvailable()` returns after the no-data batches in which the watermark
  closes every window, and the query stops. `--ready_file` is written after `start()`.
* **Checkpoints**: Spark writes offsets, commits and state every micro-batch, with or
  without a checkpoint directory; it has no checkpoint period (`--checkpoint_period_s`
  is recorded in the summary, not used). `--checkpoint_dir` (new or empty: a finished
  stream cannot be resumed) is the `checkpointLocation`, and the summary's
  `checkpoints` the number of micro-batches; without it a temporary directory is used
  and deleted afterwards.
* **Summary**: events read (less the sentinel), `wall_s` from `start()` to the end of
  the last micro-batch's sink call, `setup_s` the SparkSession's creation.

Both variants use the default trigger (a new micro-batch as soon as the last one ends),
`spark.sql.shuffle.partitions` = the parallelism (2 cores: 2), Spark's UI off.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from benchmarks.nexmark import stream_files
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.spark_streaming_queries import (
    DEFAULT_MAX_FILES_PER_TRIGGER,
    DICT_FIELDS,
    DICT_KIND,
    INPUT_METRICS,
    MODEL_FIELDS,
    ROCKSDB_PROVIDER,
    SQL_BUILDERS,
    SQL_QUERIES,
    STATE_QUERIES,
    VARIANTS,
    event_stream,
)


def query_frame(variant: str, query: int, events: Any, config: NexmarkConfig) -> Any:
    """The output DataFrame of `query` in `variant` over `events`."""
    if variant == 'sql':
        return SQL_BUILDERS[query](events, config)
    from benchmarks.nexmark import spark_streaming_state
    return spark_streaming_state.STATE_BUILDERS[query](events, config)


def check_supported(variant: str, query: int) -> None:
    """Raises ValueError naming what the variant supports if it lacks `query`."""
    if variant not in VARIANTS:
        raise ValueError(f'--variant={variant}: use one of {", ".join(VARIANTS)}')
    supported = SQL_QUERIES if variant == 'sql' else STATE_QUERIES
    if query in supported:
        return
    hint = ''
    if variant == 'sql' and query == 3:
        hint = (' (Beam\'s streaming Q3 fires a pane per 30 elements of a seller, which '
                'no SQL join or aggregation expresses; use --variant=state)')
    raise ValueError(f'--variant={variant} has no Q{query}{hint}; it runs '
                     f'{", ".join(f"Q{q}" for q in supported)}')


# ---------------------------------------------------------------- sink


def to_records(rows: Iterable[dict[str, Any]], dict_fields: Sequence[str], emitted: float
               ) -> Iterable[dict[str, Any]]:
    """`stream_files` records of output rows (the `_kind`, `_start`, `_end`, `_ts`
    columns and the element's)."""
    for row in rows:
        kind = row['_kind']
        if kind == DICT_KIND:
            element: dict[str, Any] = {'dict': {f: row[f] for f in dict_fields}}
        else:
            element = {'model': kind, 'fields': {f: row[f] for f in MODEL_FIELDS[kind]}}
        window = None if row['_start'] is None else [row['_start'], row['_end']]
        timestamp = 'end' if row['_ts'] is None else row['_ts']
        yield {'element': element, 'window': window, 'timestamp': timestamp,
               'emitted': emitted}


class RecordSink:
    """The `foreachBatch` function: appends each micro-batch's rows to the records file."""

    def __init__(self, path: str, dict_fields: Sequence[str]) -> None:
        self._file = open(path, 'w', encoding='utf-8')
        self._dict_fields = dict_fields
        self.records = 0
        self.last_written: float | None = None

    def __call__(self, frame: Any, batch_id: int) -> None:
        # One action on the batch: through Arrow, far cheaper than collect()'s Rows.
        rows = frame.toArrow().to_pylist()
        emitted = time.time()
        for record in to_records(rows, self._dict_fields, emitted):
            stream_files.write_record(self._file, record)
        self._file.flush()
        self.records += len(rows)
        self.last_written = time.perf_counter()

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------- running


@dataclass
class StreamEnd:
    """What the input's observed metrics said: rows read, the batch that read the
    sentinel, the micro-batches seen."""

    rows: int = 0
    end_batch: int | None = None
    rows_after_end: int = 0
    batches: int = 0
    _last_seen: int = -1

    def update(self, progress: Sequence[Any]) -> None:
        """Takes in the progress reports not seen yet (`query.recentProgress`)."""
        for p in progress:
            # While idle Spark also reports progress, under the next batch's id, without
            # running a batch (no `addBatch` duration): not a micro-batch.
            if p.batchId <= self._last_seen or 'addBatch' not in (p.durationMs or {}):
                continue
            self._last_seen = p.batchId
            self.batches = p.batchId + 1
            metrics = (p.observedMetrics or {}).get(INPUT_METRICS)
            rows = int(metrics['rows'] or 0) if metrics is not None else 0
            if self.end_batch is not None:
                self.rows_after_end += rows
            elif metrics is not None and metrics['end'] == 1:
                self.end_batch = p.batchId
            self.rows += rows


def await_end(query: Any, poll_s: float = 0.1) -> StreamEnd:
    """Waits until the sentinel has been read and every window closed and written
    (`processAllAvailable` runs the no-data batches the new watermark needs)."""
    end = StreamEnd()
    while end.end_batch is None:
        if query.awaitTermination(poll_s):  # raises the query's error if it failed
            raise RuntimeError('the streaming query stopped before the end file was read')
        end.update(query.recentProgress)
    query.processAllAvailable()
    end.update(query.recentProgress)
    return end


def spark_session(master: str, parallelism: int, variant: str, existing: Any = None
                  ) -> Any:
    """A session for one run: a new one (`existing` None) or a new session sharing
    `existing`'s SparkContext (its own SQL conf), configured for `variant`."""
    if existing is None:
        existing = (SparkSession.builder.master(master)
                    .appName('nexmark-spark-streaming')
                    .config('spark.ui.enabled', 'false')
                    .config('spark.ui.showConsoleProgress', 'false')
                    # The Python workers of transformWithStateInPandas need pandas:
                    # this interpreter's.
                    .config('spark.pyspark.python', sys.executable)
                    .getOrCreate())
        existing.sparkContext.setLogLevel('WARN')
    spark = existing.newSession()
    spark.conf.set('spark.sql.shuffle.partitions', str(parallelism))
    if variant == 'state':
        spark.conf.set('spark.sql.streaming.stateStore.providerClass', ROCKSDB_PROVIDER)
        # What a Spark user sets for RocksDB state: each micro-batch commits a changelog,
        # not a snapshot of the state.
        spark.conf.set(
            'spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled', 'true')
    return spark


@dataclass
class Outcome:
    """What one run did: events read (less the sentinel), seconds from `start()` to the
    last sink call, micro-batches, records written."""

    events: int
    wall_s: float
    batches: int
    records: int


def run_stream(spark: Any, args: argparse.Namespace, config: NexmarkConfig) -> Outcome:
    """Runs the query of `args` until the end of the stream; raises on any failure."""
    events = event_stream(spark, args.events_dir, config, args.max_files_per_trigger)
    frame = query_frame(args.variant, args.query, events, config)
    sink = RecordSink(args.records, DICT_FIELDS.get(args.query, ()))
    checkpoint = args.checkpoint_dir or tempfile.mkdtemp(prefix='nexmark-spark-checkpoint-')
    try:
        query = (frame.writeStream.foreachBatch(sink)
                 .option('checkpointLocation', checkpoint).start())
        started = time.perf_counter()
        if args.ready_file:
            with open(args.ready_file, 'w', encoding='utf-8') as f:
                f.write(f'{time.time()}\n')
        try:
            end = await_end(query)
        finally:
            query.stop()
    finally:
        sink.close()
        if not args.checkpoint_dir:
            shutil.rmtree(checkpoint, ignore_errors=True)
    if end.rows_after_end:
        raise RuntimeError(
            f'{end.rows_after_end} events were read after the end file, in a later '
            'micro-batch (Spark takes files in modification-time order): their windows '
            'had closed. Write the end file after every events file (stream_files).')
    if end.rows - 1 != config.max_events:
        raise RuntimeError(
            f'read {end.rows - 1} events before the end file, the NEXMark options say '
            f'{config.max_events}: give the options the events were written with')
    wall_s = (sink.last_written or time.perf_counter()) - started
    return Outcome(end.rows - 1, wall_s, end.batches, sink.records)


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, NexmarkConfig]:
    """The program's options and the NEXMark config (exits with a usage error on
    unknown options)."""
    parser = argparse.ArgumentParser(prog='python -m benchmarks.nexmark.spark_streaming',
                                     description=__doc__.split('\n', 1)[0])
    parser.add_argument('--variant', required=True, choices=VARIANTS)
    stream_files.add_program_arguments(
        parser, checkpoint_period_help='recorded only: Spark checkpoints every micro-batch')
    parser.add_argument('--spark_master', default=None, help='default local[PARALLELISM]')
    parser.add_argument('--max_files_per_trigger', type=int,
                        default=DEFAULT_MAX_FILES_PER_TRIGGER)
    known, rest = parser.parse_known_args(argv)
    config, unknown = NexmarkConfig.from_args(rest)
    if unknown:
        parser.error(f'unknown arguments: {" ".join(unknown)}')
    return known, config


def check_args(args: argparse.Namespace) -> None:
    """Raises ValueError saying what is wrong with the options and what to do."""
    check_supported(args.variant, args.query)
    if args.parallelism < 1 or args.max_files_per_trigger < 1:
        raise ValueError('--parallelism and --max_files_per_trigger must be at least 1')
    if not os.path.isdir(args.events_dir):
        if not args.ready_file:
            raise ValueError(f'--events_dir {args.events_dir} is not a directory: write the '
                             'events first (stream_files.write_event_files)')
        os.makedirs(args.events_dir)  # fed after the ready file (stream_files.feed)
    if args.checkpoint_dir and os.path.isdir(args.checkpoint_dir) and os.listdir(
            args.checkpoint_dir):
        raise ValueError(f'--checkpoint_dir {args.checkpoint_dir} is not empty: give a new '
                         'directory (a finished stream cannot be resumed)')
    for path in (args.records, args.summary, args.ready_file):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def error_line(error: BaseException, limit: int = 300) -> str:
    """`error` on one line: its type and the first line of its message (Spark puts the
    cause there, the plan after it)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f'{type(error).__name__}: {lines[0] if lines else ""}'
    return text if len(text) <= limit else text[:limit - 3] + '...'


def report_failure(args: argparse.Namespace, error: str, code: int, **summary: Any) -> int:
    """Writes the failed run's summary (if its directory exists) and the one-line error
    on stderr; returns the exit code."""
    try:
        stream_files.write_summary(args.summary, error=error, **summary)
    except OSError:
        pass  # the error line below still says what went wrong
    print(f'error: Q{args.query} ({args.variant}): {error}', file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None, session: Any = None) -> int:
    """Runs the program; `session`: an active SparkSession to share (tests), else a new
    one, stopped at the end. Exit code 0; 2 for bad options, 1 for a failed run, each
    with a one-line error on stderr and in the summary."""
    args, config = parse_args(argv)
    extra: dict[str, Any] = {}
    if args.checkpoint_period_s is not None:
        extra['checkpoint_period_s'] = args.checkpoint_period_s
    try:
        check_args(args)
    except ValueError as e:
        return report_failure(args, str(e), 2, events=0, wall_s=0.0, setup_s=0.0, **extra)
    setup_start, setup_s = time.perf_counter(), 0.0
    spark = None
    try:
        spark = spark_session(args.spark_master or f'local[{args.parallelism}]',
                              args.parallelism, args.variant, session)
        setup_s = time.perf_counter() - setup_start
        outcome = run_stream(spark, args, config)
    except Exception as e:  # noqa: BLE001 - any failure is reported in the summary
        return report_failure(args, error_line(e), 1, events=0, wall_s=0.0,
                              setup_s=setup_s, **extra)
    finally:
        if session is None and spark is not None:
            spark.stop()
    if args.checkpoint_dir:
        extra['checkpoints'] = outcome.batches
    stream_files.write_summary(args.summary, events=outcome.events, wall_s=outcome.wall_s,
                               setup_s=setup_s, **extra)
    print(f'Q{args.query} ({args.variant}): {outcome.events} events, {outcome.records} '
          f'records, {outcome.batches} micro-batches in {outcome.wall_s:.1f} s',
          file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
