"""The golden-run fault matrix: pipelines x sinks x faults x stores x seeds, every run's
output compared with its golden output (nothing lost, nothing duplicated).

    python -m benchmarks.faults [--pipelines=stateless,combine,...] [--sinks=files,redis,text]
        [--faults=F1,...,F12] [--seeds=1] [--only=TEXT[|TEXT...]] [--jobs=1] [--out DIR]

Design section 12 (the consistent-regions paper's golden-run fault tests). The
pipelines P1-P8 (`tests/faults/pipelines.py`), their sinks, faults and golden outputs
are those of the fault tests, whose CI subset runs in the README's test command; this
command runs the whole matrix: every pipeline with the file sink (WriteToFiles) and
the Redis sink (P2 and P4 with WriteToText too) under every fault family, about 300
runs a seed (some 2 hours on 2 cores; `--jobs=2` runs two at once). Every run is a
program of its own (`harness.py SPEC_FILE flags`: its own driver, JVM and Python
workers, `--spark_master=local[2,4]` so that Spark retries a failed task as on a
cluster), in a fresh job whose checkpoint store is a directory of its own or a
database of a `redis-server` this command starts (and always stops), or of one of
the run's own for the store's faults.

Faults (each cell names its place, element and seed):

* F1: the Python worker running the task at the place SIGKILLs itself, once (every
  place: at the source, on the aggregate's lines, after a file sink published).
* F2: a DoFn raises at the place in every attempt of the tasks of one epoch (Spark
  gives up on the task after 4): the epoch fails, the region resets and replays.
* F3: a DoFn SIGKILLs the driver at the place; the same command runs again and resumes.
* F4: the driver SIGKILLs itself the n-th time it reaches a point of the protocol
  (after an epoch's deltas, before and after a commit record, in a non-blocking
  write, in the middle of a reset); the same command runs again.
* F5: F2 at one of the very first elements, before the first checkpoint: the reset
  goes back to the initial state.
* F6: the fault of F2 through k whole epochs: k = 3 resets recover, k = 6 exceed
  `--max_consecutive_reset_attempts=5` and the run must fail with the region error
  having published golden results only, each once.
* F7: the redis-server holding the checkpoints (and a Redis sink's output) SIGKILLed
  once the first cut is consistent and started again 0, 1 or 3 s later.
* F8: that redis-server paused (SIGSTOP) for longer than `--drain_timeout_s`.
* F9: the driver killed after its third commit record, the store wiped (the
  directory deleted, FLUSHDB); the same command must fail saying the store was
  wiped, and change nothing in the output.
* F10: every task of epoch n dies before its report, after forking a zombie that
  writes the attempt's state deltas, emptied, right after the next attempt wrote
  (`fault_points.late_write`): only the next attempt's revision may be read.
* F11: the sink crashes mid-write (the Python worker SIGKILLed inside WriteToFiles'
  publishing step, or between two halves of WriteToRedis' writes).
* F12: a DoFn sleeps past `--drain_timeout_s`: the epoch is cancelled and the region
  resets.

A cell passes when its output equals the golden output (F6 with k = 6 and F9: when the
run failed with the expected error and what was published is golden, each once) and
its fault happened. The seed picks the element, the place, the protocol point's
occurrence, the store and the checkpoint mode, so two seeds of a cell are two
different runs.

Report in `--out` (default `benchmarks/results/<date>-faults/`), written after every
cell: `report.md` (the date, command, versions, the summary: runs, passed, results
lost and duplicated over all runs, a table per fault family and per pipeline, then
every cell with its pipeline, fault, place, store, mode, sink, seed, outcome, results
lost / duplicated / wrong, leftovers and wall time), `cells.json`, `faults.png` and
the logs of every failed run. A command started again with the same `--out` runs only
the cells that directory has no result for (an interrupted matrix goes on). The
command exits 1 when any cell failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import random
import shlex
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence

from benchmarks import micro
from benchmarks.fault_cells import Cell, CellRunner, Outcome
from benchmarks.nexmark import report
from tests.faults.pipelines import PIPELINES as FAULT_PIPELINES

PIPELINES = tuple(FAULT_PIPELINES)
SINKS = ('files', 'redis', 'text')
FAULTS = tuple(f'F{n}' for n in range(1, 13))
MAX_RESETS = 5
PROTOCOL_POINTS = ('after_epoch_deltas', 'before_commit_record', 'after_commit_record',
                   'during_non_blocking_write', 'during_reset')
KILLED = -signal.SIGKILL


def places(sink: str) -> tuple[str, ...]:
    """Where a DoFn fault can hit: before the shuffle, on the aggregate's lines, and
    (file sinks) on what the sink outputs once it published a window."""
    return ('source', 'keyed') if sink == 'redis' else ('source', 'keyed', 'published')


def cells(pipelines: Sequence[str], sinks: Sequence[str], faults: Sequence[str],
          seeds: int) -> Iterator[Cell]:
    """Every cell of the matrix, in a fixed order (the seed fixes the random choices;
    the protocol point and F6's k turn with the seed and the pipeline and sink)."""
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise ValueError(f'unknown fault family {unknown[0]!r}; use {", ".join(FAULTS)}')
    for seed in range(seeds):
        for pipeline in pipelines:
            for sink in sinks:
                if sink not in FAULT_PIPELINES[pipeline].sinks:
                    continue
                # By the whole matrix's order: a cell is the same whichever are chosen.
                turn = seed + 3 * PIPELINES.index(pipeline) + SINKS.index(sink)
                for fault in faults:
                    rng = random.Random(f'{seed}/{pipeline}/{sink}/{fault}')
                    yield from _family(fault, pipeline, sink, seed, rng, turn)


def _family(fault: str, pipeline: str, sink: str, seed: int, rng: random.Random,
            turn: int) -> Iterator[Cell]:
    def cell(place: str, at: int, mode: str | None = None, store: str | None = None) -> Cell:
        return Cell(pipeline, sink, fault, place, at, store or rng.choice(('file', 'redis')),
                    mode or rng.choice(('blocking', 'non_blocking')), seed)

    # Elements of the second to fifth window: a cut or two before the fault.
    if fault in ('F1', 'F2', 'F3'):
        for place in places(sink):
            yield cell(place, rng.randrange(150, 450))
    elif fault == 'F4':
        point = PROTOCOL_POINTS[turn % len(PROTOCOL_POINTS)]
        mode = 'non_blocking' if point == 'during_non_blocking_write' else None
        yield cell(point, 3 if point == 'during_reset' else rng.randrange(2, 5), mode)
    elif fault == 'F5':
        yield cell('source', rng.randrange(0, 20))
    elif fault == 'F6':
        yield cell(f'k={(3, MAX_RESETS + 1)[turn % 2]}', rng.randrange(150, 450))
    elif fault == 'F7':
        yield cell(f'down={rng.choice((0, 1, 3))}s', 1, store='redis')
    elif fault == 'F8':
        yield cell('paused', 1, store='redis')
    elif fault == 'F9':
        yield cell('wiped', 3)
    elif fault == 'F10':
        # An epoch every run has (a 6-s stream makes 4-9 epochs, fewer on a busy machine).
        yield cell('late_write', rng.randrange(1, 4))
    elif fault == 'F11':
        if sink != 'text':  # WriteToText's publishing step has no place to crash in
            yield cell('publish', rng.randrange(150, 450))
    else:  # F12
        yield cell(rng.choice(('source', 'keyed')), rng.randrange(150, 450))


# ---------------------------------------------------------------- report

SUMMARY_COLUMNS = (('group', ''), ('runs', 'runs'), ('passed', 'passed'),
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


def outcome_of(row: dict) -> Outcome:
    """An `Outcome` read back from its row in cells.json (its log stays in logs/)."""
    cell = Cell(**{f.name: row[f.name] for f in dataclasses.fields(Cell)})
    return Outcome(cell, **{f.name: row[f.name] for f in dataclasses.fields(Outcome)
                            if f.name not in ('cell', 'log')})


def summary_rows(results: Sequence[Outcome], key: str, groups: Sequence[str]) -> list[dict]:
    """One row per group (fault family or pipeline) and one for the whole matrix."""
    rows = []
    for group in [*groups, 'all']:
        mine = [r for r in results if group in ('all', getattr(r.cell, key))]
        if mine:
            label = (f'{FAULT_PIPELINES[group].code} {group}'
                     if key == 'pipeline' and group != 'all' else group)
            rows.append({'group': label, 'runs': len(mine),
                         'passed': sum(r.passed for r in mine),
                         'lost': sum(r.lost for r in mine),
                         'duplicated': sum(r.duplicated for r in mine),
                         'wall_s': round(sum(r.wall_s for r in mine), 1)})
    return rows


def write_report(out: str, results: Sequence[Outcome], meta: dict) -> None:
    os.makedirs(os.path.join(out, 'logs'), exist_ok=True)
    for result in results:
        if not result.passed and result.log:
            name = result.cell.name.replace(' ', '_').replace('/', '-')
            with open(os.path.join(out, 'logs', f'{name}.log'), 'w') as f:
                f.write(result.log)
    rows = [row_of(r) for r in results]
    with open(os.path.join(out, 'cells.json'), 'w') as f:
        json.dump({'meta': meta, 'cells': rows}, f, indent=1)
    by_fault = summary_rows(results, 'fault', FAULTS)
    by_pipeline = summary_rows(results, 'pipeline', PIPELINES)
    planned = meta.get('cells_planned', len(results))
    text = ['# Golden-run fault matrix', '', f"* started: {meta['date']}",
            *(f'* {k}: {v}' for k, v in meta['versions'].items()),
            f'* cells: {len(results)} run of {planned} planned', '', 'Command:', '',
            '```', meta['command'], '```', '', '## Per fault family', '',
            *micro.markdown_columns(by_fault, (('group', 'fault'), *SUMMARY_COLUMNS[1:])),
            '', '## Per pipeline', '',
            *micro.markdown_columns(by_pipeline,
                                    (('group', 'pipeline'), *SUMMARY_COLUMNS[1:])), '',
            '![cells per fault and sink](faults.png)', '',
            'A cell passes when its sinks hold exactly the golden output (a line or Redis '
            'key per result, computed from the input\'s definition; P3\'s windows by their '
            'final pane, no pane index twice or skipped), with no file left behind, and '
            'its fault happened; an F6 cell past the reset limit passes when the run '
            'failed with the region error and published golden results only, each once; '
            'an F9 cell when the run after the wipe failed saying so and changed nothing. '
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
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(faults) + 2), 4.5))
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
    parser.add_argument('--seeds', type=int, default=1)
    parser.add_argument('--only', default=None,
                        help="run only the cells whose name contains one of these texts "
                             "(separated by '|'), e.g. 'F3 combine/files'")
    parser.add_argument('--jobs', type=int, default=1,
                        help='cells run at once (each a driver, a JVM and Python workers)')
    parser.add_argument('--out', default=None)
    return parser


def done_before(out: str) -> dict[str, Outcome]:
    """The results an earlier run of the command left in `out`, by cell name."""
    path = os.path.join(out, 'cells.json')
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        outcomes = [outcome_of(row) for row in json.load(f)['cells']]
    return {o.cell.name: o for o in outcomes}


def run_cells(chosen: Sequence[Cell], earlier: dict[str, Outcome], jobs: int, out: str,
              meta: dict) -> list[Outcome]:
    """Runs the cells `earlier` has no result for, `jobs` at a time, with a progress
    line and the report written after each."""
    from beam_streams_runner.stores.redis_server import RedisServer
    results = {name: o for name, o in earlier.items() if any(c.name == name for c in chosen)}
    todo = [c for c in chosen if c.name not in results]
    order = {c.name: n for n, c in enumerate(chosen)}
    print(f'{len(chosen)} cells, {len(results)} done before, {len(todo)} to run', flush=True)
    with tempfile.TemporaryDirectory(prefix='fault-matrix-') as work, \
            RedisServer() as server:
        runner = CellRunner(work, server)
        with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            futures = [pool.submit(runner.run, cell) for cell in todo]
            for future in concurrent.futures.as_completed(futures):
                result = future.result()
                results[result.cell.name] = result
                ordered = sorted(results.values(), key=lambda r: order[r.cell.name])
                write_report(out, ordered, meta)
                passed = sum(r.passed for r in ordered)
                print(f'[{len(ordered)}/{len(chosen)}] {result.cell.name}: '
                      f'{result.outcome[:120]} ({result.wall_s} s; {passed} passed so far)',
                      flush=True)
    return sorted(results.values(), key=lambda r: order[r.cell.name])


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
    os.makedirs(out, exist_ok=True)
    meta = {'date': f'{date:%Y-%m-%d %H:%M} UTC',
            'command': 'python -m benchmarks.faults ' + shlex.join(sys.argv[1:]),
            'versions': report.environment(), 'cells_planned': len(chosen)}
    results = run_cells(chosen, done_before(out), args.jobs, out, meta)
    failed = [r for r in results if not r.passed]
    print(f'{len(results)} cells, {len(results) - len(failed)} passed, '
          f'{sum(r.lost for r in results)} results lost, '
          f'{sum(r.duplicated for r in results)} duplicated; report: '
          f'{os.path.join(out, "report.md")}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
