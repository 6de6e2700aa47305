"""The golden-run fault matrix: pipelines x sinks x faults x stores x seeds, every run's
output compared with its golden output (nothing lost, nothing duplicated).

    python -m benchmarks.faults [--pipelines=combine,stateful] [--sinks=text,files,redis]
        [--faults=F1,F2,F3,F4,F5,F6] [--seeds=3] [--only=TEXT[|TEXT...]] [--out DIR]

Design section 12 (the consistent-regions paper's golden-run fault tests). The
pipelines, sinks, faults and golden outputs are those of the fault tests
(`tests/faults/harness.py`, whose CI subset runs in the README's test command); this
command runs the whole matrix. Every run is a program of its own (`harness.py
SPEC_FILE flags`: its own driver, JVM and Python workers, `--spark_master=local[2,4]`
so that Spark retries a failed task as on a cluster), in a fresh job whose checkpoint
store is a directory of its own or a database of one `redis-server` this command
starts (and always stops).

Faults (each cell names its place, element and seed):

* F1: the Python worker running the task at the place SIGKILLs itself, once.
* F2: a DoFn raises at the place in every attempt of its task (4): the epoch fails,
  the region resets and replays.
* F3: a DoFn SIGKILLs the driver at the place; the same command runs again and
  resumes.
* F4: the driver SIGKILLs itself the n-th time it reaches a point of the protocol
  (after an epoch's deltas, before and after a commit record, in a non-blocking
  write, in the middle of a reset); the same command runs again.
* F5: F2 at one of the very first elements, before the first checkpoint: the reset
  goes back to the initial state.
* F6: the fault of F2 through k whole epochs: k = 3 resets recover, k = 6 exceed
  `--max_consecutive_reset_attempts=5` and the run must fail with the region error
  having published golden results only, each once.

A cell passes when its output equals the golden output (F6 with k = 6: when the run
failed with the region error and what it published is golden, each once). The seed
picks the element (or the protocol point's occurrence), the store and the checkpoint
mode, so two seeds of a cell are two different runs.

Report in `--out` (default `benchmarks/results/<date>-faults/`): `report.md` (the date,
command, versions, the summary: runs, passed, results lost and duplicated over all
runs, a table per fault family, then every cell with its pipeline, fault, place, store,
mode, sink, seed, outcome, results lost / duplicated / wrong, leftovers and wall time),
`cells.json`, `faults.png` (passed and failed cells per fault and sink) and the logs of
every failed run. The command exits 1 when any cell failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import shlex
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence

from benchmarks import micro
from benchmarks.nexmark import report
from tests.faults import harness

PIPELINES = ('combine', 'stateful')
SINKS = ('text', 'files', 'redis')
FAULTS = ('F1', 'F2', 'F3', 'F4', 'F5', 'F6')
ATTEMPTS = 4  # local[2,4]
MAX_RESETS = 5
PROTOCOL_POINTS = ('after_epoch_deltas', 'before_commit_record', 'after_commit_record',
                   'during_non_blocking_write', 'during_reset')
STORE_DB, SINK_DB = 2, 3
KILLED = -signal.SIGKILL


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the matrix."""

    pipeline: str
    sink: str
    fault: str  # F1..F6
    place: str  # where the fault hits: source/keyed/published, a protocol point, k=...
    at: int  # the element (F1-F3, F5, F6) or the point's occurrence (F4)
    store: str  # 'file' | 'redis'
    mode: str  # 'blocking' | 'non_blocking'
    seed: int

    @property
    def name(self) -> str:
        return (f'{self.fault} {self.pipeline}/{self.sink} {self.place}@{self.at} '
                f'{self.store}/{self.mode} seed {self.seed}')


@dataclasses.dataclass
class Outcome:
    cell: Cell
    passed: bool
    outcome: str  # exact, failed as expected, or what went wrong
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    leftovers: int = 0
    wall_s: float = 0.0
    runs: int = 1
    log: str = ''


def places(sink: str) -> tuple[str, ...]:
    """Where a DoFn fault can hit: before the shuffle, after the aggregate, and (file
    sinks) on what the sink outputs once it published a window."""
    return ('source', 'keyed') if sink == 'redis' else ('source', 'keyed', 'published')


def cells(pipelines: Sequence[str], sinks: Sequence[str], faults: Sequence[str],
          seeds: int) -> Iterator[Cell]:
    """Every cell of the matrix, in a fixed order (the seed fixes the random choices)."""
    for seed in range(seeds):
        for pipeline in pipelines:
            for sink in sinks:
                for fault in faults:
                    rng = random.Random(f'{seed}/{pipeline}/{sink}/{fault}')
                    yield from _family(fault, pipeline, sink, seed, rng)


def _family(fault: str, pipeline: str, sink: str, seed: int,
            rng: random.Random) -> Iterator[Cell]:
    def cell(place: str, at: int, mode: str | None = None) -> Cell:
        return Cell(pipeline, sink, fault, place, at, rng.choice(('file', 'redis')),
                    mode or rng.choice(('blocking', 'non_blocking')), seed)

    # Elements of the second to fifth window: a cut or two before the fault.
    if fault in ('F1', 'F2', 'F3'):
        for place in places(sink):
            yield cell(place, rng.randrange(150, 450))
    elif fault == 'F4':
        for point in PROTOCOL_POINTS:
            mode = 'non_blocking' if point == 'during_non_blocking_write' else None
            yield cell(point, 3 if point == 'during_reset' else rng.randrange(2, 5), mode)
    elif fault == 'F5':
        yield cell('source', rng.randrange(0, 20))
    elif fault == 'F6':
        for resets in (3, MAX_RESETS + 1):
            yield cell(f'k={resets}', rng.randrange(150, 450))
    else:
        raise ValueError(f'unknown fault family {fault!r}; use {", ".join(FAULTS)}')


class Matrix:
    """Runs cells, each in a fresh job, against one redis-server (see the docstring)."""

    def __init__(self, work: str, redis_server) -> None:
        self.work = work
        self.redis = redis_server
        self.sink_client = redis_server.client(db=SINK_DB)

    def run(self, cell: Cell) -> Outcome:
        run_id = uuid.uuid4().hex[:8]
        folder = os.path.join(self.work, run_id)
        os.makedirs(folder)
        spec, flags, kill_at = self._setup(cell, folder, run_id)
        spec_file = harness.write_spec(spec, os.path.join(folder, 'spec.json'))
        started = time.monotonic()
        runs = [harness.run_subprocess(spec_file, flags, kill_at=kill_at)]
        if cell.fault in ('F3', 'F4') and runs[0].returncode == KILLED:
            runs.append(harness.run_subprocess(spec_file, flags))
        wall = time.monotonic() - started
        spec = harness.read_spec(spec_file)  # its start, set by the first run
        log = '\n'.join(f'--- run {n + 1}: exit {r.returncode}\n{r.stderr}'
                        for n, r in enumerate(runs))
        result = self._judge(cell, spec, runs, log)
        result.wall_s, result.runs, result.log = round(wall, 1), len(runs), log
        return result

    def _setup(self, cell: Cell, folder: str, run_id: str):
        if cell.sink == 'redis':
            out = self.redis.url_of(SINK_DB)
        else:
            out = os.path.join(folder, 'out', 'out')
        store = (self.redis.url_of(STORE_DB) if cell.store == 'redis'
                 else os.path.join(folder, 'store'))
        marker = os.path.join(folder, 'fault')
        kill_at = None
        if cell.fault == 'F4':
            kill_at = f'{cell.place}:{cell.at}'
            fault = (harness.Fault('raise', marker, 350, 'source', ATTEMPTS)
                     if cell.place == 'during_reset' else None)
        elif cell.fault in ('F1', 'F2', 'F3', 'F5'):
            kind = {'F1': 'kill_worker', 'F3': 'kill_driver'}.get(cell.fault, 'raise')
            times = ATTEMPTS if kind == 'raise' else 1
            fault = harness.Fault(kind, marker, cell.at, cell.place, times)
        else:  # F6
            resets = int(cell.place.partition('=')[2])
            fault = harness.Fault('raise', marker, cell.at, 'source', resets * ATTEMPTS)
        spec = harness.Spec(cell.pipeline, cell.sink, out, 0, key_prefix=f'{run_id}:',
                            fault=fault)
        flags = harness.runner_flags(
            f'matrix-{run_id}', store, mode=cell.mode,
            extra=[f'--max_consecutive_reset_attempts={MAX_RESETS}'])
        return spec, flags, kill_at

    def _judge(self, cell: Cell, spec, runs, log: str) -> Outcome:
        comparison = harness.compare(spec, self.sink_client)
        counts = dict(lost=comparison.lost, duplicated=comparison.duplicated,
                      wrong=comparison.wrong, leftovers=comparison.leftovers)
        last = runs[-1]
        must_fail = cell.fault == 'F6' and cell.place == f'k={MAX_RESETS + 1}'
        if must_fail:
            if last.returncode == 0:
                return Outcome(cell, False, 'ran to the end past the reset limit', **counts)
            if 'RegionResetError' not in last.stderr and 'failed 6 times' not in last.stderr:
                return Outcome(cell, False, f'failed without the region error (exit '
                               f'{last.returncode})', **counts)
            # Failed as it must: what it published must be golden, each once.
            if comparison.duplicated or comparison.wrong:
                return Outcome(cell, False, 'published twice or wrong before failing',
                               **counts)
            return Outcome(cell, True, 'failed as expected', **dict(counts, lost=0))
        if cell.fault in ('F3', 'F4') and runs[0].returncode != KILLED:
            return Outcome(cell, False, f'the driver was not killed (exit '
                           f'{runs[0].returncode})', **counts)
        if last.returncode != 0:
            return Outcome(cell, False, f'run failed (exit {last.returncode})', **counts)
        if cell.fault in ('F1', 'F2', 'F3', 'F5', 'F6') and spec.fault.done() == 0:
            return Outcome(cell, False, 'the fault never fired', **counts)
        if not comparison.exact:
            return Outcome(cell, False, '; '.join(comparison.problems)[:300], **counts)
        return Outcome(cell, True, 'exact', **counts)


# ---------------------------------------------------------------- report

SUMMARY_COLUMNS = (('fault', 'fault'), ('runs', 'runs'), ('passed', 'passed'),
                   ('lost', 'results lost'), ('duplicated', 'duplicated'), ('wall_s', 'wall s'))
CELL_COLUMNS = (('fault', 'fault'), ('pipeline', 'pipeline'), ('sink', 'sink'),
                ('place', 'place'), ('at', 'at'), ('store', 'store'), ('mode', 'mode'),
                ('seed', 'seed'), ('outcome', 'outcome'), ('lost', 'lost'),
                ('duplicated', 'duplicated'), ('wrong', 'wrong'),
                ('leftovers', 'leftovers'), ('wall_s', 'wall s'), ('runs', 'runs'))


def row_of(result: Outcome) -> dict:
    row = dataclasses.asdict(result.cell)
    row.update({k: v for k, v in dataclasses.asdict(result).items()
                if k not in ('cell', 'log')})
    return row


def summary_rows(results: Sequence[Outcome]) -> list[dict]:
    """One row per fault family and one for the whole matrix."""
    rows = []
    for fault in [*FAULTS, 'all']:
        mine = [r for r in results if fault in ('all', r.cell.fault)]
        if mine:
            rows.append({'fault': fault, 'runs': len(mine),
                         'passed': sum(r.passed for r in mine),
                         'lost': sum(r.lost for r in mine),
                         'duplicated': sum(r.duplicated for r in mine),
                         'wall_s': round(sum(r.wall_s for r in mine), 1)})
    return rows


def write_report(out: str, results: Sequence[Outcome], meta: dict) -> None:
    os.makedirs(os.path.join(out, 'logs'), exist_ok=True)
    for result in results:
        if not result.passed:
            name = result.cell.name.replace(' ', '_').replace('/', '-')
            with open(os.path.join(out, 'logs', f'{name}.log'), 'w') as f:
                f.write(result.log)
    rows = [row_of(r) for r in results]
    with open(os.path.join(out, 'cells.json'), 'w') as f:
        json.dump({'meta': meta, 'cells': rows}, f, indent=1)
    summary = summary_rows(results)
    text = ['# Golden-run fault matrix', '', f"* started: {meta['date']}",
            *(f'* {k}: {v}' for k, v in meta['versions'].items()), '', 'Command:', '',
            '```', meta['command'], '```', '',
            *micro.markdown_columns(summary, SUMMARY_COLUMNS), '',
            '![cells per fault and sink](faults.png)', '',
            'A cell passes when its sink holds exactly the golden output (one line or '
            'Redis key per window and key, computed from the input\'s definition), with '
            'no file left behind; an F6 cell past the reset limit passes when the run '
            'failed with the region error and published golden results only, each once. '
            'Lost, duplicated and wrong count results (lines or keys); the logs of every '
            'failed cell are in logs/.', '', '## Every cell', '',
            *micro.markdown_columns(rows, CELL_COLUMNS), '']
    with open(os.path.join(out, 'report.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(text))
    plot(results, os.path.join(out, 'faults.png'))


def plot(results: Sequence[Outcome], path: str) -> None:
    """Stacked bars of passed and failed cells, a group per fault, a bar per sink."""
    plt = micro.pyplot()
    faults = [f for f in FAULTS if any(r.cell.fault == f for r in results)]
    sinks = [s for s in SINKS if any(r.cell.sink == s for r in results)]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(faults) + 2), 4.5))
    width = 0.8 / max(1, len(sinks))
    for i, sink in enumerate(sinks):
        xs = [j + (i - (len(sinks) - 1) / 2) * width for j in range(len(faults))]
        passed = [sum(r.passed for r in results if (r.cell.fault, r.cell.sink) == (f, sink))
                  for f in faults]
        failed = [sum(not r.passed for r in results
                      if (r.cell.fault, r.cell.sink) == (f, sink)) for f in faults]
        ax.bar(xs, passed, width, label=f'{sink}: passed')
        ax.bar(xs, failed, width, bottom=passed, color='tab:red',
               label='failed' if i == 0 else None)
    ax.set_xticks(range(len(faults)), faults)
    ax.set_ylabel('cells')
    ax.set_title('Fault matrix: cells per fault and sink')
    ax.legend(fontsize=8)
    ax.grid(axis='y', alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- CLI


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--pipelines', default=','.join(PIPELINES))
    parser.add_argument('--sinks', default=','.join(SINKS))
    parser.add_argument('--faults', default=','.join(FAULTS))
    parser.add_argument('--seeds', type=int, default=3)
    parser.add_argument('--only', default=None,
                        help="run only the cells whose name contains one of these texts "
                             "(separated by '|'), e.g. 'F3 combine/text'")
    parser.add_argument('--out', default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    chosen = [c for c in cells(args.pipelines.split(','), args.sinks.split(','),
                               args.faults.split(','), args.seeds)
              if args.only is None or any(text in c.name for text in args.only.split('|'))]
    if not chosen:
        print('no cell matches', file=sys.stderr)
        return 2
    date = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or os.path.join('benchmarks', 'results', f'{date:%Y-%m-%d}-faults')
    from beam_streams_runner.stores.redis_server import RedisServer
    results: list[Outcome] = []
    print(f'{len(chosen)} cells', flush=True)
    with tempfile.TemporaryDirectory(prefix='fault-matrix-') as work, \
            RedisServer() as server:
        matrix = Matrix(work, server)
        for n, cell in enumerate(chosen, 1):
            result = matrix.run(cell)
            results.append(result)
            passed = sum(r.passed for r in results)
            print(f'[{n}/{len(chosen)}] {cell.name}: {result.outcome[:120]} '
                  f'({result.wall_s} s; {passed} passed so far)', flush=True)
    meta = {'date': f'{date:%Y-%m-%d %H:%M} UTC',
            'command': 'python -m benchmarks.faults ' + shlex.join(sys.argv[1:]),
            'versions': report.environment()}
    write_report(out, results, meta)
    failed = [r for r in results if not r.passed]
    print(f'{len(results)} cells, {len(results) - len(failed)} passed, '
          f'{sum(r.lost for r in results)} results lost, '
          f'{sum(r.duplicated for r in results)} duplicated; report: '
          f'{os.path.join(out, "report.md")}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
