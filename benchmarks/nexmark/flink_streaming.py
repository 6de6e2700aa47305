"""PyFlink streaming programs of the streaming comparison: NEXMark over a directory of files.

The PyFlink side of `benchmarks.compare` (`stream_files` is the contract): a STREAMING job
reads the event files of `--events_dir`, computes a NEXMark query with event-time windows
and writes one record per output to `--records`, then a summary. Two variants:

* `--variant=datastream` (`flink_streaming_datastream`): the Python DataStream API as a PyFlink user
  writes it: lines parsed by `json.loads` in Python, timestamps and a bounded
  out-of-orderness watermark (`sources.out_of_order_bound_ms`), Python event-time windows
  and keyed process functions, mirroring `flink_baselines` (and Beam's queries) so the
  outputs equal Beam's: Q0, Q1, Q2, Q3, Q5, Q7, Q8.
* `--variant=sql` (`flink_streaming_sql`): Flink SQL, JVM-native up to the sink: Q0,
  Q1, Q2, Q5, Q7, Q8 (its docstring says why not Q3 and Q4).

It runs with the PyFlink virtualenv's python (`.venv-flink`, apache-beam <= 2.61):

    .venv-flink/bin/python -m benchmarks.nexmark.flink_streaming --variant=datastream \\
        --query=5 --events_dir=DIR --records=R.jsonl --summary=S.json [--ready_file=F] \\
        [--checkpoint_dir=D --checkpoint_period_s=10] [--parallelism=2] [--num_events=N ...]

**Reading the files in order.** Flink's `FileSource` hands a directory's files to its
readers in hash order (its enumerator lists the directory unsorted and its split
assigner keeps a HashSet): measured on 20 files, 17,000 of 20,001 events came after a
watermark already past them, so event-time windows would drop them. PyFlink 2.x offers no
ordered split assigner, so both variants read with Flink's file monitoring source
(`StreamExecutionEnvironment.readFile`, the Java source behind PyFlink 1.x's
`read_text_file`, called through the Java gateway): one monitoring task forwards the
files' splits in modification-time order (= name order: files are renamed into the
directory in stream order) to two reader tasks, round robin, so each reader reads
its files in stream order and the watermark, the minimum over the readers, never passes
an unread event. Bounded (`PROCESS_ONCE`) when every file is there; with `--ready_file`
it monitors the directory (`PROCESS_CONTINUOUSLY`, every `MONITOR_INTERVAL_MS`).

**End of stream.** The sentinel of the end file is dropped right after the watermark
generator; a marker with its event time goes straight to the sink, which sets an
event-time timer at the watermark the sentinel brings: it fires once every window's
output reached the sink (a watermark leaves each operator after the outputs it fires),
and the sink flushes and signals the client (a flag file). Bounded, the job then ends by
itself. Monitored, the reader that did not read the end file would hold the watermark
back forever (`with_idleness` did not help: tried with 1 s, the sink's watermark stayed
at that reader's last one), so once the sink has seen the marker (the end file is read,
and so, being the newest, every file before it was handed to a reader) the client stops
the job with a drained savepoint (`stop-with-savepoint --drain`): the readers finish
their files, the last watermark fires every window and timer, then the job ends.

**Start and readiness.** Python functions open at their first element, so in the
monitored mode a primer line per parse function (from a small collection source) goes
through the parse functions to the sink; once the sink has seen them all, the client
writes the ready file. `wall_s` runs from the stream's start (the ready file; bounded:
the first parse function's opening for the datastream variant, the job's RUNNING state
for SQL, whose JVM operators start without Python) to the sink's end signal.

**Checkpoints**: with `--checkpoint_dir` and `--checkpoint_period_s`, exactly-once
checkpoints every P s in that directory, kept (`RETAIN_ON_CANCELLATION`, all retained)
so that `checkpoints` in the summary is the number of `chk-*` directories completed.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.flink_stream_io import environment, read_flag, write_flag
from benchmarks.nexmark.flink_streaming_datastream import QUERIES as DATASTREAM
from benchmarks.nexmark.flink_streaming_datastream import build_datastream
from benchmarks.nexmark.flink_streaming_sql import SQL_QUERIES, build_sql
from benchmarks.nexmark.stream_files import (
    END_FILE,
    add_program_arguments,
    checkpoint_arguments_error,
    write_summary,
)

VARIANTS = ('datastream', 'sql')
POLL_S = 0.05
# A line naming a Java or Python exception: `java.lang.Foo: ...`, `FooError: ...`.
EXCEPTION_LINE = re.compile(r'^[\w.$]*(Exception|Error)\b: ')


@dataclass
class Options:
    """The command line (see the module docstring)."""

    variant: str
    query: int
    events_dir: str
    records: str
    summary: str
    checkpoint_dir: str | None
    checkpoint_period_s: float | None
    ready_file: str | None
    parallelism: int
    timeout_s: float
    config: NexmarkConfig


def parse_options(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog='python -m benchmarks.nexmark.flink_streaming')
    parser.add_argument('--variant', choices=VARIANTS, required=True)
    add_program_arguments(parser)
    parser.add_argument('--timeout_s', type=float, default=3600.0,
                        help='give up (exit 1) when the stream has not ended by then')
    known, rest = parser.parse_known_args(argv)
    config, unknown = NexmarkConfig.from_args(rest)
    if unknown:
        parser.error(f'unknown arguments: {unknown}')
    if error := checkpoint_arguments_error(known):
        parser.error(error)
    if not os.path.isdir(known.events_dir):
        parser.error(f'--events_dir {known.events_dir} is not a directory: write the events '
                     'first (stream_files.write_event_files or feed)')
    if known.ready_file is None and not os.path.exists(
            os.path.join(known.events_dir, END_FILE)):
        parser.error(f'--events_dir {known.events_dir} has no {END_FILE}: without '
                     '--ready_file every file must be there at start')
    supported = tuple(DATASTREAM if known.variant == 'datastream' else SQL_QUERIES)
    if known.query not in supported:
        parser.error(f'no {known.variant} program for Q{known.query} (have '
                     f'{", ".join(f"Q{q}" for q in supported)})')
    return Options(known.variant, known.query, known.events_dir, known.records,
                   known.summary, known.checkpoint_dir, known.checkpoint_period_s,
                   known.ready_file, known.parallelism, known.timeout_s, config)


def wait_until(condition: Callable[[], bool], job_client: Any, deadline: float,
               what: str) -> None:
    """Polls `condition` until true; raises when the job stopped or `deadline` passed."""
    while not condition():
        status = str(job_client.get_job_status().result())
        if status in ('FAILED', 'CANCELED', 'FINISHED') and not condition():
            if status == 'FAILED':
                job_client.get_job_execution_result().result()  # raises the job's error
            raise RuntimeError(f'the job ended ({status}) before {what}')
        if time.monotonic() > deadline:
            raise TimeoutError(f'no {what} within the timeout')
        time.sleep(POLL_S)


def wait_for_start(job_client: Any, deadline: float) -> float:
    """Waits until the job left CREATED/INITIALIZING; the time it did."""
    def started() -> bool:
        return str(job_client.get_job_status().result()) not in ('CREATED', 'INITIALIZING')
    wait_until(started, job_client, deadline, 'job start')
    return time.time()


def run(options: Options) -> dict[str, Any]:
    """Builds and runs the job; the summary's fields."""
    started = time.time()
    continuous = options.ready_file is not None
    flags_dir = tempfile.mkdtemp(prefix='flink-streaming-')
    try:
        open(options.records, 'w', encoding='utf-8').close()
        env = environment(options.parallelism, options.checkpoint_dir,
                          options.checkpoint_period_s)
        if options.variant == 'datastream':
            primers = build_datastream(env, options.query, options.config, options.events_dir,
                                      continuous, options.records, flags_dir)
        else:
            primers = build_sql(env, options.query, options.config, options.events_dir,
                               continuous, options.records, flags_dir)
        job_client = env.execute_async(f'nexmark-q{options.query}-flink-{options.variant}')
        deadline = time.monotonic() + options.timeout_s
        running = wait_for_start(job_client, deadline)
        if continuous:
            wait_until(lambda: read_flag(flags_dir, f'primed-{primers}') is not None,
                       job_client, deadline, 'the primers at the sink')
            running = time.time()
            write_flag(os.path.dirname(os.path.abspath(options.ready_file)),
                       os.path.basename(options.ready_file))
        if continuous:
            # The end file was read: drain the job (module docstring).
            wait_until(lambda: read_flag(flags_dir, 'end-seen') is not None, job_client,
                       deadline, 'the end file')
            drain(job_client, os.path.join(flags_dir, 'savepoint'))
        wait_until(lambda: read_flag(flags_dir, 'done') is not None, job_client, deadline,
                   'end of stream')
        if options.variant == 'datastream' and not continuous:
            # The stream starts when the first parse function opens, at its first line.
            running = min(read_flag(flags_dir, os.path.basename(p))['time']
                          for p in glob.glob(os.path.join(flags_dir, 'opened-parse-*')))
        done = read_flag(flags_dir, 'done')
        job_client.get_job_execution_result().result()
        summary: dict[str, Any] = {
            'events': options.config.num_events, 'wall_s': done['time'] - running,
            'setup_s': running - started}
        if options.checkpoint_dir:
            summary['checkpoints'] = count_checkpoints(options.checkpoint_dir,
                                                       str(job_client.get_job_id()))
        return summary
    finally:
        shutil.rmtree(flags_dir, ignore_errors=True)


def drain(job_client: Any, savepoint_dir: str) -> None:
    """Stop-with-savepoint --drain: the sources stop after their pending splits and send
    the last watermark, which fires every window and timer. (PyFlink 2.3's
    `JobClient.stop_with_savepoint` calls a Java method that no longer exists, so the Java
    client is called directly.)"""
    from pyflink.java_gateway import get_gateway
    format_type = get_gateway().jvm.org.apache.flink.core.execution.SavepointFormatType
    job_client._j_job_client.stopWithSavepoint(
        True, 'file://' + savepoint_dir, format_type.CANONICAL).get()


def count_checkpoints(checkpoint_dir: str, job_id: str) -> int:
    """The completed checkpoints the job left (`chk-N` directories, all retained)."""
    return len(glob.glob(os.path.join(checkpoint_dir, job_id, 'chk-*')))


def error_line(error: BaseException) -> str:
    """One line naming a failure's cause: a Java error's innermost `Caused by`, else its
    first exception line, else the message's first line."""
    lines = [line.strip(': \t') for line in str(error).splitlines() if line.strip(': \t')]
    causes = [line[len('Caused by: '):] for line in lines if line.startswith('Caused by: ')]
    exceptions = [line for line in lines if EXCEPTION_LINE.search(line)]
    line = causes[-1] if causes else (exceptions or lines or [''])[0]
    return f'{type(error).__name__}: {line[:300]}'


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    try:
        summary = run(options)
    except Exception as e:  # noqa: BLE001 - any failure is the run's error, said once
        traceback.print_exc()
        message = error_line(e)
        write_summary(options.summary, events=options.config.num_events, wall_s=0.0,
                      setup_s=0.0, error=message)
        print(f'flink_streaming Q{options.query} ({options.variant}) failed: {message}',
              file=sys.stderr)
        return 1
    write_summary(options.summary, **summary)
    print(f'Q{options.query} ({options.variant}): {summary}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
