"""The checkpoint overhead figure: streaming throughput with consistent-region checkpoints
off, every 1 s and every 8 s, on the local-directory store and on a real redis-server.

    python -m benchmarks.checkpoint_overhead [--events=N] [--periods=0,1,8] \\
        [--store=file|redis|both] [--repeats=3] [--spark_master=local[2]] [--out DIR]

One invocation runs the same stateful streaming pipeline once per configuration and
repeat, each run in a fresh Python process (`python -m benchmarks.checkpoint_overhead
--run-one ...`: its own JVM and Python workers, the same start-up for all). The
configurations are `--checkpoint_period_s=0` (consistent regions off: the runner keeps
the partitions' keyed state in a temporary local directory and takes no checkpoint, so
no store is used: one configuration, store `-`) and every other period of `--periods`
on every store of `--store`: `file` (`--checkpoint_store` = a fresh directory of its own
under $TMPDIR per run) and `redis` (a `RedisServer` this command starts on 127.0.0.1,
AOF on with `--redis_appendfsync`, default `always` as the tests run it, automatic AOF
rewrites off; before every run its data is flushed and its AOF rewritten, so no run
inherits another's; it is stopped at the end, whatever happens). With regions on, the
partitions' keyed state goes to the checkpoint store every epoch and a checkpoint (a
commit record of every region) every period. The runs are interleaved across repeats
(ABCABC, not AAABBB), so a load on the machine falls on every configuration alike.

The pipeline: `PeriodicImpulse` over past timestamps (event n at `START + INTERVAL_S *
n`, `INTERVAL_S` = 1 ms, so the source is read as fast as the epochs go and the events
span `--events` ms of event time), n keyed by `n % KEYS` (1000 keys), in fixed windows
of `WINDOW_S` (10 s) of event time, then two branches: `CombinePerKey(sum)` of ones,
and a stateful DoFn (`BagCount`: the key's n in a `BagState`, its count in a
`ReadModifyWriteState`, an event-time timer at the window's end that emits both and
clears them), so keyed state of both kinds, combiner state and timers are in every
checkpoint. Both write lines `tag TAB window start (us) TAB key TAB figures` through a
`sink_check.CountingSink` (files of its DoFn instances, read after the run).

Measured per run: `wall_s`, the pipeline's own time from `Pipeline.run()` to the end of
the stream (the SparkSession is started, and its Python workers forked by a tiny Spark
job, before that, so start-up is outside it) and `events_per_s` = events / `wall_s`
(only for a run whose verdict is ok, `sink_check.throughput`); `steady_events_per_s`,
the same from the end of the first epoch by which `STEADY_FROM` (20%) of the events
were read to the end of the last one (timestamps of the runner's progress log lines:
the ramp-up of the epochs' size left out); `process_s`, the child's
whole life; the CPU seconds of the pipeline's run over the driver, its JVM and the
Python workers (`wordcount.CpuClock`); the checkpoints taken, counted from the runner's
log lines `Consistent region ... checkpoint N after epoch E is consistent` (the child
logs `beam_streams_runner` at INFO to its stderr, kept in `OUT/logs/`); the epochs
(`sweep.epochs_of`); the peak RSS of the driver (the child Python process, `ru_maxrss`)
and of its JVM (`VmHWM`); and the log lines at WARNING or above from the runner, and
tracebacks (`log problems`).

Verdict of a run: its output lines (sorted) must equal, and not be empty, those the
generator's definition implies (`expected_lines`, computed here in Python: the same
float arithmetic as `PeriodicImpulse`, the same `Timestamp` rounding and the same
window assignment); a run that failed, or a checkpointing run that took no checkpoint
in two of its periods (or one with checkpoints off that took one), fails. Any failed
run makes the command exit 1.

Report in `--out` (default `benchmarks/results/<date>-checkpoint-overhead/`):
`report.md` (the date, command line, versions of Python, PySpark, Beam and
redis-server, the cores this session got before and after the runs, a table with a row
per configuration: median events/s, its ratio to the median with checkpoints off of this
invocation, every run's events/s, the median steady events/s and its ratio, median wall
and CPU s, checkpoints and epochs taken,
peak RSS of the driver and its JVM, verdict; then every run), `runs.json` (every run's
raw figures) and `overhead.png` (bars of the throughput ratio to checkpoints off, per
period and store, with the spread over repeats). Options this module does not know go
to the runner (`--bundle_size`, `--target_latency_ms`, ...); `--spark_master` defaults
to `local[2]`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import userstate, window
from apache_beam.transforms.periodicsequence import (
    ImpulseSeqGenRestrictionProvider,
    PeriodicImpulse,
)
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

import beam_streams_runner  # noqa: F401 - registers the short runner name
from benchmarks import keyed_state_gc, micro, sink_check, sweep, wordcount
from benchmarks.nexmark import report, verdicts

START = 1_000_000_000.0  # event time of event 0 (2001): long past, read at full speed
INTERVAL_S = 0.001  # event time between two events
KEYS = 1000
WINDOW_S = 10
DEFAULT_EVENTS = 200_000  # 20-40 s a run on local[2] here (300,000: 46 s, machine busy)
STORES = ('file', 'redis')
OFF = '-'  # the store of the configuration with checkpoints off (none is used)
CHECKPOINT_LINE = re.compile(
    r"Consistent region '?(?P<region>[^' ]+)'?: checkpoint (?P<sequence>\d+) after epoch "
    r'(?P<epoch>\d+) is consistent')
# The runner's progress line of an epoch, as `run_one` formats its log records.
EPOCH_LINE = re.compile(
    r'^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO beam_streams_runner\.runner: '
    r'StreamsSparkRunner: epoch (?P<epoch>\d+): (?P<ms>\d+) ms[^;]*; read (?P<reads>[^;]*);',
    re.MULTILINE)
STEADY_FROM = 0.2  # the steady state starts once this share of the events was read
PROBLEM_LINE = re.compile(r'\b(WARNING|ERROR|CRITICAL)\b.*\bbeam_streams_runner\b|^Traceback')
DEFAULT_RUNNER_ARGS = ('--spark_master=local[2]',
                       # Spark's console progress bar would fill the logs.
                       '--spark_conf=spark.ui.showConsoleProgress=false')


# ---------------------------------------------------------------- the events and the reference


def stream_end(events: int) -> float:
    """`PeriodicImpulse`'s stop timestamp for `events` events (half an interval past the
    last one, so the rounding of the end never adds or drops an event)."""
    return START + (events - 0.5) * INTERVAL_S


def generated_events(events: int) -> int:
    """How many events `PeriodicImpulse` emits up to `stream_end(events)`: its own
    restriction's size (`events`, checked by the test)."""
    return ImpulseSeqGenRestrictionProvider().initial_restriction(
        (START, stream_end(events), INTERVAL_S)).stop


def event_index(t: float) -> int:
    """n of the event `PeriodicImpulse` emitted as the value `t` (a float)."""
    return round((float(t) - START) / INTERVAL_S)


def sum_line(key: int, window_start_us: int, count: int) -> str:
    return f'sum\t{window_start_us}\t{key}\t{count}'


def bag_line(key: int, window_start_us: int, count: int, bagged: int, total: int) -> str:
    return f'bag\t{window_start_us}\t{key}\t{count}\t{bagged}\t{total}'


def expected_lines(events: int) -> list[str]:
    """The sorted output of a correct run, from the generator's definition: event n is
    the float `START + INTERVAL_S * n` (as `ImpulseSeqGenDoFn` computes it) at that
    timestamp (`Timestamp.of`), keyed `n % KEYS`, in the fixed window of `WINDOW_S`
    holding it; per window and key, `sum` gives the count and `bag` the count, the
    number of bagged values and their sum."""
    window_us = WINDOW_S * 1_000_000
    counts: Counter = Counter()
    sums: Counter = Counter()
    for n in range(generated_events(events)):
        t = START + INTERVAL_S * n
        micros = Timestamp.of(t).micros
        cell = (event_index(t) % KEYS, micros - micros % window_us)
        counts[cell] += 1
        sums[cell] += event_index(t)
    lines = [sum_line(key, start, c) for (key, start), c in counts.items()]
    lines += [bag_line(key, start, c, c, sums[key, start])
              for (key, start), c in counts.items()]
    return sorted(lines)


# ---------------------------------------------------------------- the pipeline


class BagCount(beam.DoFn):
    """Per key and window: every n in a `BagState`, the count in a `ReadModifyWriteState`;
    an event-time timer at the window's end emits `('bag', key, (count, values, sum))`
    and clears both."""

    VALUES = userstate.BagStateSpec('values', VarIntCoder())
    COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
    END = userstate.TimerSpec('end', TimeDomain.WATERMARK)

    def process(self, element: tuple[int, int], w=beam.DoFn.WindowParam,
                values=beam.DoFn.StateParam(VALUES), count=beam.DoFn.StateParam(COUNT),
                end=beam.DoFn.TimerParam(END)) -> None:
        values.add(element[1])
        count.write((count.read() or 0) + 1)
        end.set(w.max_timestamp())

    @userstate.on_timer(END)
    def flush(self, key=beam.DoFn.KeyParam, values=beam.DoFn.StateParam(VALUES),
              count=beam.DoFn.StateParam(COUNT)):
        bagged = list(values.read())
        yield 'bag', key, (count.read() or 0, len(bagged), sum(bagged))
        values.clear()
        count.clear()


def output_lines(element: tuple[str, int, tuple[int, ...]], w: window.IntervalWindow,
                 timestamp: Timestamp) -> list[str]:
    """The sink's line of an output `(tag, key, figures)` in window `w`."""
    tag, key, figures = element
    line = sum_line if tag == 'sum' else bag_line
    return [line(key, w.start.micros, *figures)]


def build(p: beam.Pipeline, events: int, sink_prefix: str) -> None:
    """The benchmark's pipeline on `p`, its outputs written under `sink_prefix`."""
    keyed = (p
             | 'Events' >> PeriodicImpulse(START, stream_end(events), INTERVAL_S)
             # Typed, so the keys get a deterministic coder (VarInt).
             | 'Key' >> beam.Map(lambda t: (event_index(t) % KEYS, event_index(t))
                                 ).with_output_types(tuple[int, int])
             | 'Window' >> beam.WindowInto(window.FixedWindows(WINDOW_S)))
    sums = (keyed
            | 'One' >> beam.MapTuple(lambda key, n: (key, 1)).with_output_types(
                tuple[int, int])
            | 'Sum' >> beam.CombinePerKey(sum)
            | 'TagSum' >> beam.MapTuple(lambda key, count: ('sum', key, (count,))))
    bags = keyed | 'Bag' >> beam.ParDo(BagCount())
    _ = ((sums, bags)
         | 'Outputs' >> beam.Flatten()
         | 'Write' >> beam.ParDo(sink_check.CountingSink(sink_prefix, output_lines)))


# ---------------------------------------------------------------- one run (the child)


def jvm_peak_rss_mb() -> float:
    """The peak RSS (`VmHWM`) of the JVMs below this process, in MB (0 if none)."""
    children = keyed_state_gc._children()
    pending, kb = list(children.get(os.getpid(), [])), 0
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        if keyed_state_gc._comm(pid) == 'java':
            kb += keyed_state_gc.proc_kb(f'/proc/{pid}/status', 'VmHWM:')
    return round(kb / 1024, 1)


def run_one(events: int, sink_dir: str, runner_args: Sequence[str]) -> dict:
    """Runs the pipeline once in this process (on a SparkSession started, and its Python
    workers forked, first); returns its figures. The output is judged by the parent."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format='%(asctime)s %(levelname)s %(name)s: %(message)s', force=True)
    logging.getLogger('beam_streams_runner').setLevel(logging.INFO)  # the checkpoint lines
    spark = wordcount.spark_session(runner_args)
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).count()  # fork the workers
    p = beam.Pipeline(runner='StreamsSparkRunner',
                      options=PipelineOptions(['--streaming', *runner_args]))
    build(p, events, os.path.join(sink_dir, 'out'))
    cpu = wordcount.CpuClock()
    started = time.monotonic()
    result = p.run()
    state = result.wait_until_finish()
    wall_s = time.monotonic() - started
    return {'state': str(state), 'wall_s': round(wall_s, 3), 'cpu_s': round(cpu.elapsed(), 2),
            'epochs': sweep.epochs_of(result),
            'driver_peak_rss_mb': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                        / 1024, 1),
            'jvm_peak_rss_mb': jvm_peak_rss_mb(),
            'ok': state == PipelineState.DONE}


# ---------------------------------------------------------------- runs (the parent)


@dataclass(frozen=True)
class Config:
    """A configuration: the checkpoint period (0: off) and the store (`OFF` when off)."""

    period_s: float
    store: str

    @property
    def label(self) -> str:
        return 'off' if not self.period_s else f'every {self.period_s:g} s'

    @property
    def name(self) -> str:
        return f'period-{self.period_s:g}-{self.store if self.period_s else "off"}'


def configurations(periods: Sequence[float], stores: Sequence[str]) -> list[Config]:
    """Period 0 once (no store is used), every other period on every store."""
    configs: list[Config] = []
    for period in periods:
        if not period:
            configs.append(Config(0.0, OFF))
        else:
            configs += [Config(period, store) for store in stores]
    return list(dict.fromkeys(configs))


def plan_runs(configs: Sequence[Config], repeats: int) -> list[tuple[Config, int]]:
    """Every (configuration, repeat), interleaved: all configurations of a repeat before
    the next repeat (ABCABC), so machine noise spreads over them evenly."""
    return [(config, repeat) for repeat in range(1, repeats + 1) for config in configs]


def checkpoints_in(log: str) -> list[tuple[str, int, int]]:
    """(region, checkpoint, epoch) of every 'checkpoint N after epoch E is consistent'."""
    return [(m['region'], int(m['sequence']), int(m['epoch']))
            for m in CHECKPOINT_LINE.finditer(log)]


def epochs_in(log: str) -> list[tuple[float, int]]:
    """(wall time s, events read so far) at the end of every epoch, from the runner's
    progress lines."""
    points, read = [], 0
    for m in EPOCH_LINE.finditer(log):
        logged = datetime.datetime.strptime(m['time'], '%Y-%m-%d %H:%M:%S,%f')
        read += sum(int(n) for n in re.findall(r'(\d+) \(', m['reads']))
        points.append((logged.timestamp(), read))
    return points


def steady_rate(log: str, events: int) -> float | str:
    """Events/s from the end of the first epoch by which `STEADY_FROM` of `events` were
    read to the end of the last epoch (the epochs' ramp-up left out); '' if the log has
    too few progress lines."""
    points = epochs_in(log)
    start = next((p for p in points if p[1] >= STEADY_FROM * events), None)
    if start is None or points[-1][0] <= start[0]:
        return ''
    return round((points[-1][1] - start[1]) / (points[-1][0] - start[0]))


def problems_in(log: str) -> list[str]:
    """The runner's log lines at WARNING or above, and tracebacks."""
    return [line.strip() for line in log.splitlines() if PROBLEM_LINE.search(line)]


def checkpoint_verdict(config: Config, checkpoints: int, wall_s: float | None) -> str:
    """'' if the checkpoint count fits the configuration, else why not: with checkpoints
    off, none; on, at least one in a run that lasted two periods."""
    if not config.period_s:
        return f'failed: {checkpoints} checkpoints with checkpoints off' if checkpoints else ''
    if not checkpoints and wall_s and wall_s >= 2 * config.period_s:
        return f'failed: no checkpoint in {wall_s:.1f} s'
    return ''


def run_verdict(child: dict | None, lines: Sequence[str], expected: Sequence[str],
                config: Config, checkpoints: int) -> str:
    """The run's verdict: `yes` if it finished, its output equals `expected` (not empty)
    and its checkpoints fit `config` (`checkpoint_verdict`); else `failed: ...`."""
    if child is None:
        return 'failed: the run left no result'
    if not child.get('ok'):
        return f"failed: the run ended {child.get('state') or child.get('error')}"
    output = sink_check.lines_verdict(lines, expected)
    if not sink_check.is_ok(output):
        return output
    return checkpoint_verdict(config, checkpoints, child.get('wall_s')) or output


class RedisStores:
    """The redis-server the redis configurations share (started on first use, always
    stopped by `close`), emptied before every run."""

    def __init__(self, appendfsync: str) -> None:
        self._appendfsync = appendfsync
        self.server = None

    def url(self) -> str:
        from beam_streams_runner.stores.redis_server import RedisServer
        if self.server is None:
            self.server = RedisServer(appendfsync=self._appendfsync)
            self.server.start()
            client = self.server.client()
            try:
                client.config_set('auto-aof-rewrite-percentage', 0)
            finally:
                client.close()
        self._empty()
        return self.server.url

    def _empty(self) -> None:
        """FLUSHALL and a rewrite of the AOF (waited for): every run starts from nothing."""
        client = self.server.client()
        try:
            client.flushall()
            client.bgrewriteaof()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                info = client.info('persistence')
                if not (info.get('aof_rewrite_in_progress')
                        or info.get('aof_rewrite_scheduled')):
                    break
                time.sleep(0.05)
        finally:
            client.close()

    def version(self) -> str:
        from beam_streams_runner.stores.redis_server import redis_server_binary
        try:
            out = subprocess.run([redis_server_binary(), '--version'], capture_output=True,
                                 text=True, timeout=30).stdout
        except Exception as e:  # noqa: BLE001 - a version we cannot read is said so
            return f'unknown ({type(e).__name__})'
        match = re.search(r'v=(\S+)', out)
        return match.group(1) if match else out.strip()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


@dataclass
class Launched:
    """What a child run left: its figures (None if it wrote none), its log (stdout and
    stderr), the lines its sink wrote, its exit code and life time."""

    child: dict | None
    log_text: str
    lines: list[str]
    exit_code: int
    process_s: float
    log: str  # the log file, relative to --out


def launch(config: Config, repeat: int, events: int, store_url: str | None,
           runner_args: Sequence[str], work: str, logs: str) -> Launched:
    """One run in a fresh Python process (`--run-one`), its log in `logs`."""
    name = f'{config.name}-r{repeat}'
    sink_dir = tempfile.mkdtemp(prefix='sink-', dir=work)
    result_path = os.path.join(work, f'{name}.json')
    args = [f'--checkpoint_period_s={config.period_s:g}']
    if store_url is not None:
        args += [f'--checkpoint_store={store_url}',
                 f'--job_name=checkpoint-overhead-{name}-{uuid.uuid4().hex[:8]}']
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [root, env.get('PYTHONPATH')]))
    # The runner's home (its journal of jobs, default stores) is the invocation's own.
    env['BEAM_STREAMS_RUNNER_HOME'] = os.path.join(work, 'runner-home')
    command = [sys.executable, '-m', 'benchmarks.checkpoint_overhead', '--run-one',
               f'--events={events}', f'--sink={sink_dir}', f'--result={result_path}',
               *args, *runner_args]
    log_path = os.path.join(logs, name + '.log')
    started = time.monotonic()
    with open(log_path, 'w', encoding='utf-8') as log:
        code = subprocess.call(command, cwd=root, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    process_s = round(time.monotonic() - started, 2)
    try:
        with open(result_path, encoding='utf-8') as f:
            child: dict | None = json.load(f)
    except (OSError, ValueError):
        child = None
    with open(log_path, encoding='utf-8', errors='replace') as f:
        log_text = f.read()
    lines = sink_check.read_sink(sink_dir).lines
    shutil.rmtree(sink_dir, ignore_errors=True)
    return Launched(child, log_text, lines, code, process_s,
                    os.path.relpath(log_path, os.path.dirname(logs)))


def run_record(config: Config, repeat: int, events: int, expected: Sequence[str],
               launched: Launched) -> dict:
    """A run's raw figures (a row of `runs.json`), its checkpoints and its verdict."""
    checkpoints = checkpoints_in(launched.log_text)
    verdict = run_verdict(launched.child, launched.lines, expected, config, len(checkpoints))
    child = launched.child or {}
    wall_s = child.get('wall_s')
    return {'config': config.name, 'period_s': config.period_s, 'store': config.store,
            'repeat': repeat, 'exit_code': launched.exit_code,
            'process_s': launched.process_s, 'wall_s': wall_s, 'events': events,
            'events_per_s': sink_check.throughput(verdict, events, wall_s) if wall_s else '',
            'steady_events_per_s': (steady_rate(launched.log_text, events)
                                    if sink_check.is_ok(verdict) else ''),
            'cpu_s': child.get('cpu_s'), 'epochs': child.get('epochs'),
            'checkpoints': len(checkpoints),
            'last_checkpoint': list(checkpoints[-1]) if checkpoints else None,
            'driver_peak_rss_mb': child.get('driver_peak_rss_mb'),
            'jvm_peak_rss_mb': child.get('jvm_peak_rss_mb'),
            'output_lines': len(launched.lines), 'expected_lines': len(expected),
            'verdict': verdict, 'log_problems': problems_in(launched.log_text)[:20],
            'log': launched.log}


def progress_line(index: int, total: int, run: dict) -> str:
    eps = run['events_per_s']
    return (f"[{index}/{total}] checkpoints {Config(run['period_s'], run['store']).label}, "
            f"store {run['store']}, repeat {run['repeat']}: {run['wall_s'] or '-'} s "
            f"(process {run['process_s']} s), "
            f"{f'{eps:,} events/s' if eps != '' else '- events/s'}, "
            f"{run['checkpoints']} checkpoints, verdict {run['verdict']}")


# ---------------------------------------------------------------- report


def _median(values: Sequence[float]) -> float | str:
    values = [v for v in values if v not in ('', None)]
    return round(statistics.median(values), 2) if values else ''


def summarize(runs: Sequence[dict], configs: Sequence[Config]) -> list[dict]:
    """A row per configuration: medians over its runs, and its median throughput's
    ratio to that with checkpoints off; a configuration with a failed run has no
    throughput (its verdict says which run failed)."""
    rows = []
    for config in configs:
        mine = [r for r in runs if r['config'] == config.name]
        failed = [f"r{r['repeat']}: {r['verdict']}" for r in mine
                  if not sink_check.is_ok(r['verdict'])]
        rows.append({
            'config': config.name, 'period_s': config.period_s, 'store': config.store,
            'checkpoints': config.label, 'runs': len(mine),
            'events_per_s': '' if failed else _median([r['events_per_s'] for r in mine]),
            'all_events_per_s': ' / '.join(str(r['events_per_s'] or 'failed') for r in mine),
            'steady_events_per_s': '' if failed else _median(
                [r['steady_events_per_s'] for r in mine]),
            'wall_s': _median([r['wall_s'] for r in mine]),
            'cpu_s': _median([r['cpu_s'] for r in mine]),
            'checkpoints_taken': ' / '.join(str(r['checkpoints']) for r in mine),
            'epochs': ' / '.join(str(r['epochs'] or '-') for r in mine),
            'driver_peak_rss_mb': _median([r['driver_peak_rss_mb'] for r in mine]),
            'jvm_peak_rss_mb': _median([r['jvm_peak_rss_mb'] for r in mine]),
            'verdict': '; '.join(failed) if failed else ('yes' if mine else 'no run')})
    off = next((r['events_per_s'] for r in rows if not r['period_s']), '')
    steady_off = next((r['steady_events_per_s'] for r in rows if not r['period_s']), '')
    for row in rows:
        ratios = [r['events_per_s'] / off for r in runs
                  if r['config'] == row['config'] and r['events_per_s'] != ''] if off else []
        row['ratio_to_off'] = (round(row['events_per_s'] / off, 3)
                               if off and row['events_per_s'] != '' else '')
        row['ratio_min'] = round(min(ratios), 3) if ratios else ''
        row['ratio_max'] = round(max(ratios), 3) if ratios else ''
        row['steady_ratio_to_off'] = (round(row['steady_events_per_s'] / steady_off, 3)
                                      if steady_off and row['steady_events_per_s'] != ''
                                      else '')
    return rows


TABLE = (('checkpoints', 'checkpoints'), ('store', 'store'),
         ('events_per_s', 'median events/s'), ('ratio_to_off', 'ratio to off'),
         ('all_events_per_s', 'events/s of each repeat'),
         ('steady_events_per_s', 'median steady events/s'),
         ('steady_ratio_to_off', 'steady ratio to off'), ('wall_s', 'median wall s'),
         ('cpu_s', 'median CPU s'), ('checkpoints_taken', 'checkpoints taken'),
         ('epochs', 'epochs'), ('driver_peak_rss_mb', 'driver peak RSS MB'),
         ('jvm_peak_rss_mb', 'JVM peak RSS MB'), ('verdict', 'verdict'))
RUN_TABLE = (('repeat', 'repeat'), ('config', 'config'), ('wall_s', 'wall s'),
             ('process_s', 'process s'), ('events_per_s', 'events/s'),
             ('steady_events_per_s', 'steady events/s'), ('cpu_s', 'CPU s'),
             ('checkpoints', 'checkpoints'), ('epochs', 'epochs'),
             ('driver_peak_rss_mb', 'driver RSS MB'), ('jvm_peak_rss_mb', 'JVM RSS MB'),
             ('verdict', 'verdict'), ('log', 'log'))


def write_report(out: str, runs: Sequence[dict], rows: Sequence[dict], meta: dict) -> None:
    """`report.md`, `runs.json` and `overhead.png` in `out`."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'runs.json'), 'w', encoding='utf-8') as f:
        json.dump({'meta': meta, 'summary': list(rows), 'runs': list(runs)}, f, indent=1)
    problems = [f"* {r['config']} r{r['repeat']} ({r['log']}): {line}"
                for r in runs for line in r['log_problems']]
    text = ['# Checkpoint overhead', '']
    text += [f'* {key}: {value}' for key, value in meta['environment'].items()]
    text += ['', 'Command:', '', '```', meta['command'], '```', '',
             f"{meta['events']:,} events (`PeriodicImpulse` over past timestamps, 1 ms of "
             f'event time apart), {KEYS} keys, fixed windows of {WINDOW_S} s, '
             'CombinePerKey(sum) and a stateful DoFn (BagState, ReadModifyWriteState, an '
             f"event-time timer); {meta['repeats']} repeat(s), interleaved; runner options "
             f"`{' '.join(meta['runner_args'])}`.", '',
             *micro.markdown_columns(rows, TABLE), '',
             '![throughput ratio to checkpoints off](overhead.png)', '',
             '## Notes', '',
             '* events/s = events / wall s, the pipeline\'s time from `Pipeline.run()` to '
             'the end of the stream in a fresh process whose SparkSession and Python '
             'workers were started before it; a run whose verdict is not `yes` has none, '
             'and a configuration with such a run has no median. Ratio to off = the '
             'median with checkpoints every N s / the median with checkpoints off, both '
             'of this invocation (spread over repeats: runs.json `ratio_min`, '
             '`ratio_max`, and the error bars of the plot).',
             f'* Steady events/s: from the end of the first epoch by which {STEADY_FROM:.0%} '
             'of the events were read to the end of the last epoch, from the timestamps of '
             'the runner\'s progress log lines (the ramp-up of the epochs\' size left out; '
             'the end of the stream, which fires the last windows, kept).',
             '* A checkpoint is cut after an epoch once the period has passed, so with '
             'epochs longer than the period there is one per epoch (see the epochs '
             'column); checkpoints taken counts the runner\'s log lines `checkpoint N '
             'after epoch E is consistent` (a cut whose write is still under way when '
             'the stream ends is not among them).',
             '* Checkpoints off (`--checkpoint_period_s=0`) uses no store: the partitions\' '
             'keyed state goes to a temporary local directory. With checkpoints on it goes '
             'to the checkpoint store every epoch, and a commit record every period.',
             f"* file: a fresh directory under {meta['tmp']} per run. redis: one "
             f"redis-server on 127.0.0.1 (AOF on, appendfsync {meta['redis_appendfsync']}, "
             'automatic AOF rewrites off), emptied and its AOF rewritten before every run.',
             '* CPU s: the pipeline run\'s CPU time over the driver, its JVM and the Python '
             'workers. Peak RSS: the driver\'s Python process (ru_maxrss) and its JVM '
             '(VmHWM), at the end of the run.',
             '* Verdict: the sorted output lines equal those computed from the generator\'s '
             'definition (not empty); a checkpointing run must have taken a checkpoint '
             'once it lasted two periods, a run with checkpoints off none.', '',
             '## Every run', '', *micro.markdown_columns(runs, RUN_TABLE), '',
             '## Log problems (runner WARNING and above, tracebacks)', '',
             *(problems or ['none']), '']
    with open(os.path.join(out, 'report.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(text))
    plot(rows, os.path.join(out, 'overhead.png'))


def plot(rows: Sequence[dict], path: str) -> None:
    """Bars of the throughput ratio to checkpoints off, a group per period, a bar per
    store, error bars from the repeats' spread; a failed configuration has no bar."""
    plt = micro.pyplot()
    periods = sorted({r['period_s'] for r in rows if r['period_s']})
    stores = [s for s in STORES if any(r['store'] == s for r in rows)]
    fig, ax = plt.subplots(figsize=(max(5, 1.8 * len(periods) + 2), 4.5))
    width = min(0.35, 0.8 / max(1, len(stores)))
    for i, store in enumerate(stores):
        xs, ys, low, high = [], [], [], []
        for j, period in enumerate(periods):
            row = next((r for r in rows if r['period_s'] == period and r['store'] == store),
                       None)
            if row is None or row['ratio_to_off'] == '':
                continue
            xs.append(j + (i - (len(stores) - 1) / 2) * width)
            ys.append(row['ratio_to_off'])
            low.append(max(0.0, row['ratio_to_off'] - (row['ratio_min'] or math.nan)))
            high.append(max(0.0, (row['ratio_max'] or math.nan) - row['ratio_to_off']))
        bars = ax.bar(xs, ys, width, yerr=[low, high], capsize=4, label=store)
        ax.bar_label(bars, fmt='%.2f', padding=2, fontsize=8)
    ax.axhline(1.0, color='grey', linestyle='--', linewidth=1, label='checkpoints off')
    ax.set_xticks(range(len(periods)), [f'every {p:g} s' for p in periods])
    ax.set_xlabel('checkpoint period')
    ax.set_ylabel('throughput / throughput with checkpoints off')
    ax.set_title('Checkpoint overhead (median over repeats)')
    ax.set_ylim(0, max([1.15] + [r['ratio_max'] * 1.1 for r in rows if r['ratio_max'] != '']))
    ax.legend(loc='lower right', fontsize=8)
    ax.grid(axis='y', alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- CLI


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--events', type=int, default=DEFAULT_EVENTS)
    parser.add_argument('--periods', default='0,1,8',
                        help='checkpoint periods in s, 0 = off (default 0,1,8)')
    parser.add_argument('--store', choices=(*STORES, 'both'), default='both')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--redis_appendfsync', choices=('always', 'everysec', 'no'),
                        default='always')
    parser.add_argument('--out', default=None,
                        help='default: benchmarks/results/<date>-checkpoint-overhead')
    parser.add_argument('--run-one', dest='run_one', action='store_true',
                        help=argparse.SUPPRESS)
    parser.add_argument('--sink', default=None, help=argparse.SUPPRESS)
    parser.add_argument('--result', default=None, help=argparse.SUPPRESS)
    return parser


def child_main(known: argparse.Namespace, runner_args: Sequence[str]) -> int:
    """`--run-one`: one run in this process; its figures go to `--result` (JSON)."""
    try:
        figures = run_one(known.events, known.sink, runner_args)
    except Exception as e:  # noqa: BLE001 - a failed run is a result
        import traceback
        traceback.print_exc()
        figures = {'ok': False, 'error': f'{type(e).__name__}: {verdicts.first_line(str(e))}'}
    with open(known.result, 'w', encoding='utf-8') as f:
        json.dump(figures, f)
    return 0 if figures['ok'] else 1


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); 0 if every run's verdict is `yes`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    known, extra = parser().parse_known_args(argv)
    runner_args = [a for a in DEFAULT_RUNNER_ARGS
                   if not any(e.startswith(a.split('=', 1)[0]) for e in extra)] + extra
    if known.run_one:
        return child_main(known, runner_args)
    periods = [float(p) for p in known.periods.split(',') if p.strip()]
    stores = list(STORES) if known.store == 'both' else [known.store]
    configs = configurations(periods, stores)
    plan = plan_runs(configs, known.repeats)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = known.out or os.path.join(
        root, 'benchmarks', 'results', f'{datetime.date.today()}-checkpoint-overhead')
    logs = os.path.join(out, 'logs')
    os.makedirs(logs, exist_ok=True)
    print(f'{len(plan)} runs of {known.events:,} events: '
          + ', '.join(f'{c.label}/{c.store}' for c in configs), flush=True)
    expected = expected_lines(known.events)
    cores = [wordcount.session_cores()]
    print(f'this session gets {cores[0]} of {os.cpu_count()} cores', flush=True)
    work = tempfile.mkdtemp(prefix='checkpoint-overhead-')
    redis = RedisStores(known.redis_appendfsync)
    runs: list[dict] = []
    if any(c.store == 'redis' for c in configs):
        from beam_streams_runner.stores.redis_server import redis_server_binary
        redis_server_binary()  # no redis-server: say so before any run
    try:
        for index, (config, repeat) in enumerate(plan, 1):
            store_url: str | None = None
            try:
                if config.store == 'redis':
                    store_url = redis.url()
                elif config.store == 'file':
                    store_url = tempfile.mkdtemp(prefix='store-', dir=work)
                launched = launch(config, repeat, known.events, store_url, runner_args, work,
                                  logs)
            except Exception as e:  # noqa: BLE001 - a store that failed fails its run
                launched = Launched({'ok': False, 'error': f'{type(e).__name__}: '
                                                           f'{verdicts.first_line(str(e))}'},
                                    '', [], -1, 0.0, '')
            if config.store == 'file' and store_url:
                shutil.rmtree(store_url, ignore_errors=True)
            run = run_record(config, repeat, known.events, expected, launched)
            runs.append(run)
            print(progress_line(index, len(plan), run), flush=True)
        redis_version = redis.version() if any(c.store == 'redis' for c in configs) else '-'
    finally:
        redis.close()
        shutil.rmtree(work, ignore_errors=True)
    cores.append(wordcount.session_cores())
    rows = summarize(runs, configs)
    environment = report.environment()
    environment['redis-server'] = redis_version
    environment['cores this session got (before, after)'] = f'{cores[0]}, {cores[1]}'
    meta = {'environment': environment,
            'command': 'python -m benchmarks.checkpoint_overhead ' + shlex.join(argv),
            'events': known.events, 'periods': periods, 'stores': stores,
            'repeats': known.repeats, 'runner_args': runner_args,
            'redis_appendfsync': known.redis_appendfsync, 'tmp': tempfile.gettempdir(),
            'configs': [asdict(c) for c in configs]}
    write_report(out, runs, rows, meta)
    print('\n'.join(micro.markdown_columns(rows, TABLE)))
    print(f'report: {os.path.join(out, "report.md")}', flush=True)
    return 0 if runs and all(sink_check.is_ok(r['verdict']) for r in runs) else 1


if __name__ == '__main__':
    sys.exit(main())
