"""The first pipeline a user runs: word count, against Beam's DirectRunner and PySpark.

    python -m benchmarks.wordcount --words=2000000 --distinct=10000 --repeats=3 \\
        --out bench-out/wordcount [--bundle_sizes=default,100000] [--spark_master=local[2]]

Generates `--words` words (`--distinct` different ones, drawn uniformly with a fixed
seed, `WORDS_PER_LINE` a line) into a text file, then times, side by side in one
invocation, the same word count (read the file, split lines, count per word, write
`word: count` lines):

* `PySpark RDD`: the hand-written `textFile -> flatMap -> map -> reduceByKey ->
  saveAsTextFile`, on the SparkSession StreamsSparkRunner uses;
* Beam's `DirectRunner` as it comes and `DirectRunner (2 processes)` (the two
  configurations of `micro.DIRECT_RUNNERS`);
* `StreamsSparkRunner` (`ReadFromText -> FlatMap(split) -> Map((w, 1)) ->
  CombinePerKey(sum) -> WriteToText`), once per `--bundle_sizes` value (`default`:
  no `--bundle_size` flag).

Steady state: every configuration first runs `--warm_ups` times on a small file
(Spark starts, Beam and the workers import, the JVM compiles its hot code: its CPU
time per run keeps falling over the first few runs), and the SparkSession stays up.
Then `--repeats` rounds run every configuration in turn, so that a load on the machine
falls on all of them alike; a configuration's time is the median of its rounds. A load
from other sessions shares the CPU out per session (Linux's autogroup scheduling), not
per process: under such a load our two Spark workers get no more CPU than the
DirectRunner's one thread, so the report also gives each run's CPU time (`CpuClock`)
and how many cores the session got before and after the runs (`session_cores`).
Every run's output is read back
and compared with the counts the generator wrote down (`output_ok`: `yes`, or `failed:
...`; an empty output always fails); a time counts only for a run whose output is
`yes`. The report (`results.csv`, `results.md`, `wordcount.png`) gives each
configuration's median and its ratio to each DirectRunner configuration (> 1: faster
than that DirectRunner).
"""

from __future__ import annotations

import argparse
import collections
import glob
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io import ReadFromText, WriteToText
from apache_beam.options.pipeline_options import PipelineOptions

import beam_streams_runner  # noqa: F401 - registers the short runner name
from benchmarks import keyed_state_gc, micro, sink_check

PYSPARK = 'PySpark RDD'
SPARK = micro.SPARK
WORDS_PER_LINE = 10
WARM_UP_WORDS = 20_000


def generate(path: str, words: int, distinct: int, seed: int = 0) -> collections.Counter:
    """Writes `words` words of `distinct` different ones (`w0` ... uniformly drawn,
    `WORDS_PER_LINE` per line) to `path`; returns how often each word was written."""
    rng = random.Random(seed)
    vocabulary = [f'w{i}' for i in range(distinct)]
    counts: collections.Counter = collections.Counter()
    with open(path, 'w', encoding='utf-8') as f:
        for start in range(0, words, WORDS_PER_LINE):
            line = rng.choices(vocabulary, k=min(WORDS_PER_LINE, words - start))
            counts.update(line)
            f.write(' '.join(line) + '\n')
    return counts


def format_count(word_count: tuple[str, int]) -> str:
    word, count = word_count
    return f'{word}: {count}'


def expected_lines(counts: collections.Counter) -> list[str]:
    return [format_count(item) for item in counts.items()]


def build(p: beam.Pipeline, input_path: str, output_prefix: str) -> None:
    """The word count of the issue, as a user writes it."""
    _ = (p
         | 'Read' >> ReadFromText(input_path)
         | 'Split' >> beam.FlatMap(str.split)
         | 'Pair' >> beam.Map(lambda word: (word, 1))
         | 'Count' >> beam.CombinePerKey(sum)
         | 'Format' >> beam.Map(format_count)
         | 'Write' >> WriteToText(output_prefix))


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


def run_one(runner: str, bundle_size: str, input_path: str, out_dir: str,
            extra_args: Sequence[str]) -> tuple[float, float, list[str]]:
    """One run of the word count on `runner` (a row label); its wall time and CPU time
    (s, see `CpuClock`) and the output lines it wrote."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    prefix = os.path.join(out_dir, 'counts')
    cpu = CpuClock()
    if runner == PYSPARK:
        sc = spark_session(extra_args).sparkContext
        started = time.time()
        (sc.textFile(input_path)
         .flatMap(str.split)
         .map(lambda word: (word, 1))
         .reduceByKey(lambda a, b: a + b)
         .map(format_count)
         .saveAsTextFile(prefix))
        wall = time.time() - started
    else:
        runner_name, args = micro.runner_and_args(runner, extra_args)
        if bundle_size:
            args.append(f'--bundle_size={bundle_size}')
        started = time.time()
        with beam.Pipeline(runner=runner_name, options=PipelineOptions(args)) as p:
            build(p, input_path, prefix)
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
    return get_or_create_spark(options, 'wordcount benchmark')


def summarize(configs: Sequence[tuple[str, str]], walls: dict, cpus: dict, verdicts: dict,
              words: int, distinct: int) -> list[dict]:
    """One row per configuration: its median wall and CPU time over the rounds (if every
    round's output was right), and its ratio to each DirectRunner configuration's
    median wall time (theirs / ours)."""
    medians = {}
    for config in configs:
        ok = all(sink_check.is_ok(v) for v in verdicts[config])
        medians[config] = statistics.median(walls[config]) if ok and walls[config] else None
    rows = []
    for config in configs:
        runner, size = config
        failed = [v for v in verdicts[config] if not sink_check.is_ok(v)]
        row = {'runner': runner, 'bundle_size': size or ('default' if runner == SPARK else ''),
               'words': words, 'distinct': distinct,
               'output_ok': failed[0] if failed else sink_check.YES,
               'median_s': '' if medians[config] is None else round(medians[config], 2),
               'runs_s': ' '.join(f'{w:.2f}' for w in walls[config]),
               'cpu_s': ('' if medians[config] is None
                         else round(statistics.median(cpus[config]), 2))}
        for direct in micro.DIRECT_RUNNERS:
            theirs = medians.get((direct, ''))
            row[f'vs {direct}'] = ('' if theirs is None or medians[config] is None
                                   else round(theirs / medians[config], 2))
        rows.append(row)
    return rows


def write_report(rows: list[dict], out: str, cores: Sequence[float] = ()) -> None:
    """The table and plot; `cores`: what `session_cores` found before and after the runs."""
    found = (f'Cores this session got (`session_cores`, of {os.cpu_count()}): '
             f'{" before, ".join(map(str, cores))} after the runs.\n\n') if cores else ''
    micro.write_table(
        rows, out, 'results', 'Word count: StreamsSparkRunner, DirectRunner, PySpark',
        '\n![median wall time](wordcount.png)\n',
        before=found + (
            'Median wall time over the rounds, steady state (SparkSession up, every '
            'configuration warmed up on a small file first). `vs X` = X\'s median / this '
            'median (> 1: faster than X). `cpu_s`: median CPU seconds of the process and '
            'its descendants (JVM, Python workers, SDK workers) during the run. '
            '`output_ok`: every run\'s `word: count` lines equal the generated counts.\n\n'))
    plt = micro.pyplot()
    labels = [r['runner'].replace(' (', '\n(')
              + (f"\nbundle {r['bundle_size']}" if r['bundle_size'] else '')
              + ('' if sink_check.is_ok(r['output_ok']) else '\nOUTPUT FAILED') for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.4), 4.5))
    ax.bar(range(len(rows)), [r['median_s'] if r['median_s'] != '' else math.nan
                              for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel('median wall time (s)')
    ax.set_title(f"Word count, {rows[0]['words']:,} words ({rows[0]['distinct']:,} distinct)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'wordcount.png'), dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    """The command line (see the module docstring); returns the report's rows."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--words', type=int, default=2_000_000)
    parser.add_argument('--distinct', type=int, default=10_000)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--warm_ups', type=int, default=3,
                        help='runs of every configuration on a small file first (JIT, imports)')
    parser.add_argument('--runners', default=f'{PYSPARK},DirectRunner,{SPARK}',
                        help='DirectRunner runs as both ' + str(list(micro.DIRECT_RUNNERS)))
    parser.add_argument('--bundle_sizes', default='default',
                        help="StreamsSparkRunner's --bundle_size values ('default': none)")
    parser.add_argument('--out', default='bench-out/wordcount')
    known, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    # Spark's console progress bar would break the progress lines.
    extra = extra or ['--spark_master=local[2]',
                      '--spark_conf=spark.ui.showConsoleProgress=false']
    configs = configurations(known.bundle_sizes.split(','), micro.runner_labels(known.runners))
    work = tempfile.mkdtemp(prefix='wordcount-')
    cores = [session_cores()]
    print(f'this session gets {cores[0]} of {os.cpu_count()} cores', flush=True)
    try:
        input_path = os.path.join(work, 'words.txt')
        expected = expected_lines(generate(input_path, known.words, known.distinct))
        warm_up = os.path.join(work, 'warm-up.txt')
        generate(warm_up, min(WARM_UP_WORDS, known.words), 100, seed=1)
        for _ in range(known.warm_ups):
            for runner, size in configs:
                run_one(runner, size, warm_up, os.path.join(work, 'out'), extra)
        walls: dict = {config: [] for config in configs}
        cpus: dict = {config: [] for config in configs}
        verdicts: dict = {config: [] for config in configs}
        total = known.repeats * len(configs)
        for round_index in range(known.repeats):
            for index, (runner, size) in enumerate(configs):
                print(f'[{round_index * len(configs) + index + 1}/{total}] word count on '
                      f'{runner}{f", bundle size {size}" if size else ""} ...',
                      end=' ', flush=True)
                wall, cpu, lines = run_one(
                    runner, size, input_path, os.path.join(work, 'out'), extra)
                result = sink_check.lines_verdict(lines, expected)
                walls[(runner, size)].append(wall)
                cpus[(runner, size)].append(cpu)
                verdicts[(runner, size)].append(result)
                print(f'{wall:.2f} s (CPU {cpu:.2f} s), output {result}', flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cores.append(session_cores())
    rows = summarize(configs, walls, cpus, verdicts, known.words, known.distinct)
    write_report(rows, known.out, cores)
    print(open(os.path.join(known.out, 'results.md'), encoding='utf-8').read())
    return rows


if __name__ == '__main__':
    main(sys.argv[1:])
