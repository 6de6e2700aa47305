"""One run of the checkpoint benchmark (`benchmarks.checkpoints`), from the parent's
side: its configuration, its store, the child process that runs it, and its verdict.

Design section 12. `launch` runs one configuration in a fresh Python process
(`python -m benchmarks.checkpoints --run-one ...`, its log kept), against a fresh
local directory or the invocation's redis-server (`RedisStores`, emptied before
every run); `run_record` turns what the child left (its figures, its log, its sink's
lines, the fault's marker) into a row of `runs.json` with its verdict (`run_verdict`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks import checkpoints_logs as logs_of
from benchmarks import checkpoints_pipeline as pipeline
from benchmarks import sink_check
from benchmarks.children import REPO_ROOT, child_environment

STORES = ('file', 'redis')
MODES = ('blocking', 'non_blocking')
OFF = '-'  # the store and mode of a configuration with checkpoints off (none is used)


@dataclass(frozen=True)
class Config:
    """A configuration: state size, checkpoint period (0: off, then mode is `OFF`, and
    so is the store unless the state is kept in one: `redis`), mode and store;
    `recovery`: a run with a failure injected."""

    state_mb: float
    period_s: float
    mode: str
    store: str
    recovery: bool = False

    @property
    def label(self) -> str:
        if not self.period_s:
            return 'off' if self.store == OFF else f'off, state in {self.store}'
        return f'every {self.period_s:g} s'

    @property
    def name(self) -> str:
        kind = 'recovery-' if self.recovery else ''
        if not self.period_s:
            store = '' if self.store == OFF else f'-{self.store}'
            return f'{kind}{self.state_mb:g}mb-off{store}'
        return f'{kind}{self.state_mb:g}mb-{self.period_s:g}s-{self.mode}-{self.store}'


# ---------------------------------------------------------------- the store of a run


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


# ---------------------------------------------------------------- one run (the parent's side)


@dataclass
class Launched:
    """What a child run left: its figures (None if it wrote none), its log (stdout and
    stderr), the lines its sink wrote, its exit code and life time, and when its fault
    fired (None: never, or no fault)."""

    child: dict | None
    log_text: str
    lines: list[str]
    exit_code: int
    process_s: float
    log: str  # the log file, relative to --out
    failed_at: float | None = None


@dataclass(frozen=True)
class Fault:
    """A recovery run's failure: at event `index`, of `kind` (`pipeline.FAULTS`)."""

    index: int
    kind: str


def child_command(config: Config, events: int, sink_dir: str, result_path: str,
                  store_url: str | None, runner_args: Sequence[str], name: str,
                  fault: Fault | None, marker: str) -> list[str]:
    """The command line of a child run of `config`."""
    args = [f'--checkpoint_period_s={config.period_s:g}']
    if store_url is not None:
        args += [f'--checkpoint_store={store_url}',
                 f'--job_name=checkpoints-{name}-{uuid.uuid4().hex[:8]}']
        if config.period_s:
            args.append(f'--checkpoint_mode={config.mode}')
    if config.recovery and fault is not None:
        args += [f'--fail_index={fault.index}', f'--fault={fault.kind}',
                 f'--fault_marker={marker}']
    return [sys.executable, '-m', 'benchmarks.checkpoints', '--run-one', f'--events={events}',
            f'--state_mb={config.state_mb:g}', f'--sink={sink_dir}',
            f'--result={result_path}', *args, *runner_args]


def launch(config: Config, repeat: int, events: int, store_url: str | None,
           runner_args: Sequence[str], work: str, logs: str, fault: Fault | None = None,
           timeout_s: float = 3600) -> Launched:
    """One run in a fresh Python process (`--run-one`), its log in `logs`; a run past
    `timeout_s` is killed with its process group (and fails: it leaves no result)."""
    name = f'{config.name}-r{repeat}'
    sink_dir = tempfile.mkdtemp(prefix='sink-', dir=work)
    result_path = os.path.join(work, f'{name}.json')
    marker = os.path.join(work, f'{name}.fault')
    # The runner's home (its journal of jobs, default stores) is the invocation's own.
    env = child_environment(BEAM_STREAMS_RUNNER_HOME=os.path.join(work, 'runner-home'))
    command = child_command(config, events, sink_dir, result_path, store_url, runner_args,
                            name, fault, marker)
    log_path = os.path.join(logs, name + '.log')
    started = time.monotonic()
    with open(log_path, 'w', encoding='utf-8') as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its JVM and Python workers too
            code = process.wait()
            log.write(f'\nkilled after {timeout_s:g} s (--timeout)\n')
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
                    os.path.relpath(log_path, os.path.dirname(logs)),
                    pipeline.failed_at(marker))


# ---------------------------------------------------------------- verdicts


def checkpoint_verdict(config: Config, checkpoints: int, wall_s: float | None) -> str:
    """'' if the checkpoint count fits the configuration, else why not: with checkpoints
    off, none; on, at least one in a run that lasted two periods."""
    if not config.period_s:
        return f'failed: {checkpoints} checkpoints with checkpoints off' if checkpoints else ''
    if not checkpoints and wall_s and wall_s >= 2 * config.period_s:
        return f'failed: no checkpoint in {wall_s:.1f} s'
    return ''


def replayed_lines_verdict(got: Sequence[str], expected: Sequence[str]) -> str:
    """The output of a run that replayed through an at-least-once sink: `yes` if equal to
    `expected`, `yes (N lines twice, from the replay)` if it holds every line of
    `expected` (all distinct) and none other, else `lines_verdict`'s failure."""
    exact = sink_check.lines_verdict(got, expected)
    if sink_check.is_ok(exact) or set(got) != set(expected):
        return exact
    extra = sum((Counter(got) - Counter(expected)).values())
    return f'yes ({extra} lines twice, from the replay)'


def state_verdict(state_mb: float, written_mb: float | None) -> str:
    """'' if the runner's deltas wrote at least the state asked for (the ballast goes
    through them once), else why not."""
    if written_mb is None or written_mb >= 0.9 * state_mb:
        return ''
    return f'failed: the runner wrote {written_mb:g} MB of state, {state_mb:g} MB asked'


def run_verdict(child: dict | None, lines: Sequence[str], expected: Sequence[str],
                config: Config, checkpoints: int, written_mb: float | None = None,
                recovery: dict | None = None) -> str:
    """The run's verdict: `yes` if it finished, its output equals `expected` (not empty;
    a recovery run's may repeat lines), its checkpoints fit `config`, its deltas wrote
    the state asked for and a recovery run recovered (`recovery` from its log); else
    `failed: ...`."""
    if child is None:
        return 'failed: the run left no result'
    if not child.get('ok'):
        return f"failed: the run ended {child.get('state') or child.get('error')}"
    output = (replayed_lines_verdict(lines, expected) if config.recovery
              else sink_check.lines_verdict(lines, expected))
    if not sink_check.is_ok(output):
        return output
    if config.recovery and recovery is None:
        return 'failed: the fault never fired or no reset followed it'
    if config.recovery and recovery['total_s'] == '':
        return 'failed: no epoch after the reset passed the failure point'
    return (checkpoint_verdict(config, checkpoints, child.get('wall_s'))
            or state_verdict(config.state_mb, written_mb) or output)


def held_mb(lines: Sequence[str]) -> float:
    """The state the ballast read back at the end: its pads' sizes, in MB."""
    sizes = {line.split('\t')[1]: int(line.split('\t')[2]) for line in lines
             if line.startswith('pad\t')}
    return round(sum(sizes.values()) / pipeline.MB, 2)


def run_record(config: Config, repeat: int, events: int, expected: Sequence[str],
               launched: Launched, fault: Fault | None = None) -> dict:
    """A run's raw figures (a row of `runs.json`), its checkpoints, state, recovery and
    verdict."""
    log = launched.log_text
    checkpoints = logs_of.checkpoints_in(log)
    state = logs_of.state_figures(log)
    recovery = (logs_of.recovery_times(log, launched.failed_at, fault.index)
                if config.recovery and fault and launched.failed_at is not None else None)
    verdict = run_verdict(launched.child, launched.lines, expected, config, len(checkpoints),
                          state['state_written_mb'] if launched.child else None, recovery)
    child = launched.child or {}
    wall_s = child.get('wall_s')
    ok = sink_check.is_ok(verdict)
    return {'config': config.name, 'state_mb': config.state_mb, 'period_s': config.period_s,
            'mode': config.mode, 'store': config.store, 'recovery': config.recovery,
            'repeat': repeat, 'exit_code': launched.exit_code,
            'process_s': launched.process_s, 'wall_s': wall_s, 'events': events,
            'events_per_s': sink_check.throughput(verdict, events, wall_s) if wall_s else '',
            'steady_events_per_s': logs_of.steady_rate(log, events) if ok else '',
            'cpu_s': child.get('cpu_s'), 'epochs': child.get('epochs'),
            'checkpoints': len(checkpoints),
            'last_checkpoint': list(checkpoints[-1]) if checkpoints else None,
            'state_held_mb': held_mb(launched.lines), **state,
            **{key: child.get(key) for key in ('driver_peak_rss_mb', 'jvm_peak_rss_mb',
                                               'workers_peak_rss_mb', 'workers_peak_pss_mb')},
            'fail_index': fault.index if config.recovery and fault else None,
            'failed_at': launched.failed_at, 'recovery_figures': recovery,
            'output_lines': len(launched.lines), 'expected_lines': len(expected),
            'verdict': verdict, 'log_problems': logs_of.problems_in(log)[:20],
            'log': launched.log}


def progress_line(index: int, total: int, run: dict) -> str:
    """The line printed after each run."""
    config = Config(run['state_mb'], run['period_s'], run['mode'], run['store'],
                    run['recovery'])
    eps = run['events_per_s']
    what = f"{f'{eps:,} events/s' if eps != '' else '- events/s'}"
    recovery = run.get('recovery_figures')
    if config.recovery:
        what = ('recovery ' + ', '.join(
            f"{key[:-2].replace('_', '-')} {recovery[key]} s"
            for key in ('detection_s', 'reset_s', 'catch_up_s', 'total_s'))
            if recovery else 'no recovery in the log')
    return (f"[{index}/{total}] {'recovery, ' if config.recovery else ''}"
            f"{run['state_mb']:g} MB, checkpoints {config.label}, mode {run['mode']}, "
            f"store {run['store']}, repeat {run['repeat']}: {run['wall_s'] or '-'} s "
            f"(process {run['process_s']} s), {what}, {run['checkpoints']} checkpoints, "
            f"state held {run['state_held_mb']} MB, verdict {run['verdict']}")
