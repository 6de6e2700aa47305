"""The comparison's command: batch and streaming NEXMark on this runner, Spark and Flink.

    bash benchmarks/nexmark/setup_flink_venv.sh     # once: PyFlink in .venv-flink
    python -m benchmarks.compare --out benchmarks/results/<date>-compare

In one invocation, on this machine, with two cores for every engine:

1. **Batch** (`batch.run_batch`): Q0, Q1, Q2, Q3, Q5, Q7, Q8 over `--events` generated
   events on this runner, Beam's DirectRunner (one worker; two processes), hand-written
   PySpark and PyFlink (not Q8), every output judged against the DirectRunner's.
2. **Streaming, as fast as possible**: the same events as JSON-lines files in a directory
   (`stream_files`), read as a stream by this runner (Beam's own queries), Spark
   Structured Streaming (DataFrame API; `transformWithStateInPandas` for Q3, Q5, Q7)
   and PyFlink (Python DataStream; Flink SQL); each run twice, without fault tolerance
   and with it at the same `--checkpoint_period_s` (consistent regions, Spark's
   checkpoint location, Flink's exactly-once checkpoints), each output judged against
   the batch reference.
3. **Latency** at `--rate` events/s for `--latency_queries` (checkpoints on): the events
   written into the directory as they fall due, p50/p99 of output latency.

A system that cannot run here (PyFlink without its virtualenv) is reported as not run,
with what to do. Progress: a line per run. Output: `--out/report.md` (`report`),
`batch.csv`, `streaming.csv`, `throughput.png`, `latency.png`, and each run's log under
`--out/logs/`.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks.compare import report
from benchmarks.compare.batch import BatchRow, reference_of, run_batch
from benchmarks.compare.stream_runs import StreamRow, run_stream
from benchmarks.compare.systems import FLINK_DATASTREAM, SYSTEMS, StreamingSystem
from benchmarks.nexmark import stream_files
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.launcher import parse_queries

QUERIES = '0,1,2,3,5,7,8'
LATENCY_QUERIES = '0,5,7'
EVENTS_PER_FILE = 20_000


def build_parser() -> argparse.ArgumentParser:
    today = time.strftime('%Y-%m-%d')
    parser = argparse.ArgumentParser(
        prog='python -m benchmarks.compare',
        description='NEXMark batch and streaming on this runner, Spark and Flink, '
                    'in one report.')
    parser.add_argument('--events', type=int, default=1_000_000)
    parser.add_argument('--queries', default=QUERIES)
    parser.add_argument('--latency_queries', default=LATENCY_QUERIES)
    parser.add_argument('--rate', type=float, default=2000.0,
                        help='events/s of the latency runs')
    parser.add_argument('--latency_events', type=int, default=60_000)
    parser.add_argument('--checkpoint_period_s', type=float, default=1.0,
                        help='every engine checkpoints at this period (Spark: every '
                             'micro-batch whatever it is)')
    parser.add_argument('--systems', default='all',
                        help='streaming systems by short name, comma-separated '
                             '(ours, Spark SQL, Spark tWSIP, PyFlink DS, Flink SQL)')
    parser.add_argument('--no-batch', dest='batch', action='store_false')
    parser.add_argument('--no-streaming', dest='streaming', action='store_false')
    parser.add_argument('--no-latency', dest='latency', action='store_false')
    parser.add_argument('--timeout', type=float, default=1800.0, help='per run, seconds')
    parser.add_argument('--work_dir', default=None,
                        help='events, checkpoints and the references of this invocation '
                             '(default: a temporary directory, removed at the end)')
    parser.add_argument('--out', default=f'benchmarks/results/{today}-compare')
    return parser


def _version(cmd: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
        return (done.stdout or done.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return 'not available'


def header(argv: Sequence[str], systems: Sequence[StreamingSystem]) -> list[str]:
    """The report's title, machine, versions and command."""
    import apache_beam
    import pyspark

    flink = next((s for s in systems if s.flink and not s.available()), None)
    pyflink = (_version([flink.python, '-c', 'import pyflink.version as v; '
                         'print(v.__version__)']) if flink else 'not installed')
    return [f'# NEXMark on StreamsSparkRunner, Spark and Flink ({time.strftime("%Y-%m-%d")})',
            '', f'Machine: {os.cpu_count()} cores, {platform.machine()}, '
            f'Python {platform.python_version()}, {_version(["java", "-version"])}.',
            f'Versions: apache-beam {apache_beam.__version__}, PySpark {pyspark.__version__}, '
            f'PyFlink {pyflink}.',
            f'Command: `python -m benchmarks.compare {" ".join(argv)}`']


def selected(spec: str) -> list[StreamingSystem]:
    if spec == 'all':
        return list(SYSTEMS)
    names = [n.strip() for n in spec.split(',')]
    chosen = [s for s in SYSTEMS if report.short_name(s) in names]
    unknown = set(names) - {report.short_name(s) for s in chosen}
    if unknown:
        raise SystemExit(f'unknown --systems {sorted(unknown)}: choose from '
                         f'{[report.short_name(s) for s in SYSTEMS]}')
    return chosen


def streaming_runs(args: argparse.Namespace, systems: Sequence[StreamingSystem],
                   work: str, out: str, reference) -> list[StreamRow]:
    """Every streaming and latency run the options ask for, with a progress line each."""
    config = NexmarkConfig(num_events=args.events)
    plan = []
    if args.streaming:
        plan += [(q, s, c, None) for q in parse_queries(args.queries) for s in systems
                 if q in s.queries for c in (False, True)]
    if args.latency:
        plan += [(q, s, True, args.rate) for q in parse_queries(args.latency_queries)
                 for s in systems if q in s.queries]
    events_dir = os.path.join(work, 'events')
    if args.streaming and plan:
        print(f'writing {args.events:,} events to {events_dir} ...', flush=True)
        stream_files.write_event_files(config, events_dir, EVENTS_PER_FILE)
    rows = []
    for i, (q, system, checkpoints, rate) in enumerate(plan, 1):
        tag = (f'q{q}-{report.short_name(system).replace(" ", "-")}'
               f'-{"ckpt" if checkpoints else "nockpt"}{f"-{rate:g}" if rate else ""}')
        why_not = system.available()
        if why_not:
            row = StreamRow(q, system.name, checkpoints, rate, equal=f'not run: {why_not}')
        else:
            run_dir = os.path.join(work, 'runs', tag)
            run_config = (config.replace(num_events=args.latency_events) if rate else config)
            row = run_stream(system, q, run_config,
                             os.path.join(run_dir, 'events') if rate else events_dir,
                             os.path.join(run_dir, 'work'),
                             lambda cfg, q=q: reference(q, cfg), args.timeout,
                             args.checkpoint_period_s if checkpoints else None, rate)
            log = os.path.join(run_dir, 'work', 'log.txt')
            if os.path.exists(log):
                shutil.copyfile(log, os.path.join(out, 'logs', f'{tag}.log'))
            shutil.rmtree(run_dir, ignore_errors=True)
        latency = (f', p50 {row.latency_p50_s:.2f} s, p99 {row.latency_p99_s:.2f} s'
                   if row.latency_p99_s is not None else '')
        print(f'[streaming {i}/{len(plan)}] Q{q} {system.name}, checkpoints '
              f'{"on" if checkpoints else "off"}, {f"{rate:g}/s" if rate else "max"}: '
              f'{row.events_per_s:,.0f} events/s, peak {row.peak_mb:,.0f} MB{latency}, '
              f'{row.equal}', flush=True)
        rows.append(row)
    return rows


def clear_measured_caches(work: str, batch: bool) -> None:
    """Forgets the references and batch runs an earlier invocation left in `work` when
    this one measures batch: the DirectRunner's batch row is the reference run, taken from
    the cache when there, so an old cache would put another invocation's time in this
    report. (Without the batch half the references only judge outputs: kept.)"""
    if batch:
        for sub in ('references', 'batch'):
            shutil.rmtree(os.path.join(work, sub), ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    systems = selected(args.systems)
    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, 'logs'), exist_ok=True)
    work = args.work_dir or tempfile.mkdtemp(prefix='compare-')
    clear_measured_caches(work, args.batch)
    os.environ['NEXMARK_REFERENCE_CACHE'] = os.path.join(work, 'references')
    queries = parse_queries(args.queries)
    batch_dir = os.path.join(work, 'batch')
    batch: list[BatchRow] = []
    try:
        if args.batch:
            natives = ['spark'] + (['flink'] if not FLINK_DATASTREAM.available() else [])
            batch = run_batch(queries, NexmarkConfig(num_events=args.events), batch_dir,
                              args.timeout, natives)
            shutil.copytree(os.path.join(batch_dir, 'logs'), os.path.join(out, 'logs'),
                            dirs_exist_ok=True)
        reference = reference_of(batch_dir, args.timeout)
        os.makedirs(os.path.join(batch_dir, 'outputs'), exist_ok=True)
        os.makedirs(os.path.join(batch_dir, 'logs'), exist_ok=True)
        streaming = streaming_runs(args, systems, work, out, reference)
        notes = [f'* Streaming events: {args.events:,} in files of {EVENTS_PER_FILE:,}; '
                 f'checkpoint period {args.checkpoint_period_s:g} s on every engine '
                 '(Spark commits offsets and state every micro-batch: its "no checkpoints" '
                 'runs write them to a temporary directory).',
                 *(f'* {s.name}: not run: {s.available()}' for s in systems if s.available())]
        text = report.write_report(out, header(argv, systems), batch, streaming, notes)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print(text)
    print(f'wrote {out}/report.md, batch.csv, streaming.csv, throughput.png, latency.png')
    return 0
