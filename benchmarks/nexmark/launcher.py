"""NEXMark launcher: Beam's Python queries on any runner, timed, each run with a verdict.

    python -m benchmarks.nexmark --runner=StreamsSparkRunner --query=0-12 --events=10000 \\
           [--streaming] [--compare DirectRunner] --out bench-out/ [--spark_master=...]

For each query of `--query` it runs Beam's own implementation on the runner under test
(`runs.run_query`, each run in a subprocess of its own) and compares its output with a
reference (`verdicts.equality_verdict`): every row of the table has a verdict. Options
the launcher does not know (e.g. `--spark_master`, `--bundle_size`) go to the runner
under test only; NEXMark configuration options (`--num_event_generators`, ...) to all.

The reference is a batch run of `--compare` (default: Beam's DirectRunner; the
BundleBasedDirectRunner for Q4/Q6/Q9, whose custom merging window the DirectRunner
cannot run) over the same events, kept in a cache per event set (`runs.cached_run`), so
comparing a streaming run with batch costs the batch run once. Streaming runs
(`--streaming [--rate=N]`) read the unbounded source and are compared with that batch
output, the differences Beam's model allows being named by the verdict (see
`verdicts`); for Q4/Q6/Q9 the reference is also run over the events without the bids
whose window closes before their auction exists (`early_bids`).

Fair baselines: in batch, when the DirectRunner is the reference it is also timed with
two worker processes (`--direct_num_workers=2 --direct_running_mode=multi_processing`,
the row "DirectRunner (2 processes)"), as StreamsSparkRunner gets `local[2]` on two
cores. `--native spark|flink` adds hand-written PySpark/PyFlink programs (`native`),
`--with-streaming` adds the runner under test in streaming to a batch run.
`--input=PATH` makes every batch run (PyFlink's aside) read the events from a JSON-lines
file, written from the generator first if it does not exist (`event_file`), so the
read path is timed instead of the in-process generator.

Beam's Java-backed runners take their own options, passed through like any other:
`--runner=FlinkRunner --flink_master=HOST:8081 [--flink_job_server_jar=JAR]`,
`--runner=SparkRunner --spark_master_url=spark://HOST:7077 [--spark_job_server_jar=JAR]`,
or `--runner=PortableRunner --job_endpoint=HOST:8099 --environment_type=LOOPBACK` (a
running job server; also accepted by the other two). Their run checks first that the job
server, its jar (Beam would download it from Maven Central) and the master are within
reach, and else fails at once with a row naming what is missing (`java_runners`).

The parent prints a progress line per run and a table at the end, and writes
`OUT/results.csv`, `OUT/report.md`, `OUT/nexmark.png` (`report`), the sorted outputs
(`OUT/outputs/`) and each run's log (`OUT/logs/`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.early_bids import WINNING_BIDS_QUERIES
from benchmarks.nexmark.event_file import ensure_events
from benchmarks.nexmark.java_runners import JAVA_RUNNERS
from benchmarks.nexmark.native import (
    NATIVE_FLINK,
    NATIVE_QUERIES,
    NATIVE_SPARK,
    run_native_flink,
)
from benchmarks.nexmark.report import Row, format_table, make_row, write_report
from benchmarks.nexmark.runs import cached_run, run_one, run_subprocess, ship_benchmarks
from benchmarks.nexmark.verdicts import RunResult, equality_verdict

ALL_QUERIES = tuple(range(13))
# The DirectRunner (FnApiRunner) cannot run the custom merging window of Q4/Q6/Q9.
MERGING_WINDOW_QUERIES = (4, 6, 9)
RUNNER_ALIASES = ('StreamsSparkRunner', 'DirectRunner', 'BundleBasedDirectRunner',
                  'DaskRunner')
DEFAULT_REFERENCE = 'DirectRunner'
# The DirectRunner with the two cores StreamsSparkRunner gets.
DIRECT_2P = 'DirectRunner (2 processes)'
DIRECT_2P_ARGS = ('--direct_num_workers=2', '--direct_running_mode=multi_processing')


def parse_queries(spec: str) -> list[int]:
    """`'0-3,5'` -> `[0, 1, 2, 3, 5]` (sorted, without duplicates)."""
    queries: set[int] = set()
    for part in spec.replace(' ', '').split(','):
        if not part:
            continue
        low, sep, high = part.partition('-')
        if sep:
            if int(low) > int(high):
                raise ValueError(f'empty query range: {part!r}')
            queries.update(range(int(low), int(high) + 1))
        else:
            queries.add(int(low))
    if not queries:
        raise ValueError(f'no query in {spec!r}')
    unknown = sorted(q for q in queries if q not in ALL_QUERIES)
    if unknown:
        raise ValueError(f'no such NEXMark queries: {unknown} (known: 0-12)')
    return sorted(queries)


def reference_for(query: int, reference: str) -> str:
    """The reference runner of `query`: BundleBasedDirectRunner for Q4/Q6/Q9 if DirectRunner.

    (Q6 fails everywhere, but on the BundleBasedDirectRunner with its own reason.)
    """
    if reference == 'DirectRunner' and query in MERGING_WINDOW_QUERIES:
        return 'BundleBasedDirectRunner'
    return reference


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class RunSpec:
    """One run of the plan: `runner` (a Beam runner, SparkNative or FlinkNative) with
    `args`; `role` says what its row is."""

    query: int
    role: str  # 'tested', 'reference', 'without early bids', DIRECT_2P, 'native', 'streaming'
    runner: str
    args: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        suffix = {'reference': '', 'tested': '', 'native': '', 'without early bids':
                  '-without-early-bids', DIRECT_2P: '-2p', 'streaming': '-streaming'}
        return f'q{self.query}-{self.runner.rsplit(".", 1)[-1]}{suffix[self.role]}'

    @property
    def cached(self) -> bool:
        return self.role in ('reference', 'without early bids')


def plan_runs(args: argparse.Namespace, queries: Sequence[int],
              runner_args: Sequence[str]) -> list[RunSpec]:
    """Every run the command line asks for, in order."""
    stream_args = (('--streaming',) + ((f'--rate={args.rate}',) if args.rate else ())
                   if args.streaming else ())
    # Every batch run but PyFlink's reads the same events from the file, when given.
    read = (f'--input={os.path.abspath(args.input)}',) if args.input else ()
    plan = []
    for q in queries:
        q6 = ('--corrected-q6',) if q == 6 and args.corrected_q6 else ()
        plan.append(RunSpec(q, 'tested', args.runner, stream_args + tuple(runner_args) + q6
                            + (() if args.streaming else read)))
        ref = reference_for(q, args.compare)
        if ref != args.runner or args.streaming:
            plan.append(RunSpec(q, 'reference', ref, q6 + read))
        if (args.streaming or args.with_streaming) and q in WINNING_BIDS_QUERIES:
            corrected = q == 6 and (args.corrected_q6 or args.with_streaming)
            plan.append(RunSpec(q, 'without early bids', ref,
                                ('--corrected-q6',) * corrected + ('--without-early-bids',)
                                + read))
        if (not args.streaming and ref == 'DirectRunner' and args.runner != 'DirectRunner'
                and not args.no_direct_2p):
            plan.append(RunSpec(q, DIRECT_2P, 'DirectRunner', q6 + DIRECT_2P_ARGS + read))
        for name, native in (('spark', NATIVE_SPARK), ('flink', NATIVE_FLINK)):
            if name in args.native and q in NATIVE_QUERIES:
                master = tuple(a for a in runner_args if a.startswith('--spark_master='))
                plan.append(RunSpec(q, 'native', native,
                                    master + read if name == 'spark' else ()))
        if args.with_streaming:
            plan.append(RunSpec(q, 'streaming', args.runner,
                                ('--streaming', *runner_args)
                                + (('--corrected-q6',) if q == 6 else ())))
    return plan


def execute(spec: RunSpec, config: NexmarkConfig, config_args: Sequence[str],
            out_dir: str, timeout_s: float) -> tuple[RunResult, bool]:
    """Run `spec` (a cached one from the cache if it is there); (result, cached)."""
    if spec.runner == NATIVE_FLINK:
        return run_native_flink(spec.query, config_args, out_dir, config.num_events,
                                timeout_s, spec.args), False
    if spec.cached:
        return cached_run(spec.query, spec.runner, config, config_args, spec.args, out_dir,
                          timeout_s, spec.tag)
    return run_subprocess(spec.query, spec.runner, config_args, spec.args, out_dir,
                          config.num_events, timeout_s, spec.tag), False


# ---------------------------------------------------------------- rows


def rows_of_query(query: int, runs: dict[RunSpec, tuple[RunResult, bool]],
                  config: NexmarkConfig, streaming: bool) -> list[Row]:
    """The table rows of `query`'s runs, each with its verdict."""
    own = [(spec.role, run) for spec, run in runs.items() if spec.query == query]
    # Several runs may share a role (`native`: Spark and Flink); these three are one each.
    by_role = dict(own)
    tested = by_role['tested'][0]
    reference = by_role['reference'][0] if 'reference' in by_role else None
    early = by_role['without early bids'][0] if 'without early bids' in by_role else None
    rows = []
    if reference is None and not streaming:
        # The runner under test is the reference runner: nothing else to compare with.
        rows.append(make_row(tested, 'failed: ' + tested.error if not tested.ok else
                             'reference'))
    else:
        rows.append(make_row(tested, *equality_verdict(query, tested, reference, config,
                                                       streaming, early)))
    for role, (result, cached) in own:
        if role in ('reference', 'without early bids'):
            label = 'reference' if result.ok else f'failed: {result.error}'
            row = make_row(result, label, 'cached run' if cached else '')
            if role != 'reference':
                row.runner = f'{result.runner} (batch, without early bids)'
            elif streaming:
                row.runner = f'{result.runner} (batch)'
            rows.append(row)
        elif role in (DIRECT_2P, 'native'):
            row = make_row(result, *equality_verdict(query, result, reference or tested,
                                                     config))
            row.runner = DIRECT_2P if role == DIRECT_2P else result.runner
            rows.append(row)
        elif role == 'streaming':
            rows.append(streaming_row(query, result, tested, reference, config, early))
    return rows


def streaming_row(query: int, streamed: RunResult, batch: RunResult,
                  reference: RunResult | None, config: NexmarkConfig,
                  without_early_bids: RunResult | None = None) -> Row:
    """The `--with-streaming` row of `query`: compared with the batch reference (the
    tested runner's own batch run when there is none), events/s as a ratio to batch."""
    equal, note = equality_verdict(query, streamed, reference or batch, config,
                                   streaming=True, without_early_bids=without_early_bids)
    row = make_row(streamed, equal, note)
    if row.events_per_s and batch.ok and batch.wall_s > 0:
        ratio = row.events_per_s / (batch.events / batch.wall_s)
        row.note = '; '.join(p for p in (f'{ratio:.2f}x the events/s of its batch run',
                                          row.note) if p)
    row.runner = f'{streamed.runner} (streaming)'
    return row


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m benchmarks.nexmark',
        description='Run Beam NEXMark queries on a runner and compare each with a batch '
                    'reference. Unknown options go to the runner under test (e.g. '
                    '--spark_master); NEXMark configuration options '
                    '(--num_event_generators, ...) to all.')
    parser.add_argument('--runner', default='StreamsSparkRunner',
                        help=f'{", ".join(RUNNER_ALIASES)}, a dotted runner class, or '
                             f'{", ".join(JAVA_RUNNERS)} with their job server\'s options '
                             '(e.g. --job_endpoint=HOST:8099, --flink_master=HOST:8081)')
    parser.add_argument('--query', default='0-12', help='e.g. 0-12 or 0,3,5')
    parser.add_argument('--events', type=int, default=None,
                        help='number of events (default: NEXMark\'s 100000)')
    parser.add_argument('--compare', default=DEFAULT_REFERENCE, metavar='RUNNER',
                        help='reference runner, run in batch over the same events and '
                             'cached per event set (default: %(default)s; Q4/Q6/Q9 use '
                             'BundleBasedDirectRunner when this is DirectRunner)')
    parser.add_argument('--out', default='bench-out', help='output directory')
    parser.add_argument('--native', action='append', default=[], choices=['spark', 'flink'],
                        help='also run native baselines (repeatable; spark: hand-written '
                             f'PySpark, {NATIVE_SPARK} rows; flink: hand-written PyFlink in '
                             f'.venv-flink, {NATIVE_FLINK} rows; for '
                             f'Q{",".join(map(str, NATIVE_QUERIES))}) and compare them with '
                             'the reference')
    parser.add_argument('--streaming', action='store_true',
                        help='read the unbounded source and run the runner under test with '
                             '--streaming (the stream ends after --events)')
    parser.add_argument('--no-direct-2p', dest='no_direct_2p', action='store_true',
                        help='leave out the batch rows of the DirectRunner with two '
                             'processes (the reference runs stay)')
    parser.add_argument('--rate', type=float, default=None,
                        help='with --streaming: events/s over all source parts '
                             '(default: as fast as possible)')
    parser.add_argument('--timeout', type=float, default=3600.0,
                        help='seconds per run before it counts as failed')
    parser.add_argument('--corrected-q6', action='store_true',
                        help='run Q6 as query6_corrected (Beam\'s query with its Timestamp '
                             'negation fixed) instead of Beam\'s, which fails everywhere')
    parser.add_argument('--input', default=None, metavar='PATH',
                        help='batch runs read the events from this JSON-lines file '
                             '(written from the generator first if it does not exist) '
                             'instead of generating them in the pipeline')
    parser.add_argument('--with-streaming', action='store_true',
                        help='in batch: also run --runner with --streaming over the '
                             'unbounded source (as fast as possible), as rows "<runner> '
                             '(streaming)" compared with the batch reference, with their '
                             'events/s as a ratio to the same runner\'s batch run; Q6 runs '
                             'as query6_corrected there')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The launcher's command line; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--run-one' in argv:
        return run_one(argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.events is not None:
        rest = [f'--num_events={args.events}', *rest]
    config, runner_args = NexmarkConfig.from_args(rest)
    config_args = [a for a in rest if a not in runner_args]
    queries = parse_queries(args.query)
    if args.rate is not None and not args.streaming:
        parser.error('--rate needs --streaming')
    if args.rate is not None and args.rate <= 0:
        parser.error('--rate must be positive')
    if args.with_streaming and args.streaming:
        parser.error('--with-streaming adds streaming rows to a batch run: '
                     'leave out --streaming')
    if args.input and (args.streaming or args.with_streaming):
        parser.error('--input is for batch runs: a streaming run reads the unbounded '
                     'generator source (leave out --streaming and --with-streaming)')
    if args.input:
        print(f'events: {args.input}', flush=True)
        try:
            ensure_events(config, args.input)
        except ValueError as e:
            parser.error(str(e))
    mode = ('streaming, ' + (f'{args.rate:g} events/s' if args.rate else 'as fast as possible')
            if args.streaming else 'batch' + (', events read from a JSON-lines file'
                                              if args.input else ''))
    out_dir = os.path.abspath(args.out)
    for sub in ('outputs', 'logs'):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)

    runner_args = ship_benchmarks(runner_args, out_dir)
    plan = plan_runs(args, queries, runner_args)
    runs: dict[RunSpec, tuple[RunResult, bool]] = {}
    for i, spec in enumerate(plan, 1):
        label = {'tested': '', 'reference': ' (batch reference)',
                 'without early bids': ' (batch, without early bids)', DIRECT_2P:
                 ' (2 processes)', 'native': '', 'streaming': ' --streaming'}[spec.role]
        print(f'[{i}/{len(plan)}] Q{spec.query} on {spec.runner}{label} ...', end=' ',
              flush=True)
        result, cached = execute(spec, config, config_args, out_dir, args.timeout)
        runs[spec] = (result, cached)
        status = f'{result.output_count} outputs' if result.ok else f'FAILED {result.error}'
        print(f'{"cached, " if cached else f"{result.wall_s:.1f} s, "}{status}', flush=True)

    rows = [row for q in queries for row in rows_of_query(q, runs, config, args.streaming)]
    print()
    print(format_table(rows))
    command = 'python -m benchmarks.nexmark ' + ' '.join(argv)
    write_report(out_dir, rows, command, mode)
    print(f'\nwrote {out_dir}/results.csv, report.md, nexmark.png')
    return 0


if __name__ == '__main__':
    sys.exit(main())
