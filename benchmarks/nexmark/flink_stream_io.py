"""The PyFlink streaming programs' shared parts: reading the event files in order, parsing
lines, the records sink, the environment (`flink_streaming`'s docstring says why each is
as it is: the file order, end of stream, readiness, checkpoints)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.sources import out_of_order_bound_ms
from benchmarks.nexmark.stream_files import is_end_event, write_record

try:  # only the PyFlink virtualenv has pyflink; the definitions below need its base classes
    from pyflink.datastream.functions import KeyedProcessFunction, MapFunction
except ImportError:  # pragma: no cover - outside the venv only the helpers are importable
    KeyedProcessFunction = MapFunction = object

MONITOR_INTERVAL_MS = 50
# What the parse function says a line is; the primer line (not JSON) tests readiness.
EVENT, END, PRIME = 0, 1, 2
PRIME_LINE = '#prime'
# JSON (camel case, ms) -> model attribute (flink_baselines.model_fields: snake, micros).
CAMEL_TO_SNAKE = {'emailAddress': 'email_address', 'creditCard': 'credit_card',
                  'dateTime': 'date_time', 'itemName': 'item_name',
                  'initialBid': 'initial_bid'}
TIME_FIELDS = ('dateTime', 'expires')

# ---------------------------------------------------------------- events and records


def model_fields(event: dict[str, Any]) -> dict[str, Any]:
    """A parsed JSON event's fields as `flink_baselines.model_fields` gives the model's."""
    return {CAMEL_TO_SNAKE.get(k, k): (v * 1000 if k in TIME_FIELDS else v)
            for k, v in event.items()}


def event_kind(event: dict[str, Any]) -> str:
    """`Bid`, `Auction` or `Person`: the model class of a parsed JSON event."""
    if 'bidder' in event:
        return 'Bid'
    return 'Auction' if 'itemName' in event else 'Person'


class ParseLine(MapFunction):
    """A line -> (event time ms, EVENT/END/PRIME, parsed event): `json.loads` (Q0: Beam's
    own parser, whose model objects Q0 sends through their coder). Its `open` (at the first
    line) writes an `opened-*` flag: the stream's start."""

    def __init__(self, beam_model: bool, flags_dir: str) -> None:
        self._beam_model = beam_model
        self._flags_dir = flags_dir

    def open(self, runtime_context: Any) -> None:
        write_flag(self._flags_dir, f'opened-parse-{runtime_context.get_index_of_this_subtask()}')
        if self._beam_model:
            from benchmarks.nexmark.event_file import parse_line
            self._parse_line = parse_line

    def map(self, line: str) -> tuple[int, int, Any]:
        if line == PRIME_LINE:
            return 0, PRIME, None  # time 0: moves no watermark
        if self._beam_model:
            parsed = self._parse_line(line)
            x = parsed.event
            end = type(x).__name__ == 'Bid' and is_end_event(vars(x))
            return parsed.timestamp_ms, END if end else EVENT, x
        event = json.loads(line)
        return event['dateTime'], END if is_end_event(event) else EVENT, event


# ---------------------------------------------------------------- the sink


def write_flag(flags_dir: str, name: str, payload: Any = None) -> None:
    """A flag file for the client (written whole through a rename)."""
    tmp = os.path.join(flags_dir, f'.{name}.tmp')
    with open(tmp, 'w', encoding='utf-8') as f:
        json.dump({'time': time.time(), 'payload': payload}, f)
    os.replace(tmp, os.path.join(flags_dir, name))


def read_flag(flags_dir: str, name: str) -> dict[str, Any] | None:
    path = os.path.join(flags_dir, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding='utf-8') as f:
        return json.load(f)


class RecordSink(KeyedProcessFunction):
    """Writes ('R', record) with its `emitted` time; on ('E', sentinel time ms) sets an
    event-time timer at the watermark the sentinel brings (`end_delay_ms` behind it),
    which fires after every window's output reached this sink: then flushes and writes
    the `done` flag; counts ('P', _) primers in `primed-N` flags. Runs with parallelism 1
    (one records file, one writer)."""

    def __init__(self, records_path: str, flags_dir: str, end_delay_ms: int) -> None:
        self._records_path = records_path
        self._flags_dir = flags_dir
        self._end_delay_ms = end_delay_ms

    def open(self, runtime_context: Any) -> None:
        self._file = open(self._records_path, 'a', encoding='utf-8')
        self._count = self._primed = 0
        write_flag(self._flags_dir, 'opened-sink')

    def process_element(self, value: tuple[str, Any], ctx: Any) -> Iterator[Any]:
        kind, payload = value
        if kind == 'R':
            payload['emitted'] = time.time()
            write_record(self._file, payload)
            self._count += 1
        elif kind == 'P':
            self._primed += 1
            write_flag(self._flags_dir, f'primed-{self._primed}')
        else:
            # The generator's watermark after the sentinel: its time - bound - 1 (SQL's:
            # time - bound); a timer at or below the watermark fires.
            ctx.timer_service().register_event_time_timer(payload - self._end_delay_ms - 1)
            write_flag(self._flags_dir, 'end-seen')
        yield from ()

    def on_timer(self, timestamp: int, ctx: Any) -> Iterator[Any]:
        self._file.flush()
        write_flag(self._flags_dir, 'done', self._count)
        yield from ()

    def close(self) -> None:
        self._file.close()


def to_sink(outputs: Any, markers: Any, primers: Any, records_path: str, flags_dir: str,
            config: NexmarkConfig) -> None:
    """Sends the query's records, the end marker and the primers into one `RecordSink`."""
    tagged = outputs.map(lambda r: ('R', r)).union(markers.map(lambda t: ('E', t)))
    if primers is not None:
        tagged = tagged.union(primers.map(lambda _: ('P', None)))
    (tagged.key_by(lambda v: 0)
     .process(RecordSink(records_path, flags_dir, out_of_order_bound_ms(config)))
     .set_parallelism(1).name('records sink'))


# ---------------------------------------------------------------- the environment


def environment(parallelism: int, checkpoint_dir: str | None,
                checkpoint_period_s: float | None) -> Any:
    """A local Flink environment in STREAMING mode, its Python workers on this python;
    exactly-once checkpoints every `checkpoint_period_s` into `checkpoint_dir`, all kept."""
    from pyflink.common import Configuration
    from pyflink.datastream import (
        CheckpointingMode,
        RuntimeExecutionMode,
        StreamExecutionEnvironment,
    )
    conf = Configuration()
    conf.set_string('python.executable', sys.executable)
    conf.set_string('python.client.executable', sys.executable)
    # Tuned for PyFlink, as its users tune it: bundles of 30,000 (default 100,000) and a
    # state cache of 100,000 keys (default 1,000), measured on 30,000 events: Q5's Python
    # sliding windows 2.1x the events/s of the defaults (23 s -> 11 s), Q3 and Q7 1.1x.
    conf.set_string('python.fn-execution.bundle.size', '30000')
    conf.set_string('python.state.cache-size', '100000')
    if checkpoint_dir:
        conf.set_string('execution.checkpointing.dir',
                        'file://' + os.path.abspath(checkpoint_dir))
        # Kept so the summary can count them (Flink keeps one and deletes the rest).
        conf.set_string('execution.checkpointing.num-retained', '100000')
        conf.set_string('execution.checkpointing.externalized-checkpoint-retention',
                        'RETAIN_ON_CANCELLATION')
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
    env.set_parallelism(parallelism)
    if checkpoint_dir:
        env.enable_checkpointing(int(checkpoint_period_s * 1000),
                                 CheckpointingMode.EXACTLY_ONCE)
    return env


def line_stream(env: Any, events_dir: str, continuous: bool) -> Any:
    """The event files' lines (Java strings), each reader's in stream order (module
    docstring: Flink's file monitoring source, through the Java gateway)."""
    from pyflink.datastream.data_stream import DataStream
    from pyflink.java_gateway import get_gateway
    jvm = get_gateway().jvm
    path = os.path.abspath(events_dir)
    text_format = jvm.org.apache.flink.streaming.api.legacy.io.TextInputFormat(
        jvm.org.apache.flink.core.fs.Path(path))
    modes = jvm.org.apache.flink.streaming.api.functions.source.FileProcessingMode
    mode = modes.PROCESS_CONTINUOUSLY if continuous else modes.PROCESS_ONCE
    return DataStream(env._j_stream_execution_environment.readFile(
        text_format, path, mode, MONITOR_INTERVAL_MS))


def primer_lines(env: Any, count: int) -> Any:
    """`count` primer lines: the monitored mode's readiness probe. Python functions open
    at their first element, so the client writes the ready file once primers went through
    the parse functions (one each, round robin) and the sink (`RecordSink`)."""
    from pyflink.common import Types
    return env.from_collection([PRIME_LINE] * count, type_info=Types.STRING())


def watermark_strategy(config: NexmarkConfig) -> Any:
    """Bounded out-of-orderness by the stream's bound, timestamps from the parsed tuple."""
    from pyflink.common import Duration, WatermarkStrategy
    from pyflink.common.watermark_strategy import TimestampAssigner

    class EventTime(TimestampAssigner):
        def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
            return value[0]

    return (WatermarkStrategy.for_bounded_out_of_orderness(
        Duration.of_millis(out_of_order_bound_ms(config)))
        .with_timestamp_assigner(EventTime()))
