"""The comparison's report: tables (Markdown and CSV), the goals' verdicts and two plots.

`report.md` holds, in this order: the machine, versions and command; the batch table
(events/s per query and system, and this runner's ratio to each); the streaming table
(events/s per query and system without and with fault tolerance, and what it costs:
with / without); latency p50/p99 at a fixed rate; peak memory per system; the goals,
each with its verdict. A figure counts only when its run's output equals the
reference (a failed or empty run shows as `failed` and enters no ratio).
`throughput.png`: grouped bars (log scale) per query, batch and streaming panels;
`latency.png`: p50 bars with p99 markers per query and system.

    python -m benchmarks.compare.report DIR

writes a report again from its CSVs (the measurements as they were, the tables, goals
and plots as this version of the report makes them; its header and notes kept).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
import typing
from collections.abc import Sequence

from benchmarks.compare.batch import BatchRow
from benchmarks.compare.stream_runs import StreamRow
from benchmarks.compare.systems import (
    JVM_NATIVE,
    OURS,
    PYTHON_PEERS,
    SYSTEMS,
    StreamingSystem,
    short_name,
)
from benchmarks.nexmark.report import Row

BATCH_ORDER = ('StreamsSparkRunner', 'DirectRunner', 'DirectRunner (2 processes)',
               'SparkNative', 'FlinkNative')


def _eps(value: float | None) -> str:
    return f'{value:,.0f}' if value else 'failed'


def _ratio(a: float | None, b: float | None) -> str:
    return f'{a / b:.2f}' if a and b else '-'


def batch_table(rows: Sequence[BatchRow]) -> list[str]:
    """Events/s per query (rows) and system (columns), then ours / each."""
    queries = sorted({r.row.query for r in rows})
    eps = {(r.row.query, r.row.runner): (r.row.events_per_s if r.row.equal.startswith(
        ('yes', 'reference')) else None) for r in rows}
    systems = [s for s in BATCH_ORDER if any((q, s) in eps for q in queries)]
    head = ['query', *systems, *(f'ours / {s}' for s in systems[1:])]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for q in queries:
        cells = [f'Q{q}'] + [_eps(eps.get((q, s))) if (q, s) in eps else '-' for s in systems]
        ours = eps.get((q, systems[0]))
        cells += [_ratio(ours, eps.get((q, s))) for s in systems[1:]]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return lines


def _stream_eps(rows: Sequence[StreamRow]) -> dict[tuple[int, str, bool], float | None]:
    return {(r.query, r.system, r.checkpoints): (r.events_per_s if r.ok else None)
            for r in rows if r.rate is None}


def streaming_table(rows: Sequence[StreamRow]) -> list[str]:
    """Per query and system: events/s without and with fault tolerance, and with / without."""
    eps = _stream_eps(rows)
    head = ['query', 'system', 'events/s, no checkpoints', 'events/s, checkpoints',
            'with / without', 'ours (checkpoints) / this (checkpoints)']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for q in sorted({k[0] for k in eps}):
        ours = eps.get((q, OURS.name, True))
        for system in SYSTEMS:
            if (q, system.name, False) not in eps and (q, system.name, True) not in eps:
                continue
            off, on = eps.get((q, system.name, False)), eps.get((q, system.name, True))
            lines.append(f'| Q{q} | {system.name} | {_eps(off)} | {_eps(on)} | '
                         f'{_ratio(on, off)} | '
                         f'{"-" if system is OURS else _ratio(ours, on)} |')
    return lines


def latency_table(rows: Sequence[StreamRow]) -> list[str]:
    head = ['query', 'system', 'rate events/s', 'p50 s', 'p99 s', 'outputs', 'equal']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in sorted((r for r in rows if r.rate), key=lambda r: (r.query, r.system)):
        p50 = f'{r.latency_p50_s:.2f}' if r.ok and r.latency_p50_s is not None else '-'
        p99 = f'{r.latency_p99_s:.2f}' if r.ok and r.latency_p99_s is not None else '-'
        lines.append(f'| Q{r.query} | {r.system} | {r.rate:,.0f} | {p50} | {p99} | '
                     f'{r.outputs} | {r.equal} |')
    return lines


def memory_table(batch: Sequence[BatchRow], streaming: Sequence[StreamRow]) -> list[str]:
    """The largest peak of each system's runs, batch and streaming."""
    peaks: dict[tuple[str, str], float] = {}
    for b in batch:
        if b.peak_mb:
            key = ('batch', b.row.runner)
            peaks[key] = max(peaks.get(key, 0.0), b.peak_mb)
    for r in streaming:
        if r.peak_mb:
            key = ('streaming', r.system)
            peaks[key] = max(peaks.get(key, 0.0), r.peak_mb)
    lines = ['| mode | system | peak memory MB (largest run) |', '|---|---|---|']
    lines += [f'| {mode} | {system} | {mb:,.0f} |'
              for (mode, system), mb in sorted(peaks.items())]
    return lines


def goals(rows: Sequence[StreamRow]) -> list[str]:
    """The comparison's goals, query by query, with fault tolerance on everywhere: against
    the Python APIs (PyFlink's DataStream; Spark's state API on the stateful queries)
    each with its verdict, met when this runner is at least as fast; against the
    JVM-native engines (Spark's DataFrame API, Flink SQL), which is faster and by how
    much."""
    eps = _stream_eps(rows)
    out = []
    for peer in PYTHON_PEERS:
        for q, ours, theirs in _measured_pairs(eps, peer):
            head = (f'* Q{q}: this runner with consistent regions {_eps(ours)} events/s, '
                    f'{peer.name} with checkpoints {_eps(theirs)}')
            if not ours or not theirs:
                out.append(f'{head}: not measured (a run failed)')
            else:
                out.append(f'{head}: {ours / theirs:.2f}x, '
                           f'{"met" if ours >= theirs else "not met"}')
    out += ['', 'Against the JVM-native engines (checkpoints on):', '']
    for peer in JVM_NATIVE:
        for q, ours, theirs in _measured_pairs(eps, peer):
            if not ours or not theirs:
                out.append(f'* Q{q}, {peer.name}: not measured (a run failed)')
            elif theirs > ours:
                out.append(f'* Q{q}: {peer.name} is faster, {theirs / ours:.2f}x this '
                           f'runner ({_eps(theirs)} against {_eps(ours)} events/s)')
            else:
                out.append(f'* Q{q}: this runner is faster, {ours / theirs:.2f}x '
                           f'{peer.name} ({_eps(ours)} against {_eps(theirs)} events/s)')
    return out


def _measured_pairs(eps: dict[tuple[int, str, bool], float | None], peer: StreamingSystem
                    ) -> list[tuple[int, float | None, float | None]]:
    """(query, ours, the peer's) events/s with checkpoints, where both were run."""
    return [(q, eps[q, OURS.name, True], eps[q, peer.name, True]) for q in peer.queries
            if (q, OURS.name, True) in eps and (q, peer.name, True) in eps]


def write_csv(path: str, rows: Sequence[object]) -> None:
    if not rows:
        return
    records = [dataclasses.asdict(r) for r in rows]
    flat = [{**rec.pop('row'), **rec} if 'row' in rec else rec for rec in records]
    with open(path, 'w', newline='', encoding='utf-8') as f:
        writer = csv.DictWriter(f, fieldnames=list(flat[0]))
        writer.writeheader()
        writer.writerows(flat)


def plot_throughput(path: str, batch: Sequence[BatchRow], streaming: Sequence[StreamRow]
                    ) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    batch_eps = {(b.row.query, b.row.runner): b.row.events_per_s for b in batch
                 if b.row.equal.startswith(('yes', 'reference')) and b.row.events_per_s}
    _bars(left, batch_eps, [s for s in BATCH_ORDER if any(k[1] == s for k in batch_eps)],
          'batch (generated events)')
    stream_eps: dict[tuple[int, str], float] = {}
    for r in streaming:
        if r.rate is None and r.ok and r.events_per_s:
            name = f'{short_name(_system(r.system))}{" +ckpt" if r.checkpoints else ""}'
            stream_eps[(r.query, name)] = r.events_per_s
    names = [f'{short_name(s)}{suffix}' for s in SYSTEMS for suffix in ('', ' +ckpt')
             if any(k[1] == f'{short_name(s)}{suffix}' for k in stream_eps)]
    _bars(right, stream_eps, names, 'streaming (events from files, as fast as possible)')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _system(name: str):
    return next(s for s in SYSTEMS if s.name == name)


def _bars(ax, values: dict[tuple[int, str], float], names: Sequence[str], title: str) -> None:
    queries = sorted({q for q, _ in values})
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [qi + i * width for qi, q in enumerate(queries) if (q, name) in values]
        ys = [values[(q, name)] for q in queries if (q, name) in values]
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks([qi + 0.4 - width / 2 for qi in range(len(queries))])
    ax.set_xticklabels([f'Q{q}' for q in queries])
    ax.set_yscale('log')
    ax.set_ylabel('events/s (log scale)')
    ax.set_title(title)
    ax.legend(fontsize=7)


def plot_latency(path: str, streaming: Sequence[StreamRow]) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    rows = [r for r in streaming if r.rate and r.ok and r.latency_p50_s is not None]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 5))
    queries = sorted({r.query for r in rows})
    names = [s.name for s in SYSTEMS if any(r.system == s.name for r in rows)]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        mine = {r.query: r for r in rows if r.system == name}
        xs = [qi + i * width for qi, q in enumerate(queries) if q in mine]
        ax.bar(xs, [mine[q].latency_p50_s for q in queries if q in mine], width,
               label=f'{short_name(_system(name))} p50')
        ax.scatter(xs, [mine[q].latency_p99_s for q in queries if q in mine], marker='_',
                   s=200, color='black')
    ax.set_xticks([qi + 0.4 - width / 2 for qi in range(len(queries))])
    ax.set_xticklabels([f'Q{q}' for q in queries])
    ax.set_yscale('log')
    ax.set_ylabel('latency s (bars p50, black marks p99; log scale)')
    ax.set_title(f'latency at {rows[0].rate:,.0f} events/s, checkpoints on')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir: str, header: Sequence[str], batch: Sequence[BatchRow],
                 streaming: Sequence[StreamRow], notes: Sequence[str] = ()) -> str:
    """Writes report.md, batch.csv, streaming.csv and the plots; returns report.md's text."""
    os.makedirs(out_dir, exist_ok=True)
    parts = [*header, '', '## Batch: events/s (1 worker = DirectRunner default)', '',
             *batch_table(batch), '', '## Streaming: events/s without and with fault '
             'tolerance', '', *streaming_table(streaming), '',
             '## Latency at a fixed rate (checkpoints on)', '', *latency_table(streaming), '',
             '## Peak memory (summed over the run\'s processes)', '',
             *memory_table(batch, streaming), '', '## Goals', '', *goals(streaming), '',
             '## Every streaming run', '', *_all_runs(streaming), '',
             '![throughput](throughput.png)', '', '![latency](latency.png)', '',
             '## Notes', '', *notes]
    text = '\n'.join(parts) + '\n'
    with open(os.path.join(out_dir, 'report.md'), 'w', encoding='utf-8') as f:
        f.write(text)
    write_csv(os.path.join(out_dir, 'batch.csv'), batch)
    write_csv(os.path.join(out_dir, 'streaming.csv'), streaming)
    plot_throughput(os.path.join(out_dir, 'throughput.png'), batch, streaming)
    plot_latency(os.path.join(out_dir, 'latency.png'), streaming)
    return text


def _all_runs(rows: Sequence[StreamRow]) -> list[str]:
    head = ['query', 'system', 'checkpoints', 'rate', 'events', 'wall s', 'events/s',
            'peak MB', 'outputs', 'checkpoints done', 'equal', 'note']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        lines.append('| ' + ' | '.join(str(x) for x in (
            f'Q{r.query}', r.system, 'on' if r.checkpoints else 'off',
            f'{r.rate:,.0f}' if r.rate else 'max', f'{r.events:,}', f'{r.wall_s:.1f}',
            _eps(r.events_per_s if r.ok else None), f'{r.peak_mb:,.0f}', r.outputs,
            '' if r.checkpoints_done is None else r.checkpoints_done, r.equal,
            r.note.replace('|', '/')[:200])) + ' |')
    return lines


def _from_csv(cls: type, record: dict[str, str]) -> object:
    """A dataclass instance from a CSV record (`write_csv`'s columns), by its field types."""
    values = {}
    for name, hint in typing.get_type_hints(cls).items():
        text = record.get(name)
        if text is None:
            continue
        kind = next((t for t in (bool, int, float) if t is hint or t in typing.get_args(hint)),
                    str)
        if text == '' and kind is not str:
            values[name] = None
        elif kind is bool:
            values[name] = text == 'True'
        else:
            values[name] = kind(text)
    return cls(**values)


def read_rows(out_dir: str) -> tuple[list[BatchRow], list[StreamRow]]:
    """The rows `write_report` wrote to `out_dir`'s CSVs."""
    batch: list[BatchRow] = []
    streaming: list[StreamRow] = []
    for name, rows in (('batch.csv', batch), ('streaming.csv', streaming)):
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            continue
        with open(path, newline='', encoding='utf-8') as f:
            for record in csv.DictReader(f):
                if rows is batch:
                    peak = record.get('peak_mb')
                    batch.append(BatchRow(_from_csv(Row, record), float(peak) if peak else None))
                else:
                    streaming.append(_from_csv(StreamRow, record))
    return batch, streaming


def rewrite_report(out_dir: str) -> str:
    """`write_report` again over `out_dir`'s CSVs, with its report's header and notes."""
    with open(os.path.join(out_dir, 'report.md'), encoding='utf-8') as f:
        old = f.read().split('\n')
    first = next(i for i, line in enumerate(old) if line.startswith('## '))
    notes = old[old.index('## Notes') + 2:] if '## Notes' in old else []
    batch, streaming = read_rows(out_dir)
    return write_report(out_dir, old[:first - 1] if first else [], batch, streaming,
                        [line for line in notes if line])


if __name__ == '__main__':
    if len(sys.argv) != 2 or not os.path.exists(os.path.join(sys.argv[1], 'report.md')):
        sys.exit('usage: python -m benchmarks.compare.report DIR (a report directory with '
                 'report.md and its CSVs)')
    print(rewrite_report(sys.argv[1]))
