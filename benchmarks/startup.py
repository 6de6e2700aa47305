"""Start-up: what a fresh process pays before a batch pipeline's own work, per system.

    python -m benchmarks.startup [--repeats 3] [--out bench-out/startup] \\
        [--spark_master=local[2]]

Every run is a fresh Python process running the same two-element pipeline (`a`, `b`
upper-cased and written as text), the way a user starts one:

* `PySpark RDD`: `import pyspark`, a SparkSession with PySpark's defaults, the pipeline
  hand-written (`parallelize -> map -> saveAsTextFile`);
* `DirectRunner`: `import apache_beam`, the pipeline on Beam's DirectRunner;
* `StreamsSparkRunner`: `import apache_beam` and the runner, the pipeline on the runner
  (which starts its SparkSession), and, in a second process, the same in phases: the
  runner's session (`get_or_create_spark`), a first two-task job of plain Python (the
  Python workers start: the runner's daemon imports Beam before it forks them), then
  the pipeline on that session; `phases, no class archive` the same with the runner's
  JVM options given by the user, so its driver JVM maps no archive of Spark's classes
  (`driver/jvm_class_cache.py`; an uncounted first run writes the archive if missing).

The systems take turns in each of `--repeats` rounds, so that a load on the machine
falls on all of them alike; each figure is the median of its rounds. Each run's output
is read back (`A`, `B`: `output_ok`), and a time counts only for a run whose output is
right. The report (`results.md`, `results.csv`, `startup.png`) gives each system's
whole-process wall time, its phases and its ratio to PySpark's.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks.children import REPO_ROOT, child_environment

PYSPARK, DIRECT, SPARK = 'PySpark RDD', 'DirectRunner', 'StreamsSparkRunner'
PHASES, NO_ARCHIVE = 'phases', 'phases, no class archive'
SYSTEMS = (PYSPARK, DIRECT, SPARK, PHASES, NO_ARCHIVE)
# The runner's JVM options set by the user: its driver JVM maps no class archive.
_OWN_JVM_OPTIONS = '--spark_conf=spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1'
EXPECTED = ['A', 'B']
PHASE_FIELDS = ('imports_s', 'session_s', 'first_job_s', 'pipeline_s')
FIELDS = ('system', 'wall_s', 'x_pyspark', *PHASE_FIELDS, 'output_ok', 'rounds')


# One run, in a process of its own (this module imports nothing heavy at its top, so
# that each system's own imports are what its run pays) ------------------------------
def run_one(system: str, out: str, master: str) -> dict:
    """Runs `system`'s pipeline in this process; its phases in seconds from the start."""
    phases: dict = {}
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 2)
        mark = now

    if system == PYSPARK:
        from pyspark.sql import SparkSession
        lap('imports_s')
        spark = SparkSession.builder.master(master).appName('startup').getOrCreate()
        lap('session_s')
        spark.sparkContext.parallelize(['a', 'b'], 2).map(str.upper).saveAsTextFile(out)
        lap('pipeline_s')
        spark.stop()
        return phases
    import apache_beam as beam
    from apache_beam.io import WriteToText
    from apache_beam.options.pipeline_options import PipelineOptions
    runner = 'DirectRunner'
    args = []
    if system != DIRECT:
        import beam_streams_runner
        runner = beam_streams_runner.StreamsSparkRunner()
        args = [f'--spark_master={master}']
        if system == NO_ARCHIVE:
            args.append(_OWN_JVM_OPTIONS)
    lap('imports_s')
    if system in (PHASES, NO_ARCHIVE):
        from beam_streams_runner.driver.spark_session import get_or_create_spark
        spark = get_or_create_spark(PipelineOptions(args), 'startup')
        lap('session_s')
        spark.sparkContext.parallelize(range(2), 2).map(lambda x: x + 1).sum()
        lap('first_job_s')
    with beam.Pipeline(runner=runner, options=PipelineOptions(args)) as p:
        _ = (p | beam.Create(['a', 'b']) | beam.Map(str.upper)
             | WriteToText(os.path.join(out, 'part')))
    lap('pipeline_s')
    return phases


def output_verdict(out: str) -> str:
    from benchmarks import sink_check
    lines = []
    for path in sorted(glob.glob(os.path.join(out, 'part*'))):
        with open(path, encoding='utf-8') as f:
            lines.extend(line.rstrip('\n') for line in f)
    return sink_check.lines_verdict(sorted(lines), EXPECTED)


def run_process(system: str, work: str, master: str, round_no: int,
                timeout_s: float = 600) -> dict:
    """One run of `system` as a fresh process: its wall time, phases and verdict."""
    from benchmarks import sink_check
    out = os.path.join(work, f'{system.replace(" ", "-")}-{round_no}')
    started = time.monotonic()
    log_path = out + '.log'
    with open(log_path, 'w', encoding='utf-8') as log:
        try:
            done = subprocess.run(
                [sys.executable, '-m', 'benchmarks.startup', '--run-one', system,
                 '--out', out, f'--spark_master={master}'],
                cwd=REPO_ROOT, env=child_environment(), stdout=subprocess.PIPE, stderr=log,
                text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
            code, stdout = done.returncode, done.stdout
        except subprocess.TimeoutExpired:
            code, stdout = -9, ''
    wall = time.monotonic() - started
    result = {'wall_s': wall, 'phases': {}}
    if code != 0:
        result['output_ok'] = f'{sink_check.FAILED}: exit {code}, see {log_path}'
        return result
    result['phases'] = json.loads(stdout.strip().splitlines()[-1])
    result['output_ok'] = output_verdict(out)
    return result


# The report ---------------------------------------------------------------------------
def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per system: medians over its rounds, if every round's output was right."""
    from benchmarks import sink_check
    rows = []
    for system, results in runs.items():
        failed = [r['output_ok'] for r in results if not sink_check.is_ok(r['output_ok'])]
        row = {'system': system, 'rounds': len(results),
               'output_ok': failed[0] if failed else sink_check.YES}
        if not failed and results:
            row['wall_s'] = round(statistics.median(r['wall_s'] for r in results), 2)
            for field in PHASE_FIELDS:
                values = [r['phases'][field] for r in results if field in r['phases']]
                row[field] = round(statistics.median(values), 2) if values else ''
        rows.append(row)
    pyspark = next((r.get('wall_s') for r in rows if r['system'] == PYSPARK), None)
    for row in rows:
        if pyspark and row.get('wall_s'):
            row['x_pyspark'] = round(row['wall_s'] / pyspark, 2)
    return rows


def write_report(rows: list[dict], out: str, command: str) -> None:
    with open(os.path.join(out, 'results.csv'), 'w', newline='', encoding='utf-8') as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({field: row.get(field, '') for field in FIELDS})
    lines = [
        '# Start-up: a two-element pipeline in a fresh process', '',
        f'Command: `{command}`', '',
        'Wall time of the whole process (interpreter, imports, session, pipeline), median '
        'of the rounds; the phases are measured inside the process. `phases` is the '
        "runner's start-up taken apart: its session, a first job of plain Python "
        "(starting the Python workers), then the pipeline on that session.", '',
        '| ' + ' | '.join(FIELDS) + ' |', '|' + '---|' * len(FIELDS)]
    for row in rows:
        lines.append('| ' + ' | '.join(str(row.get(field, '')) for field in FIELDS) + ' |')
    lines += ['', '![wall time and phases per system](startup.png)', '']
    with open(os.path.join(out, 'results.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines))
    plot(rows, os.path.join(out, 'startup.png'))


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    shown = [row for row in rows if row.get('wall_s')]
    fig, ax = plt.subplots(figsize=(8, 4))
    for index, row in enumerate(shown):
        bottom = 0.0
        for field in PHASE_FIELDS:
            value = row.get(field) or 0
            ax.bar(index, value, bottom=bottom, label=field if index == 0 else None,
                   color=f'C{PHASE_FIELDS.index(field)}')
            bottom += value
        ax.plot([index - 0.4, index + 0.4], [row['wall_s']] * 2, color='black')
    ax.set_xticks(range(len(shown)), [row['system'] for row in shown])
    ax.set_ylabel('seconds (line: whole process)')
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--out', default='bench-out/startup')
    parser.add_argument('--spark_master', default='local[2]')
    parser.add_argument('--run-one', dest='run_one', choices=SYSTEMS)
    args = parser.parse_args(argv)
    if args.run_one:
        phases = run_one(args.run_one, args.out, args.spark_master)
        print(json.dumps(phases), flush=True)
        return 0
    os.makedirs(args.out, exist_ok=True)
    runs: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
    with tempfile.TemporaryDirectory(prefix='startup-') as work:
        # Uncounted: leaves the class archive of the runner's driver JVM, if missing.
        run_process(SPARK, work, args.spark_master, -1)
        for round_no in range(args.repeats):
            for system in SYSTEMS:
                result = run_process(system, work, args.spark_master, round_no)
                runs[system].append(result)
                print(f'round {round_no + 1}/{args.repeats} {system}: '
                      f'{result["wall_s"]:.1f} s {result["phases"]} {result["output_ok"]}',
                      flush=True)
    rows = summarize(runs)
    command = 'python -m benchmarks.startup ' + ' '.join(argv if argv is not None
                                                          else sys.argv[1:])
    write_report(rows, args.out, command.strip())
    from benchmarks import sink_check
    print(open(os.path.join(args.out, 'results.md'), encoding='utf-8').read())
    return 0 if all(sink_check.is_ok(row['output_ok']) for row in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
