"""The streaming comparison's event stream and output records, shared by every system.

Every system of the streaming comparison (`benchmarks.compare`: this runner, Spark
Structured Streaming, PyFlink) reads the same events the same way a user's streaming job
reads files landing in a directory:

* **Events**: those of a NEXMark configuration, in emission order (`generator.wallclock_order`:
  event times rise up to the out-of-order bound; position order would repeat the stream's
  whole time span once per timeline block), one JSON object per line
  in Beam's launcher format (`event_file.json_line`: the model's fields in camel case, times
  in ms; a person has `emailAddress`, an auction `itemName`, a bid `bidder`), in files of
  `events_per_file` events named `events-000000.jsonl`, ... so that names sort in stream
  order, each written to a temporary name outside the stream's name pattern first and
  renamed (a reader never sees half a file). Names starting with `_` or `.` are not events
  (Spark's file source skips them too).
* **End of stream**: after the last events file, `END_FILE` holds one sentinel bid
  (auction `END_AUCTION`) whose event time lies `END_GAP_MS` past the last event's, so an
  engine whose watermark only follows the data (Spark's file source) closes every window.
  Every program drops the sentinel right after it has taken its event time into the
  watermark; none of its outputs may come from it. A program knows it has read everything
  when it has read the end file; `num_events` tells how many events came before it.
* **Watermarks**: events arrive out of order by at most `out_of_order_bound_ms(config)`
  (`sources.out_of_order_bound_ms`); a program's watermark delay is that bound.
* **As fast as possible**: every file is in the directory before the program starts.
  **At a fixed rate** (latency runs): the program first writes its `--ready_file` once its
  stream is running; then `feed` generates the events with wall-clock event times from
  then on (`sweep.nexmark_latency_config`) and moves each file of `FEED_SECONDS` of events
  into the directory when its last event is due, and the end file once the last window an
  event falls in has ended, so no event can be read before its own event time, no window
  closes before its end, and every output's latency is the wall time it reached the sink
  minus the event time it stands for.

What a program writes back:

* **Records** (`--records`, JSON lines): one per output element, the `flink_baselines`
  record `{"element": E, "window": W, "timestamp": T}` plus `"emitted"`, the wall time
  (`time.time()`, s) the output reached the sink. `native.flink_record_line` turns a
  record into the launcher's canonical line, compared with the batch reference.
* **Summary** (`--summary`, one JSON object): `{"events": N, "wall_s": S, "setup_s": U}`,
  S from the moment the stream started (after the session or job set-up, U) to the last
  output written; `"checkpoints"` (how many the engine completed, when it says) and
  `"error"` (a string, when the run failed) optional.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.event_file import json_line
from benchmarks.nexmark.generator import event_at, wallclock_order

EVENTS_PATTERN = 'events-{:06d}.jsonl'
END_FILE = 'events-999999-end.jsonl'
END_AUCTION = -1
END_GAP_MS = 24 * 3600 * 1000
FEED_SECONDS = 0.1


@dataclass(frozen=True)
class EventFiles:
    """A directory of event files: how many events, and the last event time (ms)."""

    directory: str
    num_events: int
    files: int
    last_event_ms: int


def end_line(last_event_ms: int) -> str:
    """The sentinel bid of the end file, `END_GAP_MS` after `last_event_ms`."""
    return json.dumps({'auction': END_AUCTION, 'bidder': END_AUCTION, 'price': 0,
                       'channel': 'end', 'url': 'end', 'dateTime': last_event_ms + END_GAP_MS,
                       'extra': ''}, separators=(',', ':'))


def is_end_event(fields: dict[str, Any]) -> bool:
    """Whether a parsed JSON event (its camel-case fields) is the sentinel."""
    return fields.get('auction') == END_AUCTION and 'bidder' in fields


def add_program_arguments(parser: argparse.ArgumentParser,
                          queries: tuple[int, ...] | None = None,
                          checkpoint_period_help: str | None = None) -> None:
    """The options of every streaming program of the comparison (the interface above)."""
    parser.add_argument('--query', type=int, required=True, choices=queries)
    parser.add_argument('--events_dir', required=True, help='the event files, read as a stream')
    parser.add_argument('--records', required=True, help='output records (JSON lines)')
    parser.add_argument('--summary', required=True, help='summary (JSON)')
    parser.add_argument('--checkpoint_dir', default=None)
    parser.add_argument('--checkpoint_period_s', type=float, default=None,
                        help=checkpoint_period_help)
    parser.add_argument('--ready_file', default=None,
                        help='fixed rate: written once the stream runs, then fed')
    parser.add_argument('--parallelism', type=int, default=2)


def checkpoint_arguments_error(args: argparse.Namespace) -> str | None:
    """What is wrong with a program's checkpoint options, if anything: both or neither."""
    if (args.checkpoint_dir is None) != (args.checkpoint_period_s is None):
        return ('--checkpoint_dir and --checkpoint_period_s go together: give both '
                '(checkpoints on) or neither (off)')
    if args.checkpoint_period_s is not None and args.checkpoint_period_s <= 0:
        return (f'--checkpoint_period_s must be > 0, got {args.checkpoint_period_s}; leave '
                'out both checkpoint options to turn checkpoints off')
    return None


def _write_file(directory: str, name: str, lines: list[str], not_before_ns: int = 0) -> str:
    tmp = os.path.join(directory, '.' + name + '.tmp')
    with open(tmp, 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines) + '\n')
    if os.stat(tmp).st_mtime_ns < not_before_ns:
        os.utime(tmp, ns=(not_before_ns, not_before_ns))
    path = os.path.join(directory, name)
    os.replace(tmp, path)
    return path


def _write_end_file(directory: str, last_ms: int, last_events_path: str | None) -> None:
    """The end file, modified in a later millisecond than the last events file: Spark's
    file source takes files in order of modification time in ms, ties in listing order,
    and an end file read in a micro-batch before the last events file would let the
    watermark pass that file's windows before its events arrive."""
    not_before_ns = 0
    if last_events_path is not None:
        not_before_ns = (os.stat(last_events_path).st_mtime_ns // 1_000_000 + 1) * 1_000_000
    _write_file(directory, END_FILE, [end_line(last_ms)], not_before_ns)


def _chunks(config: NexmarkConfig, events_per_file: int) -> Iterator[tuple[list[str], int]]:
    """The events of `config` as (JSON lines, last event time in ms) per file."""
    lines: list[str] = []
    last_ms = 0
    for position in wallclock_order(config):
        event = event_at(config, position)
        lines.append(json_line(event.event))
        last_ms = max(last_ms, event.timestamp.micros // 1000)
        if len(lines) == events_per_file:
            yield lines, last_ms
            lines = []
    if lines:
        yield lines, last_ms


def write_event_files(config: NexmarkConfig, directory: str,
                      events_per_file: int = 20_000) -> EventFiles:
    """Writes every event of `config`, then the end file, into `directory` (created)."""
    os.makedirs(directory, exist_ok=True)
    count = files = last_ms = 0
    last_path = None
    for index, (lines, chunk_last_ms) in enumerate(_chunks(config, events_per_file)):
        last_path = _write_file(directory, EVENTS_PATTERN.format(index), lines)
        count, files, last_ms = count + len(lines), files + 1, max(last_ms, chunk_last_ms)
    _write_end_file(directory, last_ms, last_path)
    return EventFiles(directory, count, files, last_ms)


def wait_for(path: str, timeout_s: float, alive: Any = None) -> bool:
    """Waits until `path` exists (True), `timeout_s` passes or `alive()` is false (False)."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline or (alive is not None and not alive()):
            return False
        time.sleep(0.05)
    return True


def feed(config: NexmarkConfig, directory: str, rate: float) -> EventFiles:
    """Writes the events of `config` (wall-clock event times, generated at `rate`) into
    `directory` as they become due: a file of `FEED_SECONDS` of events when its last
    event is due, then the end file once the last window an event can fall in has ended
    (a stream going on would close it no earlier, so no output's latency comes out below
    zero). Returns when every file is in."""
    os.makedirs(directory, exist_ok=True)
    per_file = max(1, round(rate * FEED_SECONDS))
    count = files = last_ms = 0
    last_path = None
    for index, (lines, chunk_last_ms) in enumerate(_chunks(config, per_file)):
        _sleep_until(chunk_last_ms / 1000)
        last_path = _write_file(directory, EVENTS_PATTERN.format(index), lines)
        count, files, last_ms = count + len(lines), files + 1, max(last_ms, chunk_last_ms)
    _sleep_until((last_ms + config.window_size_sec * 1000) / 1000)
    _write_end_file(directory, last_ms, last_path)
    return EventFiles(directory, count, files, last_ms)


def _sleep_until(wall_s: float) -> None:
    delay = wall_s - time.time()
    if delay > 0:
        time.sleep(delay)


def write_record(f: Any, record: dict[str, Any]) -> None:
    """Appends one output record (with its `emitted` time) to an open JSON-lines file."""
    f.write(json.dumps(record, separators=(',', ':')) + '\n')


def read_records(path: str) -> list[dict[str, Any]]:
    """The records a program wrote to `path` (none when it wrote no file)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding='utf-8') as f:
        return [json.loads(line) for line in f if line.strip()]


def latency_s(record: dict[str, Any]) -> float | None:
    """An output's latency at a fixed rate: `emitted` minus the time it stands for, its
    window's end for a windowed output whose timestamp is in the window (Q5, Q7), its own
    event time in the global window (Q0); None for an output stamped at the end of the
    global window (no event time: Q3's join)."""
    window, timestamp = record['window'], record['timestamp']
    if window is None:
        return None if timestamp == 'end' else record['emitted'] - timestamp / 1e6
    created = window[1] / 1000
    if timestamp != 'end':
        created = max(created, timestamp / 1e6)
    return record['emitted'] - created


def write_summary(path: str, **summary: Any) -> None:
    """The program's summary (see the module docstring)."""
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(summary, f)
