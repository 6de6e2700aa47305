"""One streaming run of the comparison: a system's program over the events directory,
timed, its peak memory sampled, its output judged against the batch reference.

As fast as possible, every events file is in the directory before the program starts
and throughput is the events over the program's own `wall_s` (from its stream's start
to its last output, so each engine's start-up is left out alike). At a fixed rate the
program first says it is ready, then `stream_files.feed` writes the events with
wall-clock event times as they fall due, and each output's latency is the wall time it
reached the sink minus the event time it stands for (`stream_files.latency_s`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks.compare.memory import PeakMemory
from benchmarks.compare.systems import StreamingSystem
from benchmarks.nexmark import stream_files
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.native import flink_record_line
from benchmarks.nexmark.verdicts import RunResult, equality_verdict, first_line

READY_TIMEOUT_S = 300.0


@dataclass
class StreamRow:
    """A row of the streaming tables."""

    query: int
    system: str
    checkpoints: bool
    rate: float | None  # None: as fast as possible
    events: int = 0
    wall_s: float = 0.0
    events_per_s: float = 0.0
    peak_mb: float = 0.0
    outputs: int = 0
    equal: str = ''
    note: str = ''
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    checkpoints_done: int | None = None

    @property
    def ok(self) -> bool:
        return self.equal.startswith('yes')


def config_args(config: NexmarkConfig) -> list[str]:
    """The options that make `config` again (`NexmarkConfig.from_args`), defaults left
    out and the base time too (a program reads event times from the files)."""
    default = NexmarkConfig()
    return [f'--{field.name}={getattr(config, field.name)}'
            for field in dataclasses.fields(NexmarkConfig)
            if field.name != 'base_time_ms'
            and getattr(config, field.name) != getattr(default, field.name)]


def _checkpoint_args(work_dir: str, period_s: float | None) -> list[str]:
    if period_s is None:
        return []
    directory = os.path.join(work_dir, 'checkpoints')
    shutil.rmtree(directory, ignore_errors=True)
    return [f'--checkpoint_dir={directory}', f'--checkpoint_period_s={period_s:g}']


def _stop(process: subprocess.Popen) -> None:
    """Kills the program and every process it started (its own session)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _log_tail(path: str) -> str:
    with open(path, encoding='utf-8', errors='replace') as f:
        lines = [line.strip() for line in f if line.strip()]
    return first_line(lines[-1]) if lines else 'no output'


def run_program(system: StreamingSystem, query: int, run_args: Sequence[str],
                log_path: str, timeout_s: float, ready_file: str | None = None,
                feed: Callable[[], object] | None = None) -> tuple[str, float]:
    """Runs the program to its end: ('' or why it failed, peak MB of its processes).
    With `feed`, called once the program has written `ready_file`."""
    with open(log_path, 'w', encoding='utf-8') as log, PeakMemory() as peak:
        process = subprocess.Popen(system.command(query, run_args), stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        deadline = time.monotonic() + timeout_s
        try:
            if feed is not None:
                assert ready_file is not None
                if not stream_files.wait_for(ready_file, READY_TIMEOUT_S,
                                             alive=lambda: process.poll() is None):
                    _stop(process)
                    return f'not ready after {READY_TIMEOUT_S:.0f} s', peak.mb
                feed()
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop(process)
            return f'timeout after {timeout_s:.0f} s', peak.mb
        except BaseException:
            _stop(process)
            raise
    if process.returncode != 0:
        return f'exit {process.returncode}: {_log_tail(log_path)}', peak.mb
    return '', peak.mb


def records_verdict(query: int, system: str, records: list[dict], reference: RunResult,
                    config: NexmarkConfig) -> tuple[str, str]:
    """(verdict, note) of a program's records against the batch `reference`: `yes...`
    when equal, or different only as Beam's model allows a streaming run and the verdict
    checked (Q3's last panes, never fired in streaming: `yes (unfired last panes)`, as the
    sweep counts it); `failed: empty output` without any record."""
    lines = sorted(flink_record_line(record) for record in records)
    if not lines:
        return 'failed: empty output', ''
    tested = RunResult(query, system, config.num_events, ok=True, lines=lines,
                       output_count=len(lines))
    equal, note = equality_verdict(query, tested, reference, config, streaming=True)
    if equal.startswith('no ('):
        equal = 'yes (' + equal[len('no ('):]
    return equal, note


def judge(row: StreamRow, records: list[dict], reference: RunResult,
          config: NexmarkConfig) -> None:
    """Fills `row`'s verdict from the records against the batch `reference`."""
    row.outputs = len(records)
    row.equal, row.note = records_verdict(row.query, row.system, records, reference, config)


def latencies(records: list[dict]) -> tuple[float | None, float | None]:
    """(p50, p99) in seconds of the records' latencies, None without any."""
    values = sorted(v for v in map(stream_files.latency_s, records) if v is not None)
    if not values:
        return None, None
    if len(values) == 1:
        return values[0], values[0]
    cuts = statistics.quantiles(values, n=100, method='inclusive')
    return cuts[49], cuts[98]


def run_stream(system: StreamingSystem, query: int, config: NexmarkConfig,
               events_dir: str, work_dir: str,
               reference: Callable[[NexmarkConfig], RunResult], timeout_s: float,
               checkpoint_period_s: float | None, rate: float | None = None) -> StreamRow:
    """One run of `system` on `query` over the events of `config` (see the module
    docstring), judged against `reference(config)`. As fast as possible the files must
    already be in `events_dir`; at a `rate`, `config` is made a wall-clock config
    (`sweep.nexmark_latency_config`) when the program is ready, and fed."""
    from benchmarks.sweep import nexmark_latency_config

    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    row = StreamRow(query, system.name, checkpoint_period_s is not None, rate)
    records_path = os.path.join(work_dir, 'records.jsonl')
    summary_path = os.path.join(work_dir, 'summary.json')
    ready_file = os.path.join(work_dir, 'ready') if rate else None
    if rate:
        # The windows and rates the fed events will have; their base time comes later.
        config = nexmark_latency_config(config, rate)
        shutil.rmtree(events_dir, ignore_errors=True)
        os.makedirs(events_dir)  # empty until the program is ready
    run_args = [f'--events_dir={events_dir}', f'--records={records_path}',
                f'--summary={summary_path}', *config_args(config),
                *_checkpoint_args(work_dir, checkpoint_period_s)]
    fed: list[NexmarkConfig] = []

    def feed() -> None:
        assert rate is not None
        fed.append(nexmark_latency_config(config, rate))
        stream_files.feed(fed[0], events_dir, rate)

    if ready_file:
        run_args.append(f'--ready_file={ready_file}')
    error, row.peak_mb = run_program(system, query, run_args,
                                     os.path.join(work_dir, 'log.txt'), timeout_s,
                                     ready_file, feed if rate else None)
    summary = {}
    if os.path.exists(summary_path):
        with open(summary_path, encoding='utf-8') as f:
            summary = json.load(f)
    error = error or summary.get('error', '')
    if error:
        row.equal = f'failed: {error}'
        return row
    row.events, row.wall_s = int(summary['events']), float(summary['wall_s'])
    row.events_per_s = row.events / row.wall_s if row.wall_s > 0 else 0.0
    row.checkpoints_done = summary.get('checkpoints')
    records = stream_files.read_records(records_path)
    judged = fed[0] if fed else config
    judge(row, records, reference(judged), judged)
    if rate:
        row.latency_p50_s, row.latency_p99_s = latencies(records)
    return row
