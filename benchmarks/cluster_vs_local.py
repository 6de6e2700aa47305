"""NEXMark and the churning-keys stateful DoFn on a two-worker standalone cluster against
`local[2]` on the same machine, side by side in one invocation.

    python -m benchmarks.cluster_vs_local [--events 1000000] [--queries 0,5,7] \\
        [--churn_events 500000] [--out benchmarks/results/<date>-cluster]

The cluster is the one `python -m beam_streams_runner.cluster start --workers 2` starts
(each worker one core and 2 GB, on 127.0.0.2 and 127.0.0.3), in a directory of the
invocation's own and stopped at the end; against it, `local[2]`: two task slots in the
driver's JVM. Both have two cores' worth of task slots on the same two cores. Every
streaming run, on both masters, keeps its keyed state in one `redis-server` the command
starts (`--checkpoint_store=redis://...`, `--checkpoint_period_s=0`), the store a
cluster needs, so that the state takes the same path on both. On the cluster the
benchmarks' own modules reach the executors as `spark.submit.pyFiles` (a zip).

Cases, each run on `local[2]` and then on the cluster, each in a fresh process:

* `start-up`: the runner's SparkSession on the master and a first job of two tasks
  (which starts the executors' Python workers): the fixed cost inside every other row;
  and the median of 20 more such jobs, the fixed cost of every streaming epoch;
* `Qn batch`, `Qn streaming`: `python -m benchmarks.nexmark --query n --events N
  [--streaming]`, each output compared with the DirectRunner's batch output over the
  same events (the launcher's verdict, its reference runs cached);
* `churning keys`: `python -m benchmarks.churning_keys` (a stateful DoFn with an
  event-time timer over keys that never recur, 1,000 per 1-s window).

A progress line per run; writes OUT/results.csv, OUT/report.md (the table: seconds on
each, cluster / local, events/s, verdicts) and OUT/cluster.png, and each run's output
under OUT/runs/.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks import sink_check
from benchmarks.children import REPO_ROOT as ROOT
from benchmarks.children import child_environment
from benchmarks.nexmark.runs import ship_benchmarks

LOCAL = 'local[2]'
CASES = {'start-up': None, 'batch': False, 'streaming': True, 'churning keys': None}
FIELDS = ('case', 'master', 'wall_s', 'events', 'events_per_s', 'verdict', 'note')


def _run(command: Sequence[str], log_path: str, timeout_s: float) -> tuple[int, str, float]:
    """Runs `command` from the repository; (exit code, its stdout, wall seconds)."""
    started = time.monotonic()
    with open(log_path, 'w', encoding='utf-8') as log:
        try:
            done = subprocess.run(list(command), cwd=ROOT, env=child_environment(),
                                  stdout=subprocess.PIPE, stderr=log, text=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL)
            code, out = done.returncode, done.stdout
        except subprocess.TimeoutExpired:
            code, out = -9, ''
    return code, out, time.monotonic() - started


def startup(master_args: Sequence[str], jobs: int = 20) -> dict:
    """In this process: the runner's session on the master, a first two-task job, then
    `jobs` more (a streaming epoch is a job: their median is its fixed cost)."""
    from benchmarks import batch_speed
    started = time.monotonic()
    spark = batch_speed.spark_session(master_args)
    session_s = time.monotonic() - started
    rdd = spark.sparkContext.parallelize(range(2), 2).map(lambda x: x + 1)
    total = rdd.sum()
    first_job_s = time.monotonic() - started - session_s
    times = []
    for _ in range(jobs):
        began = time.monotonic()
        total += rdd.sum()
        times.append(time.monotonic() - began)
    spark.stop()
    return {'session_s': round(session_s, 2), 'first_job_s': round(first_job_s, 2),
            'job_ms': round(1000 * statistics.median(times), 1),
            'ok': total == 3 * (jobs + 1)}


def run_startup(master_args: Sequence[str], log: str, timeout_s: float) -> dict:
    code, out, wall = _run([sys.executable, '-m', 'benchmarks.cluster_vs_local',
                            '--run-startup', *master_args], log, timeout_s)
    try:
        figures = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {'wall_s': round(wall, 2), 'verdict': f'failed: exit code {code}', 'note': ''}
    verdict = 'yes' if figures['ok'] else 'failed: the first job summed wrong'
    return {'wall_s': round(figures['session_s'] + figures['first_job_s'], 2),
            'verdict': verdict,
            'note': f"session {figures['session_s']} s, first job {figures['first_job_s']} "
                    f"s, a two-task job {figures['job_ms']} ms (median of 20)"}


def run_nexmark(queries: str, events: int, streaming: bool, master_args: Sequence[str],
                out: str, log: str, timeout_s: float) -> list[dict]:
    command = [sys.executable, '-m', 'benchmarks.nexmark', '--runner', 'StreamsSparkRunner',
               '--query', queries, '--events', str(events), '--out', out, '--no-direct-2p',
               *(['--streaming'] if streaming else []), *master_args]
    code, _, _ = _run(command, log, timeout_s)
    path = os.path.join(out, 'results.csv')
    if not os.path.exists(path):
        return [{'case': f'Q{q} {"streaming" if streaming else "batch"}', 'wall_s': '',
                 'verdict': f'failed: exit code {code}', 'note': ''}
                for q in queries.split(',')]
    with open(path, encoding='utf-8') as f:
        tested = [r for r in csv.DictReader(f) if r['runner'] == 'StreamsSparkRunner']
    return [{'case': f'Q{r["query"]} {"streaming" if streaming else "batch"}',
             'wall_s': float(r['wall_s']), 'events': events,
             'events_per_s': r['events_per_s'] if sink_check.is_ok(
                 r['equal_to_reference']) else '',
             'verdict': r['equal_to_reference'], 'note': r.get('note', '')} for r in tested]


def run_churn(events: int, master_args: Sequence[str], log: str, timeout_s: float) -> dict:
    code, out, _ = _run([sys.executable, '-m', 'benchmarks.churning_keys',
                         f'--events={events}', *master_args], log, timeout_s)
    try:
        figures = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {'case': 'churning keys', 'wall_s': '', 'verdict': f'failed: exit code {code}'}
    return {'case': 'churning keys', 'wall_s': figures['wall_s'], 'events': events,
            'events_per_s': figures['events_per_s'], 'verdict': figures['verdict'],
            'note': f"{figures['lines']} outputs"}


def ratio_rows(rows: Sequence[dict]) -> list[dict]:
    """Per case: both masters' seconds and events/s, cluster / local, both verdicts."""
    cases = list(dict.fromkeys(r['case'] for r in rows))
    table = []
    for case in cases:
        by = {r['master']: r for r in rows if r['case'] == case}
        local, cluster = by.get('local[2]', {}), by.get('cluster', {})
        both_ok = all(sink_check.is_ok(r.get('verdict', '')) for r in (local, cluster))
        ratio = (f"{cluster['wall_s'] / local['wall_s']:.2f}"
                 if both_ok and local.get('wall_s') else '')
        table.append({'case': case, 'local_s': local.get('wall_s', ''),
                      'cluster_s': cluster.get('wall_s', ''), 'ratio': ratio,
                      'local_eps': local.get('events_per_s', ''),
                      'cluster_eps': cluster.get('events_per_s', ''),
                      'verdicts': f"{local.get('verdict', '-')} / {cluster.get('verdict', '-')}",
                      'notes': f"{local.get('note', '')} / {cluster.get('note', '')}"})
    return table


def write_report(out: str, rows: Sequence[dict], table: Sequence[dict], meta: dict) -> None:
    with open(os.path.join(out, 'results.csv'), 'w', newline='', encoding='utf-8') as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction='ignore')
        writer.writeheader()
        writer.writerows(rows)
    lines = ['# The runner on a two-worker standalone cluster against local[2]', '',
             f"`{meta['command']}`", '',
             f"{meta['date']}, {meta['machine']}; PySpark {meta['pyspark']}, Beam "
             f"{meta['beam']}, Python {meta['python']}. Cluster: 2 workers x 1 core, 2 GB, "
             '127.0.0.2 and 127.0.0.3; local[2]: 2 task slots in the driver\'s JVM. '
             'Streaming state in one redis-server on both. Each run a fresh process, '
             'start-up included; cluster / local is the ratio of seconds (above 1: the '
             'cluster is slower). Verdicts: local / cluster.', '',
             '| case | local[2] s | cluster s | cluster / local | local[2] events/s '
             '| cluster events/s | verdicts | notes (local / cluster) |',
             '|---|---|---|---|---|---|---|---|']
    lines += [f"| {r['case']} | {r['local_s']} | {r['cluster_s']} | {r['ratio']} | "
              f"{r['local_eps']} | {r['cluster_eps']} | {r['verdicts']} | {r['notes']} |"
              for r in table]
    lines += ['', '![seconds per case, local[2] and the cluster](cluster.png)', '']
    with open(os.path.join(out, 'report.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines))
    plot(table, os.path.join(out, 'cluster.png'))


def plot(table: Sequence[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    shown = [r for r in table if r['ratio']]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(shown) + 2), 4))
    xs = range(len(shown))
    ax.bar([x - 0.2 for x in xs], [r['local_s'] for r in shown], 0.4, label='local[2]')
    ax.bar([x + 0.2 for x in xs], [r['cluster_s'] for r in shown], 0.4,
           label='standalone cluster, 2 workers')
    for x, r in zip(xs, shown, strict=True):
        ax.annotate(f"{r['ratio']}x", (x + 0.2, r['cluster_s']), ha='center', va='bottom',
                    fontsize=8)
    ax.set_xticks(list(xs), [r['case'] for r in shown], rotation=20, ha='right')
    ax.set_ylabel('seconds (start-up included)')
    ax.set_title('StreamsSparkRunner: cluster vs local[2], same machine')
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog='python -m benchmarks.cluster_vs_local',
                                description=__doc__.split('\n\n')[0])
    p.add_argument('--events', type=int, default=1_000_000, help='NEXMark events')
    p.add_argument('--queries', default='0,5,7')
    p.add_argument('--churn_events', type=int, default=500_000)
    p.add_argument('--cases', default=','.join(CASES), help='some of: ' + ', '.join(CASES))
    p.add_argument('--out', default=os.path.join(
        'benchmarks', 'results', f'{datetime.date.today().isoformat()}-cluster'))
    p.add_argument('--timeout', type=float, default=3600, help='per run, seconds')
    p.add_argument('--run-startup', dest='run_startup', action='store_true',
                   help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    known, rest = _parser().parse_known_args(argv)
    if known.run_startup:
        print(json.dumps(startup(rest)), flush=True)
        return 0
    unknown = set(known.cases.split(',')) - set(CASES)
    if unknown:
        _parser().error(f"unknown --cases {', '.join(sorted(unknown))}; "
                        f"some of: {', '.join(CASES)}")
    from beam_streams_runner.cluster import LocalCluster
    from beam_streams_runner.stores.redis_server import RedisServer
    out = os.path.abspath(known.out)
    logs = os.path.join(out, 'logs')
    os.makedirs(logs, exist_ok=True)
    cluster = LocalCluster.plan(tempfile.mkdtemp(prefix='bench-cluster-'), workers=2, cores=1,
                                port=0, webui_port=0)
    rows: list[dict] = []
    with RedisServer() as redis:
        cluster.start()
        try:
            # The NEXMark launcher ships its package to a cluster itself.
            masters = {'local[2]': f'--spark_master={LOCAL}',
                       'cluster': f'--spark_master={cluster.url}'}
            # The other cases' programs get it as pyFiles: zipped once, not once a run.
            shipped_args = {master: ship_benchmarks([flag], out)
                            for master, flag in masters.items()}
            state = [f'--checkpoint_store={redis.url_of(1)}', '--checkpoint_period_s=0']
            cases = [(c, CASES[c]) for c in known.cases.split(',')]
            for case, streaming in cases:
                for master, flag in masters.items():
                    name = f"{case.replace(' ', '-')}-{master.replace('[', '').replace(']', '')}"
                    log = os.path.join(logs, name + '.log')
                    shipped = shipped_args[master]
                    if case == 'start-up':
                        found = [{'case': case, **run_startup(shipped, log, known.timeout)}]
                    elif case == 'churning keys':
                        found = [run_churn(known.churn_events, [*shipped, *state], log,
                                           known.timeout)]
                    else:
                        found = run_nexmark(known.queries, known.events, streaming,
                                            [flag, *(state if streaming else [])],
                                            os.path.join(out, 'runs', name), log,
                                            known.timeout)
                    for row in found:
                        row['master'] = master
                        print(f"[{len(rows) + 1}] {row['case']} on {master}: "
                              f"{row.get('wall_s', '')} s, verdict {row['verdict']}",
                              flush=True)
                        rows.append(row)
        finally:
            cluster.stop()
    import apache_beam
    import pyspark
    meta = {'command': 'python -m benchmarks.cluster_vs_local ' + ' '.join(argv),
            'date': datetime.date.today().isoformat(),
            'machine': f'{os.cpu_count()} cores, {platform.machine()}',
            'pyspark': pyspark.__version__, 'beam': apache_beam.__version__,
            'python': platform.python_version()}
    table = ratio_rows(rows)
    write_report(out, rows, table, meta)
    print(open(os.path.join(out, 'report.md'), encoding='utf-8').read())
    return 0 if all(sink_check.is_ok(r['verdict']) for r in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
