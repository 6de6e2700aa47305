"""Batch speed: three pipelines against hand-written PySpark and Beam's DirectRunner.

    python -m benchmarks.batch_speed [--cases wordcount,gbk,maps] [--scale 1] \\
        [--repeats 3] [--warm_ups 3] [--bundle_sizes default,100000] \\
        [--out bench-out/batch-speed] [--spark_master=local[2]]

The cases (`batch_cases`: a word count over a text file, a GroupByKey and a sum per key,
20 chained Maps and a global sum), timed side by side in one invocation:

* `PySpark RDD`: the same pipeline hand-written on PySpark's RDD API, on the
  SparkSession StreamsSparkRunner uses;
* Beam's `DirectRunner` as it comes and `DirectRunner (2 processes)` (the two
  configurations of `micro.DIRECT_RUNNERS`);
* `StreamsSparkRunner`, once per `--bundle_sizes` value (`default`: no `--bundle_size`).

Steady state: every configuration of every case first runs `--warm_ups` times at a
hundredth of the size (Spark starts, Beam and the workers import, the JVM compiles its
hot code: its CPU time per run keeps falling over the first few runs), and the
SparkSession stays up. Then `--repeats` rounds run every configuration in turn, so that
a load on the machine falls on all of them alike; a configuration's time is the median
of its rounds. A load from other sessions shares the CPU out per session (Linux's
autogroup scheduling), not per process: under such a load our two Spark workers get no
more CPU than the DirectRunner's one thread, so the report also gives each run's CPU
time (`CpuClock`) and how many cores the session got before and after the runs
(`session_cores`). Every run's output is read back and compared with the lines the
case expects (`output_ok`: `yes`, or `failed: ...`; an empty output always fails); a
time counts only for a run whose output is `yes`. The report (`results.csv`,
`results.md`, `batch_speed.png`) gives each configuration's median, its ratio to
PySpark (`x PySpark`: its time / PySpark's) and each DirectRunner configuration's
ratio to it (> 1: faster than that DirectRunner), and the goals' verdicts
(`GOAL_TO_PYSPARK`, `GOAL_OVER_DIRECT`).
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

import beam_streams_runner  # noqa: F401 - registers the short runner name
from benchmarks import keyed_state_gc, micro, sink_check
from benchmarks.batch_cases import CASES, BatchCase, CaseInput

PYSPARK = 'PySpark RDD'
SPARK = micro.SPARK
WARM_UP_SCALE = 0.01
GOAL_TO_PYSPARK = 1.5  # at most this many times PySpark's time
GOAL_OVER_DIRECT = 2.0  # at least this many times faster than each DirectRunner


def configurations(bundle_sizes: Sequence[str], runners: Sequence[str]) -> list[tuple[str, str]]:
    """(runner label, bundle size or '') of every configuration, in run order."""
    configs: list[tuple[str, str]] = []
    for runner in runners:
        if runner == SPARK:
            configs += [(SPARK, '' if size == 'default' else size) for size in bundle_sizes]
        else:
            configs.append((runner, ''))
    return configs


class CpuClock:
    """CPU seconds of this process, the children it waited for and its live descendants
    (Spark's JVM and Python workers, the DirectRunner's SDK workers), from `/proc`: a
    figure a loaded machine disturbs less than wall time. A descendant that ended during
    the run without being waited for by this process is not counted."""

    def __init__(self) -> None:
        self._start = self._now()

    @staticmethod
    def _now() -> tuple[float, dict[int, float]]:
        own = sum(getattr(resource.getrusage(who), field)
                  for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                  for field in ('ru_utime', 'ru_stime'))
        children = keyed_state_gc._children()
        tick = os.sysconf('SC_CLK_TCK')
        descendants: dict[int, float] = {}
        pending = list(children.get(os.getpid(), []))
        while pending:
            pid = pending.pop()
            pending.extend(children.get(pid, []))
            try:
                with open(f'/proc/{pid}/stat', 'rb') as f:
                    fields = f.read().rsplit(b')', 1)[1].split()
            except OSError:
                continue
            descendants[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        return own, descendants

    def elapsed(self) -> float:
        (own0, before), (own1, after) = self._start, self._now()
        return own1 - own0 + sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


_BURN = """
import sys, time
start_at, budget = float(sys.argv[1]), float(sys.argv[2])
while time.time() < start_at:
    time.sleep(0.001)
began, cpu0 = time.time(), time.process_time()
while time.process_time() - cpu0 < budget:
    sum(range(10_000))
print(began, time.time(), time.process_time() - cpu0)
"""


def session_cores(processes: int = 2, cpu_s: float = 0.5) -> float:
    """How many cores this session gets now: `processes` busy loops of `cpu_s` CPU
    seconds each, started together; their CPU time over the wall time they took. With
    Linux's autogroup scheduling a session gets an equal share of the CPU whatever its
    number of processes, so 1.0 on two cores means another session is busy too."""
    start_at = time.time() + 2.0  # after the interpreters started
    children = [subprocess.Popen([sys.executable, '-c', _BURN, str(start_at), str(cpu_s)],
                                 stdout=subprocess.PIPE, text=True)
                for _ in range(processes)]
    results = [tuple(map(float, child.communicate()[0].split())) for child in children]
    wall = max(end for _, end, _ in results) - min(began for began, _, _ in results)
    return round(sum(cpu for _, _, cpu in results) / wall, 2)


def run_one(case: BatchCase, case_input: CaseInput, runner: str, bundle_size: str,
            out_dir: str, extra_args: Sequence[str]) -> tuple[float, float, list[str]]:
    """One run of `case` on `runner` (a row label); its wall time and CPU time (s, see
    `CpuClock`) and the output lines it wrote."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    prefix = os.path.join(out_dir, 'out')
    cpu = CpuClock()
    if runner == PYSPARK:
        sc = spark_session(extra_args).sparkContext
        started = time.time()
        case.pyspark(sc, case_input, prefix)
        wall = time.time() - started
    else:
        runner_name, args = micro.runner_and_args(runner, extra_args)
        if bundle_size:
            args.append(f'--bundle_size={bundle_size}')
        started = time.time()
        with beam.Pipeline(runner=runner_name, options=PipelineOptions(args)) as p:
            case.beam(p, case_input, prefix)
        wall = time.time() - started
    return wall, cpu.elapsed(), read_lines(prefix)


def read_lines(prefix: str) -> list[str]:
    """Every line of every file (a Beam shard, or a Spark `part-*` file) under `prefix`."""
    lines: list[str] = []
    for path in sorted(glob.glob(prefix + '*') + glob.glob(os.path.join(prefix, 'part-*'))):
        if os.path.isfile(path):
            with open(path, encoding='utf-8') as f:
                lines.extend(line.rstrip('\n') for line in f if line.strip())
    return lines


def spark_session(extra_args: Sequence[str]):
    """The SparkSession StreamsSparkRunner runs on (started like the runner starts it)."""
    from beam_streams_runner.driver.spark_session import get_or_create_spark
    from beam_streams_runner.options import StreamsSparkOptions
    options = PipelineOptions(list(extra_args)).view_as(StreamsSparkOptions)
    return get_or_create_spark(options, 'batch speed benchmark')


def summarize(case: str, configs: Sequence[tuple[str, str]], walls: dict, cpus: dict,
              verdicts: dict, elements: int) -> list[dict]:
    """One row per configuration of `case`: its median wall and CPU time over the rounds
    (if every round's output was right), its time over PySpark's, each DirectRunner
    configuration's median over its own, and whether it meets the goals."""
    medians = {}
    for config in configs:
        ok = all(sink_check.is_ok(v) for v in verdicts[config])
        medians[config] = statistics.median(walls[config]) if ok and walls[config] else None
    pyspark = medians.get((PYSPARK, ''))
    rows = []
    for config in configs:
        runner, size = config
        mine = medians[config]
        failed = [v for v in verdicts[config] if not sink_check.is_ok(v)]
        row = {'case': case, 'runner': runner,
               'bundle_size': size or ('default' if runner == SPARK else ''),
               'elements': elements, 'output_ok': failed[0] if failed else sink_check.YES,
               'median_s': '' if mine is None else round(mine, 2),
               'runs_s': ' '.join(f'{w:.2f}' for w in walls[config]),
               'cpu_s': '' if mine is None else round(statistics.median(cpus[config]), 2),
               'x PySpark': '' if mine is None or not pyspark else round(mine / pyspark, 2)}
        for direct in micro.DIRECT_RUNNERS:
            theirs = medians.get((direct, ''))
            row[f'vs {direct}'] = '' if theirs is None or mine is None else round(theirs / mine, 2)
        row['goals'] = goal_verdict(row) if runner == SPARK else ''
        rows.append(row)
    return rows


def goal_verdict(row: dict) -> str:
    """`met`, or what a StreamsSparkRunner row misses of the goals."""
    if row['median_s'] == '':
        return 'no time'
    if '' in (row['x PySpark'], *(row[f'vs {d}'] for d in micro.DIRECT_RUNNERS)):
        return 'not judged (a reference row has no time)'
    missed = []
    if row['x PySpark'] > GOAL_TO_PYSPARK:
        missed.append(f'> {GOAL_TO_PYSPARK}x PySpark')
    for direct in micro.DIRECT_RUNNERS:
        if row[f'vs {direct}'] < GOAL_OVER_DIRECT:
            missed.append(f'< {GOAL_OVER_DIRECT}x {direct}')
    return 'met' if not missed else 'missed: ' + ', '.join(missed)


def write_report(rows: list[dict], out: str, cores: Sequence[float] = ()) -> None:
    """The table and plot; `cores`: what `session_cores` found before and after the runs."""
    found = (f'Cores this session got (`session_cores`, of {os.cpu_count()}): '
             f'{" before, ".join(map(str, cores))} after the runs.\n\n') if cores else ''
    micro.write_table(
        rows, out, 'results', 'Batch speed: StreamsSparkRunner, DirectRunner, PySpark',
        '\n![median wall time](batch_speed.png)\n',
        before=found + (
            'Median wall time over the rounds, steady state (SparkSession up, every '
            'configuration warmed up on a small input first). `x PySpark` = this median / '
            'the hand-written PySpark median; `vs X` = X\'s median / this median (> 1: '
            f'faster than X). Goals: at most {GOAL_TO_PYSPARK}x PySpark and at least '
            f'{GOAL_OVER_DIRECT}x faster than each DirectRunner. `cpu_s`: median CPU '
            'seconds of the process and its descendants (JVM, Python workers, SDK '
            'workers) during the run. `output_ok`: every run\'s lines equal the expected '
            'ones.\n\n'))
    plt = micro.pyplot()
    cases = list(dict.fromkeys(r['case'] for r in rows))
    labels = list(dict.fromkeys(_label(r) for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, len(cases) * len(labels) * 0.6 + 2), 4.5))
    width = 0.8 / len(labels)
    for index, label in enumerate(labels):
        times = [next((r['median_s'] for r in rows if r['case'] == case and _label(r) == label
                       and r['median_s'] != ''), math.nan) for case in cases]
        ax.bar([c + index * width for c in range(len(cases))], times, width, label=label)
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))],
                  [f'{case}\n{_elements(rows, case):,} elements' for case in cases])
    ax.set_yscale('log')
    ax.set_ylabel('median wall time (s, log)')
    ax.set_title('Batch speed (a missing bar: no correct output)')
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'batch_speed.png'), dpi=120)
    plt.close(fig)


def _label(row: dict) -> str:
    size = row['bundle_size']
    return row['runner'] + (f', bundle {size}' if size and size != 'default' else '')


def _elements(rows: Sequence[dict], case: str) -> int:
    return next(r['elements'] for r in rows if r['case'] == case)


def main(argv: list[str] | None = None) -> list[dict]:
    """The command line (see the module docstring); returns the report's rows."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--cases', default=','.join(CASES))
    parser.add_argument('--scale', type=float, default=1.0,
                        help='input size as a share of the cases\' (2M words, 1M pairs/ints)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--warm_ups', type=int, default=3,
                        help='runs of every configuration on a small input first')
    parser.add_argument('--runners', default=f'{PYSPARK},DirectRunner,{SPARK}',
                        help='DirectRunner runs as both ' + str(list(micro.DIRECT_RUNNERS)))
    parser.add_argument('--bundle_sizes', default='default',
                        help="StreamsSparkRunner's --bundle_size values ('default': none)")
    parser.add_argument('--no_cores_check', action='store_true',
                        help='skip `session_cores` (its busy loops would show in a profile)')
    parser.add_argument('--out', default='bench-out/batch-speed')
    known, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    # Spark's console progress bar would break the progress lines.
    extra = extra or ['--spark_master=local[2]',
                      '--spark_conf=spark.ui.showConsoleProgress=false']
    unknown = [c for c in known.cases.split(',') if c not in CASES]
    if unknown:
        raise SystemExit(f'--cases: {", ".join(unknown)} not among {", ".join(CASES)}')
    configs = configurations(known.bundle_sizes.split(','), micro.runner_labels(known.runners))
    cores = [] if known.no_cores_check else [session_cores()]
    if cores:
        print(f'this session gets {cores[0]} of {os.cpu_count()} cores', flush=True)
    rows: list[dict] = []
    work = tempfile.mkdtemp(prefix='batch-speed-')
    try:
        for name in known.cases.split(','):
            rows += run_case(CASES[name], configs, known, extra, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if cores:
        cores.append(session_cores())
    write_report(rows, known.out, cores)
    print(open(os.path.join(known.out, 'results.md'), encoding='utf-8').read())
    return rows


def run_case(case: BatchCase, configs: Sequence[tuple[str, str]], known: argparse.Namespace,
             extra: Sequence[str], work: str) -> list[dict]:
    """Warm-ups, then `known.repeats` rounds of every configuration; the case's rows."""
    case_input = case.prepare(work, known.scale)
    warm_up = case.prepare(work, known.scale * WARM_UP_SCALE)
    out_dir = os.path.join(work, 'out')
    for _ in range(known.warm_ups):
        for runner, size in configs:
            run_one(case, warm_up, runner, size, out_dir, extra)
    walls: dict = {config: [] for config in configs}
    cpus: dict = {config: [] for config in configs}
    verdicts: dict = {config: [] for config in configs}
    total = known.repeats * len(configs)
    for round_index in range(known.repeats):
        for index, (runner, size) in enumerate(configs):
            print(f'[{case.name} {round_index * len(configs) + index + 1}/{total}] '
                  f'{case.title} on {runner}{f", bundle size {size}" if size else ""} ...',
                  end=' ', flush=True)
            wall, cpu, lines = run_one(case, case_input, runner, size, out_dir, extra)
            result = sink_check.lines_verdict(lines, case_input.expected)
            walls[(runner, size)].append(wall)
            cpus[(runner, size)].append(cpu)
            verdicts[(runner, size)].append(result)
            print(f'{wall:.2f} s (CPU {cpu:.2f} s), output {result}', flush=True)
    return summarize(case.name, configs, walls, cpus, verdicts, case_input.elements)


if __name__ == '__main__':
    main(sys.argv[1:])
