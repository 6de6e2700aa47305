"""The micro benchmarks of the Streams runner paper, swept over bundle sizes.

(a) a chain of 20 sequential ParDos against a single ParDo over the same input;
(b) GroupByKey over sliding windows of 2 s every 1 s on 10 keys.
Each case runs on every runner named by `--runners`, for every `--bundle_sizes`
value (StreamsSparkRunner only; other runners have no bundle-size option), in
one process, side by side. `DirectRunner` stands for two rows, Beam's DirectRunner
as it comes (one worker, in this process) and `DirectRunner (2 processes)`
(`--direct_num_workers=2 --direct_running_mode=multi_processing`: two SDK worker
processes over gRPC, as many as the 2 cores StreamsSparkRunner gets with `local[2]`),
both pinned to Beam's FnApiRunner (`DIRECT_RUNNERS`). Each pipeline of the second
starts its own worker processes, so its wall time includes their start-up, which the
warmed-up Spark session does not pay.

Elements carry their creation wall time. The sink (`sink_check.CountingSink`) counts
every element that reaches it, with the sum of their indices as a checksum, and
measures per-element latency (creation to output) for a sample of elements; the report
gives, per case, runner and bundle size, whether the output arrived (`output_ok`:
`yes` when the sink got every element exactly as often as its windows imply and the
indices sum up, else `failed: expected N, got M`), throughput (elements / wall time,
only for a run whose output is `yes`) and latency p50/p99, as a table (`micro.md`,
`micro.csv`) and a plot (`micro.png`).

    python -m benchmarks.micro --elements=100000 --runners=StreamsSparkRunner,DirectRunner \\
        --bundle_sizes=10,100,1000 --out bench-out/

In batch, per-element latency is dominated by the job's length (everything is
read before a GroupByKey fires); it becomes the interesting figure with the
streaming driver, where `--bundle_time_ms` also matters: `python -m benchmarks.sweep`
runs the same cases from an unbounded source, swept over bundle sizes, bundle times
and rates, with NEXMark queries alongside (which see; it imports this module, never
the other way round).

The cases (`CASES`) take the stamped input, a PCollection of
`(key, (index, creation wall time))`, so the batch source here and the unbounded
source of `benchmarks.sweep` feed the same transforms; `COPIES` says how often each
element reaches the sink (once per window it is in).
"""

from __future__ import annotations

import argparse
import csv
import math
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
from benchmarks import sink_check

SAMPLE_EVERY = 97  # latency is recorded for one element in SAMPLE_EVERY
KEYS = 10
SPARK = 'StreamsSparkRunner'
DIRECT = 'DirectRunner'
DIRECT_2 = 'DirectRunner (2 processes)'
# Beam's DirectRunner configurations, by row label: its default (one worker) and as
# many worker processes as StreamsSparkRunner's local[2] has cores. Both pin Beam's
# FnApiRunner: with --allow_unsafe_triggers the DirectRunner does not first try to
# fetch and start Prism (which would ignore the worker options, and whose failed
# download would count in the wall time).
DIRECT_RUNNERS: dict[str, list[str]] = {
    DIRECT: ['--allow_unsafe_triggers'],
    DIRECT_2: ['--allow_unsafe_triggers', '--direct_num_workers=2',
               '--direct_running_mode=multi_processing'],
}


def runner_labels(spec: str) -> list[str]:
    """The row labels of `--runners`: `DirectRunner` stands for both `DIRECT_RUNNERS`."""
    labels: list[str] = []
    for name in (n.strip() for n in spec.split(',')):
        if name == DIRECT:
            labels += DIRECT_RUNNERS
        elif name:
            labels.append(name)
    return list(dict.fromkeys(labels))


def _stamped(n: int, keys: int):
    def generate(_):
        for i in range(n):
            yield window.TimestampedValue((i % keys, (i, time.time())), i / 1000.0)
    return generate


def batch_source(p: beam.Pipeline, n: int) -> beam.PCollection:
    """`n` stamped elements `(key, (i, creation time))` at event times i ms, reshuffled."""
    return p | beam.Impulse() | beam.FlatMap(_stamped(n, KEYS)) | beam.Reshuffle()


def latency_line(element: tuple[int, float], w, now: float) -> str:
    """The line `latency TAB after_window_end TAB created TAB window_end` (seconds;
    window_end empty outside an `IntervalWindow`) of element `(i, created)` in window `w`
    reaching the sink at wall time `now`.

    latency = now - created (creation to this sink); after_window_end = now - the end of
    the element's window (for an element out of a windowed GroupByKey: how long after its
    pane could first be complete it arrived; = latency in the global window).
    """
    _, created = element
    end = w.end.micros / 1e6 if isinstance(w, window.IntervalWindow) else None
    return sample_line(now, created, end, created if end is None else end)


def sample_line(now: float, created: float, end: float | None, since: float) -> str:
    """`latency TAB after_window_end TAB created TAB window_end` at wall time `now`:
    latency from `created`, after_window_end from `since` (seconds)."""
    return (f'{now - created:.6f}\t{now - since:.6f}\t{created:.6f}\t'
            + ('' if end is None else f'{end:.6f}'))


def sample_lines(element: tuple[int, float], w, timestamp=None) -> list[str]:
    """The sink's lines for `(i, created)`: its `latency_line` now if i is a multiple of
    `SAMPLE_EVERY`, else none."""
    if element[0] % SAMPLE_EVERY:
        return []
    return [latency_line(element, w, time.time())]


def index_of(element: tuple[int, float]) -> int:
    """The checksum of an element `(i, created)` at the sink: its index."""
    return element[0]


def sink(prefix: str) -> sink_check.CountingSink:
    """The micro cases' sink: counts every `(i, created)`, sums the indices and writes
    the latency samples (`sample_lines`) to files `prefix-*`."""
    return sink_check.CountingSink(prefix, lines=sample_lines, checksum=index_of)


# (latency, after window end, created, window end or None), seconds: `latency_line`.
Sample = tuple[float, float, float, float | None]


def parse_samples(lines: Sequence[str]) -> list[Sample]:
    """`latency_line` lines, parsed."""
    samples: list[Sample] = []
    for line in lines:
        latency, after_end, created, end = line.split('\t')
        samples.append((float(latency), float(after_end), float(created),
                        float(end) if end else None))
    return samples


def read_samples(directory: str) -> list[Sample]:
    """Every latency line written under `directory` (files of any name), parsed; the
    sinks' tally lines are left out."""
    return parse_samples(sink_check.read_sink(directory).lines)


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
# How often each input element reaches the sink: once per window it is in (a sliding
# window of 2 s every 1 s holds every timestamp twice).
COPIES = {'20 ParDos': 1, '1 ParDo': 1, 'GBK sliding 2s every 1s on 10 keys': 2}


def expected_tally(case: str, n: int) -> sink_check.Tally:
    """What the sink of `case` must get from `n` elements: every index 0..n-1 `COPIES`
    times (count and sum of the indices)."""
    copies = COPIES[case]
    return sink_check.Tally(copies * n, copies * (n * (n - 1) // 2))


def runner_and_args(label: str, extra_args: Sequence[str]) -> tuple[str, list[str]]:
    """The runner name and options of row label `label` (`extra_args` go to any runner
    that is not one of the `DIRECT_RUNNERS`)."""
    if label in DIRECT_RUNNERS:
        return DIRECT, list(DIRECT_RUNNERS[label])
    return label, list(extra_args)


def run_case(case: str, runner: str, n: int, bundle_size: int | None,
             extra_args: Sequence[str]) -> dict:
    """One batch run of `case` over `n` elements on runner label `runner` (see
    `runner_and_args`); its row of the report."""
    runner_name, args = runner_and_args(runner, extra_args)
    if bundle_size is not None:
        args.append(f'--bundle_size={bundle_size}')
    out_dir = tempfile.mkdtemp(prefix='micro-')
    started = time.time()
    with beam.Pipeline(runner=runner_name, options=PipelineOptions(args)) as p:
        _ = CASES[case](batch_source(p, n)) | 'Sink' >> beam.ParDo(
            sink(os.path.join(out_dir, 'sink')))
    wall = time.time() - started
    written = sink_check.read_sink(out_dir)
    output_ok = sink_check.verdict(expected_tally(case, n), written.tally)
    latencies = sorted(s[0] for s in parse_samples(written.lines))
    return {
        'case': case, 'runner': runner, 'bundle_size': bundle_size or '', 'elements': n,
        'output_ok': output_ok, 'wall_s': round(wall, 2),
        'elements_per_s': sink_check.throughput(output_ok, n, wall),
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


def markdown_columns(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> list[str]:
    """The lines of a Markdown table of `rows` with `columns` (key, title); an empty or
    missing value shows as '-'."""
    def cell(value) -> str:
        return '-' if value in ('', None) else str(value).replace('|', '\\|')
    return (['| ' + ' | '.join(title for _, title in columns) + ' |',
             '|' + '---|' * len(columns)]
            + ['| ' + ' | '.join(cell(row.get(key)) for key, _ in columns) + ' |'
               for row in rows])


def pyplot():
    """matplotlib's pyplot on the Agg (file-only) backend."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def write_report(rows: list[dict], out: str) -> None:
    write_table(rows, out, 'micro', 'Micro benchmarks', '\n![throughput](micro.png)\n',
                before='`output_ok`: whether the sink got every element exactly as often '
                       'as its windows imply (count and sum of indices); throughput only '
                       'for runs where it did.\n\n')
    plt = pyplot()
    labels = [f"{r['case']}\n{r['runner']}\nbundle {r['bundle_size'] or '-'}"
              + ('' if sink_check.is_ok(r['output_ok']) else '\nOUTPUT FAILED') for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 5))
    # A failed run has no throughput: no bar.
    ax.bar(range(len(rows)), [r['elements_per_s'] if r['elements_per_s'] != '' else math.nan
                              for r in rows])
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=7)
    ax.set_yscale('log')
    ax.set_ylabel('elements/s (wall time)')
    ax.set_title('Micro benchmarks')
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'micro.png'), dpi=120)
    plt.close(fig)


def plan_runs(cases: Sequence[str], runners: Sequence[str],
              bundle_sizes: Sequence[int]) -> list[tuple[str, str, int | None]]:
    """(case, runner label, bundle size or None) of every run, in order: the bundle sizes
    on StreamsSparkRunner, one run on any other runner label (`runner_labels`)."""
    return [(case, runner, size) for case in cases for runner in runners
            for size in (bundle_sizes if runner == SPARK else [None])]


def main(argv: list[str] | None = None) -> list[dict]:
    """The command line (see the module docstring); returns the report's rows."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--elements', type=int, default=100_000)
    parser.add_argument('--runners', default=f'{SPARK},{DIRECT}',
                        help=f'{DIRECT} runs as both {list(DIRECT_RUNNERS)}')
    parser.add_argument('--bundle_sizes', default='10,100,1000')
    parser.add_argument('--cases', default=','.join(CASES))
    parser.add_argument('--out', default='bench-out')
    known, extra = parser.parse_known_args(argv)
    if '--streaming' in extra:
        # It would reach the runner's options and run the batch source in streaming
        # mode: the streaming sweep is its own command.
        parser.error('--streaming is not an option of benchmarks.micro: run the streaming '
                     'sweep with `python -m benchmarks.sweep` (same options, no --streaming)')
    runners = runner_labels(known.runners)
    plan = plan_runs(known.cases.split(','), runners,
                     [int(s) for s in known.bundle_sizes.split(',')])
    if SPARK in runners:
        # Steady state: Spark's start-up is not part of any case's time.
        run_case('1 ParDo', SPARK, 10, None, extra)
    rows = []
    for index, (case, runner, size) in enumerate(plan, 1):
        print(f'[{index}/{len(plan)}] {case} on {runner}, bundle size {size or "-"} ...',
              end=' ', flush=True)
        row = run_case(case, runner, known.elements, size, extra if runner == SPARK else [])
        print(f"{row['wall_s']} s, {row['elements_per_s']} elements/s, output "
              f"{row['output_ok']}", flush=True)
        rows.append(row)
    write_report(rows, known.out)
    print(open(os.path.join(known.out, 'micro.md')).read())
    return rows


if __name__ == '__main__':
    main(sys.argv[1:])
