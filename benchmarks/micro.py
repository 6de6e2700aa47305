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
streaming driver, where `--bundle_time_ms` also matters: `--streaming` runs the
same cases from an unbounded source, swept over bundle sizes, bundle times and
rates, with NEXMark queries alongside (`benchmarks.sweep`, which see).

The cases (`CASES`) take the stamped input, a PCollection of
`(key, (index, creation wall time))`, so the batch source here and the unbounded
source of `benchmarks.sweep` feed the same transforms.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

import beam_streams_runner  # noqa: F401 - registers the short runner name

SAMPLE_EVERY = 97  # latency is recorded for one element in SAMPLE_EVERY
KEYS = 10


def _stamped(n: int, keys: int):
    def generate(_):
        for i in range(n):
            yield window.TimestampedValue((i % keys, (i, time.time())), i / 1000.0)
    return generate


def batch_source(p: beam.Pipeline, n: int) -> beam.PCollection:
    """`n` stamped elements `(key, (i, creation time))` at event times i ms, reshuffled."""
    return p | beam.Impulse() | beam.FlatMap(_stamped(n, KEYS)) | beam.Reshuffle()


def latency_lines(element, w=beam.DoFn.WindowParam) -> list[str]:
    """For a sampled element `(i, created)`: one line
    `latency TAB after_window_end TAB created TAB window_end` (seconds; window_end empty in
    the global window).

    latency = now - created (creation to this sink); after_window_end = now - the end of
    the element's window (for an element out of a windowed GroupByKey: how long after its
    pane could first be complete it arrived; = latency in the global window). Elements
    whose index is not a multiple of `SAMPLE_EVERY` give no line.
    """
    i, created = element
    if i % SAMPLE_EVERY:
        return []
    now = time.time()
    end = w.end.micros / 1e6 if isinstance(w, window.IntervalWindow) else None
    after_end = now - (created if end is None else end)
    return [f'{now - created:.6f}\t{after_end:.6f}\t{created:.6f}\t'
            + ('' if end is None else f'{end:.6f}')]


# (latency, after window end, created, window end or None), seconds: `latency_lines`.
Sample = tuple[float, float, float, float | None]


def read_samples(directory: str) -> list[Sample]:
    """Every `latency_lines` line written under `directory` (files of any name), parsed."""
    samples: list[Sample] = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), encoding='utf-8') as f:
            for line in f:
                if line.strip():
                    latency, after_end, created, end = line.rstrip('\n').split('\t')
                    samples.append((float(latency), float(after_end), float(created),
                                    float(end) if end else None))
    return samples


def read_latencies(directory: str) -> tuple[list[float], list[float]]:
    """(latencies, after-window-end latencies) of the lines under `directory`, sorted."""
    samples = read_samples(directory)
    return sorted(s[0] for s in samples), sorted(s[1] for s in samples)


def percentile(values: Sequence[float], q: float, digits: int = 3) -> float | str:
    """The `q` quantile (0..1) of sorted `values`, rounded to `digits` decimals (ms by
    default; '' when empty)."""
    if not values:
        return ''
    if q == 0.5:
        return round(statistics.median(values), digits)
    return round(values[int(q * (len(values) - 1))], digits)


def chain_of_pardos(steps: int) -> Callable[[beam.PCollection], beam.PCollection]:
    def build(stamped: beam.PCollection) -> beam.PCollection:
        pc = stamped | beam.Values()
        for step in range(steps):
            pc = pc | f'ParDo{step}' >> beam.Map(lambda x: x)
        return pc
    return build


def sliding_window_gbk(stamped: beam.PCollection) -> beam.PCollection:
    return (stamped
            | beam.WindowInto(window.SlidingWindows(2, 1))
            | beam.GroupByKey()
            | beam.FlatMap(lambda kv: kv[1]))


# Each case: stamped input `(key, (i, created))` -> the `(i, created)` that reach the sink.
CASES: dict[str, Callable[[beam.PCollection], beam.PCollection]] = {
    '20 ParDos': chain_of_pardos(20),
    '1 ParDo': chain_of_pardos(1),
    'GBK sliding 2s every 1s on 10 keys': sliding_window_gbk,
}


def run_case(case: str, runner: str, n: int, bundle_size: int | None,
             extra_args: list[str]) -> dict:
    """One batch run of `case` over `n` elements; its row of the report."""
    args = list(extra_args)
    if bundle_size is not None:
        args.append(f'--bundle_size={bundle_size}')
    out_dir = tempfile.mkdtemp(prefix='micro-')
    started = time.time()
    with beam.Pipeline(runner=runner, options=PipelineOptions(args)) as p:
        (CASES[case](batch_source(p, n))
         | beam.FlatMap(latency_lines)
         | beam.io.WriteToText(os.path.join(out_dir, 'latency')))
    wall = time.time() - started
    latencies, _ = read_latencies(out_dir)
    return {
        'case': case, 'runner': runner, 'bundle_size': bundle_size or '', 'elements': n,
        'wall_s': round(wall, 2), 'elements_per_s': round(n / wall),
        'latency_p50_s': percentile(latencies, 0.5),
        'latency_p99_s': percentile(latencies, 0.99),
    }


def write_table(rows: Sequence[dict], out: str, name: str, title: str,
                after: str = '', before: str = '') -> None:
    """`rows` (dicts with the same keys) as `out/name.csv` and `out/name.md` (`# title`,
    then `before`, the Markdown table and `after`)."""
    os.makedirs(out, exist_ok=True)
    fields = list(rows[0])
    with open(os.path.join(out, f'{name}.csv'), 'w', newline='', encoding='utf-8') as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out, f'{name}.md'), 'w', encoding='utf-8') as f:
        f.write(f'# {title}\n\n' + before + markdown_table(rows) + '\n' + after)


def markdown_table(rows: Sequence[dict]) -> str:
    """`rows` (dicts with the same keys) as a Markdown table."""
    fields = list(rows[0])
    lines = ['| ' + ' | '.join(fields) + ' |', '|' + '---|' * len(fields)]
    lines += ['| ' + ' | '.join(str(row[k]).replace('|', '\\|') for k in fields) + ' |'
              for row in rows]
    return '\n'.join(lines) + '\n'


def pyplot():
    """matplotlib's pyplot on the Agg (file-only) backend."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def write_report(rows: list[dict], out: str) -> None:
    write_table(rows, out, 'micro', 'Micro benchmarks', '\n![throughput](micro.png)\n')
    plt = pyplot()
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
    """The command line (see the module docstring); returns the report's rows."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--streaming' in argv:
        from benchmarks import sweep
        return sweep.main([a for a in argv if a != '--streaming'])
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--elements', type=int, default=100_000)
    parser.add_argument('--runners', default='StreamsSparkRunner,DirectRunner')
    parser.add_argument('--bundle_sizes', default='10,100,1000')
    parser.add_argument('--cases', default=','.join(CASES))
    parser.add_argument('--out', default='bench-out')
    parser.add_argument('--streaming', action='store_true',
                        help='the streaming sweep instead (benchmarks.sweep; its options)')
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
