"""The micro benchmarks of the Streams runner paper, swept over bundle sizes.

(a) a chain of 20 sequential ParDos against a single ParDo over the same input;
(b) GroupByKey over sliding windows of 2 s every 1 s on 10 keys.
Each case runs on every runner named by `--runners`, for every `--bundle_sizes`
value (StreamsSparkRunner only; other runners have no bundle-size option), in
one process, side by side. Elements carry their creation wall time; the sink
measures per-element latency (creation to output) for a sample of elements, so
the report gives throughput and latency p50/p99 per case, runner and bundle
size, as a table (`micro.md`, `micro.csv`) and a plot (`micro.png`).

    python -m benchmarks.micro --elements=100000 --runners=StreamsSparkRunner,DirectRunner \\
        --bundle_sizes=10,100,1000 --out bench-out/

In batch, per-element latency is dominated by the job's length (everything is
read before a GroupByKey fires); it becomes the interesting figure with the
streaming driver, where `--bundle_time_ms` also matters.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

import beam_streams_runner  # noqa: F401 - registers the short runner name

SAMPLE_EVERY = 97  # latency is recorded for one element in SAMPLE_EVERY


def _stamped(n: int, keys: int):
    def generate(_):
        for i in range(n):
            yield window.TimestampedValue((i % keys, (i, time.time())), i / 1000.0)
    return generate


def _latency_lines(element) -> list[str]:
    i, created = element
    if i % SAMPLE_EVERY:
        return []
    return [f'{time.time() - created:.6f}']


def chain_of_pardos(steps: int) -> Callable[[beam.Pipeline, int], beam.PCollection]:
    def build(p: beam.Pipeline, n: int) -> beam.PCollection:
        pc = (p | beam.Impulse() | beam.FlatMap(_stamped(n, 10)) | beam.Reshuffle()
              | beam.Values())
        for step in range(steps):
            pc = pc | f'ParDo{step}' >> beam.Map(lambda x: x)
        return pc
    return build


def sliding_window_gbk(p: beam.Pipeline, n: int) -> beam.PCollection:
    return (p | beam.Impulse() | beam.FlatMap(_stamped(n, 10)) | beam.Reshuffle()
            | beam.WindowInto(window.SlidingWindows(2, 1))
            | beam.GroupByKey()
            | beam.FlatMap(lambda kv: kv[1]))


CASES: dict[str, Callable[[beam.Pipeline, int], beam.PCollection]] = {
    '20 ParDos': chain_of_pardos(20),
    '1 ParDo': chain_of_pardos(1),
    'GBK sliding 2s every 1s on 10 keys': sliding_window_gbk,
}


def run_case(case: str, runner: str, n: int, bundle_size: int | None,
             extra_args: list[str]) -> dict:
    args = list(extra_args)
    if bundle_size is not None:
        args.append(f'--bundle_size={bundle_size}')
    out_dir = tempfile.mkdtemp(prefix='micro-')
    started = time.time()
    with beam.Pipeline(runner=runner, options=PipelineOptions(args)) as p:
        (CASES[case](p, n)
         | beam.FlatMap(_latency_lines)
         | beam.io.WriteToText(os.path.join(out_dir, 'latency')))
    wall = time.time() - started
    latencies = []
    for name in os.listdir(out_dir):
        with open(os.path.join(out_dir, name)) as f:
            latencies += [float(line) for line in f if line.strip()]
    latencies.sort()
    return {
        'case': case, 'runner': runner, 'bundle_size': bundle_size or '', 'elements': n,
        'wall_s': round(wall, 2), 'elements_per_s': round(n / wall),
        'latency_p50_s': round(statistics.median(latencies), 3) if latencies else '',
        'latency_p99_s': (round(latencies[int(0.99 * (len(latencies) - 1))], 3)
                          if latencies else ''),
    }


def write_report(rows: list[dict], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    fields = list(rows[0])
    with open(os.path.join(out, 'micro.csv'), 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out, 'micro.md'), 'w') as f:
        f.write('# Micro benchmarks\n\n| ' + ' | '.join(fields) + ' |\n')
        f.write('|' + '---|' * len(fields) + '\n')
        for row in rows:
            f.write('| ' + ' | '.join(str(row[k]) for k in fields) + ' |\n')
        f.write('\n![throughput](micro.png)\n')
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    labels = [f"{r['case']}\n{r['runner']}\nbundle {r['bundle_size'] or '-'}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 5))
    ax.bar(range(len(rows)), [r['elements_per_s'] for r in rows])
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=7)
    ax.set_yscale('log')
    ax.set_ylabel('elements/s (wall time)')
    ax.set_title('Micro benchmarks')
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'micro.png'), dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--elements', type=int, default=100_000)
    parser.add_argument('--runners', default='StreamsSparkRunner,DirectRunner')
    parser.add_argument('--bundle_sizes', default='10,100,1000')
    parser.add_argument('--cases', default=','.join(CASES))
    parser.add_argument('--out', default='bench-out')
    known, extra = parser.parse_known_args(argv)
    rows = []
    plan = []
    for case in known.cases.split(','):
        for runner in known.runners.split(','):
            sizes = ([int(s) for s in known.bundle_sizes.split(',')]
                     if runner == 'StreamsSparkRunner' else [None])
            plan += [(case, runner, size) for size in sizes]
    if 'StreamsSparkRunner' in known.runners.split(','):
        # Steady state: Spark's start-up is not part of any case's time.
        run_case('1 ParDo', 'StreamsSparkRunner', 10, None, extra)
    for index, (case, runner, size) in enumerate(plan, 1):
        print(f'[{index}/{len(plan)}] {case} on {runner}, bundle size {size or "-"} ...',
              end=' ', flush=True)
        row = run_case(case, runner, known.elements, size,
                       extra if runner == 'StreamsSparkRunner' else [])
        print(f"{row['wall_s']} s, {row['elements_per_s']} elements/s", flush=True)
        rows.append(row)
    write_report(rows, known.out)
    print(open(os.path.join(known.out, 'micro.md')).read())
    return rows


if __name__ == '__main__':
    main(sys.argv[1:])
