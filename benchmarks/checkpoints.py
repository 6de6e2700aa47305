"""The overhead and recovery benchmark of consistent regions (the seed paper's experiment,
IBM Streams, on this machine; design sections 8 and 12): streaming throughput with
checkpoints every 1, 2 and 8 s against none, for keyed state of 1 to 512 MB, blocking
against non-blocking, local directory against Redis; and the time to recover from a
failure, split into detection, reset and catch-up to the failure point.

    python -m benchmarks.checkpoints [--events=N] [--state_mb=1,8,10,64,512] \\
        [--periods=0,1,2,8] [--modes=blocking,non_blocking] [--store=file|redis|both] \\
        [--matrix=slices|full] [--repeats=2] [--recovery_state_mb=...] [--quick] \\
        [--spark_master=local[2]] [--out DIR]

Every run is a fresh Python process (`--run-one`: its own JVM and Python workers, the
same start-up for all) of the pipeline of `checkpoints_pipeline` (a windowed count and
a stateful DoFn over 1000 keys, plus `--state_mb` MB of keyed state held by a stateful
DoFn to the end of the stream), whose output is checked against the lines computed
from the generator's definition. A configuration is a state size, a checkpoint period
(`--checkpoint_period_s`; 0 = consistent regions off: no mode, and the state in a
temporary directory, or with `redis` among the stores once more in Redis), a mode
(`--checkpoint_mode`) and a store: `file` (a fresh directory under $TMPDIR per run) or
`redis` (a `RedisServer` this command starts on 127.0.0.1, AOF on with
`--redis_appendfsync`, default `always`, automatic AOF rewrites off, emptied and its
AOF rewritten before every run, stopped at the end whatever happens).

The matrix (`--matrix`): `slices` (default) sweeps the periods at one state size
(`--period_sweep_state_mb`, 10 MB: every period x mode x store, and off) and the state
sizes at one period (`--state_sweep_period_s`, 2 s: every state size x mode x store,
and off), as the paper did; `full` runs every state size x period x mode x store.
Every state size has its own runs with checkpoints off, the base of its ratios. The
runs are interleaved across repeats (ABCABC), so a load on the machine falls on every
configuration alike. Then the recovery runs: for every `--recovery_state_mb` (default:
every state size) and store, a run with checkpoints every `--recovery_period_s` (1 s)
in `--recovery_mode` (non_blocking) whose Python worker fails once at event
`--fail_at` (0.5) of `--events` (`--fault`: `kill_worker`, a SIGKILL, or `raise`);
detection, reset and catch-up come from the run's log (`checkpoints_logs`).

Duration: the default matrix is 38 configurations x 2 repeats + 10 recovery runs = 86
runs of 200,000 events; a run takes about 30-45 s on an idle 2-core machine (10 s of
it start-up, more at 512 MB: the pads are made, written and reloaded), so about an
hour. `--quick`: 20,000 events, 1 MB, checkpoints off and every 1 s, non-blocking, the
local directory, one repeat, one recovery run: 3 runs, about a minute.

Measured per run: `wall_s`, the pipeline's own time from `Pipeline.run()` to the end of
the stream (start-up outside it) and `events_per_s` = events / `wall_s` (only for a run
whose verdict is ok); `steady_events_per_s` from the epoch by which 20% of the events
were read; the CPU seconds of the run over the driver, its JVM and the Python workers;
the checkpoints taken; the epochs; the state the run held, read back from the state at
the end (`state_held_mb`, the sum of the pads' sizes in the output) and the runner's
own figures (the most keyed states its gauge counted, the MB its deltas wrote); peak
RSS of the driver, its JVM, and the Python workers (sampled every second); log lines
at WARNING or above. A recovery run adds its recovery figures.

Verdict of a run: its output lines must equal, and not be empty, those the generator
implies (a recovery run: every line there, none other, a line twice only from the
replay, as the sink is at-least-once); its checkpoints must fit its configuration; the
runner's deltas must have written at least the state asked for; a recovery run's fault
must have fired and its recovery be in the log. Any failed run makes the command exit
1. Report in `--out` (default `benchmarks/results/<date>-checkpoints/`): `report.md`,
`runs.json`, `checkpoints.png` (see `checkpoints_report`) and the runs' logs in `logs/`.
Options this module does not know go to the runner (`--bundle_size`,
`--target_latency_ms`, ...); `--spark_master` defaults to `local[2]`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict

from benchmarks import batch_speed, checkpoints_report, sink_check
from benchmarks import checkpoints_pipeline as pipeline
from benchmarks.checkpoints_runs import (
    MODES,
    OFF,
    STORES,
    Config,
    Fault,
    Launched,
    RedisStores,
    launch,
    progress_line,
    run_record,
)
from benchmarks.nexmark import report, verdicts

DEFAULT_EVENTS = 200_000  # 20-40 s a run on local[2] here
DEFAULT_RUNNER_ARGS = ('--spark_master=local[2]',
                       # Spark's console progress bar would fill the logs.
                       '--spark_conf=spark.ui.showConsoleProgress=false')
QUICK = {'events': 20_000, 'state_mb': '1', 'periods': '0,1', 'modes': 'non_blocking',
         'store': 'file', 'repeats': 1, 'recovery_state_mb': '1'}


# ---------------------------------------------------------------- the plan


def sweeps(state_mbs: Sequence[float], periods: Sequence[float], state_mb: float | None,
           period_s: float | None) -> tuple[float, float]:
    """The state size of the period sweep and the period of the state sweep: those asked
    if they are among `state_mbs` and `periods`, else the first (non-zero) of them."""
    on = [p for p in periods if p]
    return (state_mb if state_mb in state_mbs else state_mbs[0],
            period_s if period_s in on else (on[0] if on else 0.0))


def configurations(state_mbs: Sequence[float], periods: Sequence[float],
                   modes: Sequence[str], stores: Sequence[str], matrix: str = 'full',
                   sweep_state_mb: float | None = None,
                   sweep_period_s: float | None = None) -> list[Config]:
    """The throughput configurations: `full`, every state size x period (0 once, no store
    or mode, and once more with the state in Redis if it is a store) x mode x store;
    `slices`, every period at `sweep_state_mb` and every state size at `sweep_period_s`
    (each state size also off). A sweep's state size or period that is not among
    `state_mbs` or `periods` is their first (non-zero) one."""
    def cells(state: float, periods_here: Sequence[float]) -> list[Config]:
        out = [Config(state, 0.0, OFF, OFF)]
        if 'redis' in stores:
            # Off with the state in Redis: what keeping it there costs without checkpoints.
            out.append(Config(state, 0.0, OFF, 'redis'))
        out += [Config(state, p, m, s) for p in periods_here if p for m in modes for s in stores]
        return out

    if matrix == 'full':
        configs = [c for state in state_mbs for c in cells(state, periods)]
    elif matrix == 'slices':
        sweep_state, sweep_period = sweeps(state_mbs, periods, sweep_state_mb, sweep_period_s)
        configs = cells(sweep_state, periods)
        configs += [c for state in state_mbs for c in cells(state, [sweep_period])]
    else:
        raise ValueError(f'unknown matrix {matrix!r}: full or slices')
    return list(dict.fromkeys(configs))


def recovery_configurations(state_mbs: Sequence[float], period_s: float, mode: str,
                            stores: Sequence[str]) -> list[Config]:
    """A recovery run per state size and store (consistent regions must be on)."""
    if state_mbs and period_s <= 0:
        raise ValueError('a recovery needs consistent regions: --recovery_period_s > 0')
    return [Config(state, period_s, mode, store, recovery=True)
            for state in state_mbs for store in stores]


def plan_runs(configs: Sequence[Config], repeats: int,
              recoveries: Sequence[Config] = (), recovery_repeats: int = 1
              ) -> list[tuple[Config, int]]:
    """Every (configuration, repeat), interleaved: all configurations of a repeat before
    the next repeat (ABCABC), so machine noise spreads over them evenly; the recovery
    runs after them, interleaved the same way."""
    return ([(config, repeat) for repeat in range(1, repeats + 1) for config in configs]
            + [(config, repeat) for repeat in range(1, recovery_repeats + 1)
               for config in recoveries])


def fail_index(events: int, fail_at: float) -> int:
    """The event a recovery run fails at: share `fail_at` of the events."""
    return min(pipeline.generated_events(events) - 1, max(0, int(fail_at * events)))


# ---------------------------------------------------------------- CLI


def _floats(spec: str) -> list[float]:
    return [float(x) for x in spec.split(',') if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], allow_abbrev=False)
    p.add_argument('--events', type=int, default=DEFAULT_EVENTS)
    p.add_argument('--state_mb', default='1,8,10,64,512', help='keyed state sizes, MB')
    p.add_argument('--periods', default='0,1,2,8', help='checkpoint periods in s, 0 = off')
    p.add_argument('--modes', default=','.join(MODES))
    p.add_argument('--store', choices=(*STORES, 'both'), default='both')
    p.add_argument('--matrix', choices=('slices', 'full'), default='slices')
    p.add_argument('--period_sweep_state_mb', type=float, default=10.0)
    p.add_argument('--state_sweep_period_s', type=float, default=2.0)
    p.add_argument('--repeats', type=int, default=2)
    p.add_argument('--recovery_state_mb', default=None,
                   help="default: every --state_mb; '' for no recovery run")
    p.add_argument('--recovery_period_s', type=float, default=1.0)
    p.add_argument('--recovery_mode', choices=MODES, default='non_blocking')
    p.add_argument('--recovery_repeats', type=int, default=1)
    p.add_argument('--fault', choices=pipeline.FAULTS, default='kill_worker')
    p.add_argument('--fail_at', type=float, default=0.5, help='share of the events')
    p.add_argument('--redis_appendfsync', choices=('always', 'everysec', 'no'),
                   default='always')
    p.add_argument('--timeout', type=float, default=3600, help='s a run may take')
    p.add_argument('--out', default=None, help='default: benchmarks/results/<date>-checkpoints')
    p.add_argument('--quick', action='store_true', help=f'a smoke run: {QUICK}')
    for hidden in ('--sink', '--result', '--fail_index', '--fault_marker'):
        p.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    p.add_argument('--run-one', dest='run_one', action='store_true', help=argparse.SUPPRESS)
    return p


def child_main(known: argparse.Namespace, runner_args: Sequence[str]) -> int:
    """`--run-one`: one run in this process; its figures go to `--result` (JSON)."""
    fault = (pipeline.FailAt(int(known.fail_index), known.fault_marker, known.fault)
             if known.fail_index is not None else None)
    try:
        figures = pipeline.run_one(known.events, float(known.state_mb), known.sink,
                                   runner_args, fault)
    except Exception as e:  # noqa: BLE001 - a failed run is a result
        import traceback
        traceback.print_exc()
        figures = {'ok': False, 'error': f'{type(e).__name__}: {verdicts.first_line(str(e))}'}
    with open(known.result, 'w', encoding='utf-8') as f:
        json.dump(figures, f)
    return 0 if figures['ok'] else 1


def plan_of(known: argparse.Namespace) -> tuple[list[Config], list[Config]]:
    """The throughput and recovery configurations the options ask for."""
    states = _floats(known.state_mb)
    stores = list(STORES) if known.store == 'both' else [known.store]
    modes = [m for m in known.modes.split(',') if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f'--modes: unknown {unknown}; one of {MODES}')
    configs = configurations(states, _floats(known.periods), modes, stores, known.matrix,
                             known.period_sweep_state_mb, known.state_sweep_period_s)
    recovery_states = (states if known.recovery_state_mb is None
                       else _floats(known.recovery_state_mb))
    return configs, recovery_configurations(recovery_states, known.recovery_period_s,
                                            known.recovery_mode, stores)


def run_all(plan: Sequence[tuple[Config, int]], known: argparse.Namespace,
            runner_args: Sequence[str], out: str, redis: RedisStores) -> list[dict]:
    """Every run of `plan`, a progress line after each; the runs' records."""
    logs = os.path.join(out, 'logs')
    os.makedirs(logs, exist_ok=True)
    fault = Fault(fail_index(known.events, known.fail_at), known.fault)
    references: dict[float, list[str]] = {}
    work = tempfile.mkdtemp(prefix='checkpoints-')
    runs: list[dict] = []
    try:
        for index, (config, repeat) in enumerate(plan, 1):
            if config.state_mb not in references:
                references[config.state_mb] = pipeline.expected_lines(known.events,
                                                                      config.state_mb)
            store_url: str | None = None
            try:
                if config.store == 'redis':
                    store_url = redis.url()
                elif config.store == 'file':
                    store_url = tempfile.mkdtemp(prefix='store-', dir=work)
                launched = launch(config, repeat, known.events, store_url, runner_args, work,
                                  logs, fault, known.timeout)
            except Exception as e:  # noqa: BLE001 - a store that failed fails its run
                launched = Launched({'ok': False, 'error': f'{type(e).__name__}: '
                                                           f'{verdicts.first_line(str(e))}'},
                                    '', [], -1, 0.0, '')
            if config.store == 'file' and store_url:
                shutil.rmtree(store_url, ignore_errors=True)
            runs.append(run_record(config, repeat, known.events, references[config.state_mb],
                                   launched, fault))
            print(progress_line(index, len(plan), runs[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); 0 if every run's verdict is ok."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    if '--quick' in argv:
        p.set_defaults(**QUICK)
    known, extra = p.parse_known_args(argv)
    runner_args = [a for a in DEFAULT_RUNNER_ARGS
                   if not any(e.startswith(a.split('=', 1)[0]) for e in extra)] + extra
    if known.run_one:
        return child_main(known, runner_args)
    configs, recoveries = plan_of(known)
    sweep_state, sweep_period = sweeps(_floats(known.state_mb), _floats(known.periods),
                                       known.period_sweep_state_mb, known.state_sweep_period_s)
    plan = plan_runs(configs, known.repeats, recoveries, known.recovery_repeats)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = known.out or os.path.join(root, 'benchmarks', 'results',
                                    f'{datetime.date.today()}-checkpoints')
    print(f'{len(plan)} runs of {known.events:,} events: '
          + ', '.join(c.name for c in [*configs, *recoveries]), flush=True)
    cores = [batch_speed.session_cores()]
    print(f'this session gets {cores[0]} of {os.cpu_count()} cores', flush=True)
    redis = RedisStores(known.redis_appendfsync)
    uses_redis = any(c.store == 'redis' for c in [*configs, *recoveries])
    if uses_redis:
        from beam_streams_runner.stores.redis_server import redis_server_binary
        redis_server_binary()  # no redis-server: say so before any run
    try:
        runs = run_all(plan, known, runner_args, out, redis)
        redis_version = redis.version() if uses_redis else '-'
    finally:
        redis.close()
    cores.append(batch_speed.session_cores())
    environment = report.environment()
    environment['redis-server'] = redis_version
    environment['cores this session got (before, after)'] = f'{cores[0]}, {cores[1]}'
    meta = {'environment': environment,
            'command': 'python -m benchmarks.checkpoints ' + shlex.join(argv),
            'events': known.events, 'repeats': known.repeats,
            'recovery_repeats': known.recovery_repeats, 'runner_args': runner_args,
            'redis_appendfsync': known.redis_appendfsync, 'tmp': tempfile.gettempdir(),
            'fault': known.fault, 'fail_index': fail_index(known.events, known.fail_at),
            'period_sweep_state_mb': sweep_state, 'state_sweep_period_s': sweep_period,
            'configs': [asdict(c) for c in configs],
            'recoveries': [asdict(c) for c in recoveries]}
    text = checkpoints_report.write_report(out, runs, configs, recoveries, meta)
    print(text, flush=True)
    print(f'report: {os.path.join(out, "report.md")}', flush=True)
    return 0 if runs and all(sink_check.is_ok(r['verdict']) for r in runs) else 1


if __name__ == '__main__':
    sys.exit(main())
