"""The report of the checkpoint benchmark (`benchmarks.checkpoints`): its tables, goals
and plot.

Design section 12. `summarize` makes a row per throughput configuration (medians over
its repeats; its median events/s over the median with checkpoints off of the same
state size, measured in the same invocation), `summarize_recovery` a row per recovery
configuration (median detection, reset, catch-up and total seconds), `goals` judges
the issue's goals on them (met, not met, or not measured), and `write_report` writes
`report.md` (date, command, versions, both tables, the goals, the plot, notes, every
run, the log problems), `runs.json` (every run's raw figures) and `checkpoints.png`
(throughput ratio against the period and against the state size, blocking and
non-blocking, per store; recovery bars split into detection, reset and catch-up).
A configuration with a failed run has no throughput and no ratio: its verdict names
the run; a goal that rests on it is not met.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence

from beam_streams_runner.worker.partition_cache import SNAPSHOT_EVERY
from benchmarks import checkpoints_pipeline as pipeline
from benchmarks import micro, sink_check
from benchmarks.checkpoints_logs import STEADY_FROM
from benchmarks.checkpoints_runs import OFF

PARTS = ('detection_s', 'reset_s', 'catch_up_s', 'total_s')
STORE_NAMES = {'file': 'local directory', 'redis': 'Redis', '-': '-'}
# (goal, kind, what the rows must match, threshold): a ratio to checkpoints off at least
# the threshold (the lowest of the matching rows), or a recovery at most it (the longest).
GOALS = (
    ('overhead <= 10% at a 1 s period with 10 MB of state', 'ratio',
     {'state_mb': 10, 'period_s': 1, 'mode': 'non_blocking'}, 0.90),
    ('overhead <= 3% at an 8 s period with 10 MB of state', 'ratio',
     {'state_mb': 10, 'period_s': 8, 'mode': 'non_blocking'}, 0.97),
    ('non-blocking keeps >= 94% of the throughput at 512 MB (the paper: blocking lost 40%)',
     'ratio', {'state_mb': 512, 'mode': 'non_blocking'}, 0.94),
    ('recovery <= 5 s at 10 MB', 'recovery', {'state_mb': 10}, 5.0),
    ('recovery <= 60 s at 512 MB', 'recovery', {'state_mb': 512}, 60.0),
)


def _median(values: Sequence, digits: int | None = 3) -> float | int | str:
    values = [v for v in values if v not in ('', None)]
    return round(statistics.median(values), digits) if values else ''


def _failed(runs: Sequence[dict]) -> list[str]:
    return [f"r{r['repeat']}: {r['verdict']}" for r in runs if not sink_check.is_ok(r['verdict'])]


def summarize(runs: Sequence[dict], configs: Sequence) -> list[dict]:
    """A row per throughput configuration (`checkpoints.Config`): medians over its runs
    and its median throughput's ratio to that with checkpoints off of the same state
    size; a configuration with a failed run has no throughput."""
    rows = []
    for config in configs:
        mine = [r for r in runs if r['config'] == config.name]
        failed = _failed(mine)
        rows.append({
            'config': config.name, 'state_mb': config.state_mb, 'period_s': config.period_s,
            'mode': config.mode, 'store': config.store, 'checkpoints': config.label,
            'runs': len(mine),
            'state': f'{config.state_mb:g}',
            'events_per_s': '' if failed else _median([r['events_per_s'] for r in mine], None),
            'all_events_per_s': ' / '.join(str(r['events_per_s'] or 'failed') for r in mine),
            'steady_events_per_s': '' if failed else _median(
                [r['steady_events_per_s'] for r in mine], None),
            **{key: _median([r[key] for r in mine])
               for key in ('wall_s', 'cpu_s', 'state_held_mb', 'state_written_mb',
                           'keyed_states_max', 'driver_peak_rss_mb', 'jvm_peak_rss_mb',
                           'workers_peak_rss_mb', 'workers_peak_pss_mb')},
            'checkpoints_taken': ' / '.join(str(r['checkpoints']) for r in mine),
            'epochs': ' / '.join(str(r['epochs'] or '-') for r in mine),
            'verdict': '; '.join(failed) if failed else ('yes' if mine else 'no run')})
    add_ratios(rows, runs)
    return rows


def add_ratios(rows: list[dict], runs: Sequence[dict]) -> None:
    """Each row's ratios to the row with checkpoints off of its state size (median, and
    the spread of its runs), steady too, to checkpoints off with the state in the same
    store, and to checkpoints off at the smallest state."""
    off = {r['state_mb']: r for r in rows if not r['period_s'] and r['store'] == OFF}
    in_store = {(r['state_mb'], r['store']): r for r in rows if not r['period_s']}
    smallest = off[min(off)]['events_per_s'] if off else ''

    def ratio(a, b) -> float | str:
        return round(a / b, 3) if a not in ('', None) and b not in ('', None, 0) else ''

    for row in rows:
        base = off.get(row['state_mb'], {})
        mine = [ratio(r['events_per_s'], base.get('events_per_s')) for r in runs
                if r['config'] == row['config']]
        mine = [m for m in mine if m != '']
        row['ratio_to_off'] = ratio(row['events_per_s'], base.get('events_per_s'))
        row['ratio_min'] = min(mine) if mine and row['ratio_to_off'] != '' else ''
        row['ratio_max'] = max(mine) if mine and row['ratio_to_off'] != '' else ''
        row['steady_ratio_to_off'] = ratio(row['steady_events_per_s'],
                                           base.get('steady_events_per_s'))
        row['ratio_to_smallest_state_off'] = ratio(row['events_per_s'], smallest)
        same = in_store.get((row['state_mb'], row['store'] if row['store'] == 'redis' else OFF))
        row['ratio_to_store_off'] = (ratio(row['events_per_s'], same['events_per_s'])
                                     if row['period_s'] and same else '')


def summarize_recovery(runs: Sequence[dict], recoveries: Sequence) -> list[dict]:
    """A row per recovery configuration: median detection, reset, catch-up and total s
    over its runs (none if a run failed), and what the recoveries replayed."""
    rows = []
    for config in recoveries:
        mine = [r for r in runs if r['config'] == config.name]
        failed = _failed(mine)
        figures = [r['recovery_figures'] or {} for r in mine]
        row = {'config': config.name, 'state_mb': config.state_mb,
               'state': f'{config.state_mb:g}', 'store': config.store,
               'period_s': config.period_s, 'mode': config.mode, 'runs': len(mine)}
        for key in (*PARTS, 'first_epoch_after_reset_s', 'replayed_events'):
            row[key] = '' if failed else _median([f.get(key) for f in figures])
        row['totals'] = ' / '.join(str(f.get('total_s', '-')) for f in figures)
        row['reset_to'] = ' / '.join(str(f.get('reset_to_checkpoint', '-')) for f in figures)
        row['state_held_mb'] = _median([r['state_held_mb'] for r in mine])
        row['workers_peak_rss_mb'] = _median([r['workers_peak_rss_mb'] for r in mine])
        row['verdict'] = '; '.join(failed) if failed else ('yes' if mine else 'no run')
        rows.append(row)
    return rows


def _matching(rows: Sequence[dict], match: dict) -> list[dict]:
    return [r for r in rows if r['period_s'] and all(r[k] == v for k, v in match.items())]


def _where(row: dict, match: dict) -> str:
    parts = [STORE_NAMES[row['store']]]
    if 'period_s' not in match:
        parts.append(f"every {row['period_s']:g} s")
    return ', '.join(parts)


def _in_store(row: dict, kind: str) -> str:
    """A Redis row's ratio to off with the state in Redis too, beside the goal's figure."""
    if kind != 'ratio' or row['store'] != 'redis' or row.get('ratio_to_store_off') in ('', None):
        return ''
    return f"; {row['ratio_to_store_off']} against off with the state in Redis"


def goals(rows: Sequence[dict], recovery_rows: Sequence[dict]) -> list[dict]:
    """Each goal of `GOALS`: the measured figure of every matching row (a ratio goal at
    non-blocking also names blocking's), and `met` (the worst matching row meets it),
    `not met` (or a matching run failed) or `not measured`."""
    judged = []
    for goal, kind, match, threshold in GOALS:
        key, unit = ('ratio_to_off', '') if kind == 'ratio' else ('total_s', ' s')
        matching = _matching(rows if kind == 'ratio' else recovery_rows, match)
        if not matching:
            judged.append({'goal': goal, 'measured': '-', 'verdict': 'not measured'})
            continue
        figures = [row[key] for row in matching]
        measured = '; '.join(f"{row[key]}{unit} ({_where(row, match)}{_in_store(row, kind)})"
                             if row[key] != '' else f'failed ({_where(row, match)})'
                             for row in matching)
        if kind == 'ratio' and match.get('mode') == 'non_blocking':
            blocking = _matching(rows, {**match, 'mode': 'blocking'})
            measured += ''.join(f"; blocking: {r[key] or 'failed'} ({_where(r, match)})"
                                for r in blocking)
        if '' in figures:
            met = False
        elif kind == 'ratio':
            met = min(figures) >= threshold
        else:
            met = max(figures) <= threshold
        judged.append({'goal': goal, 'measured': measured,
                       'verdict': 'met' if met else 'not met'})
    return judged


TABLE = (('state', 'state MB asked'), ('state_held_mb', 'state MB held'),
         ('checkpoints', 'checkpoints'), ('mode', 'mode'), ('store', 'store'),
         ('events_per_s', 'median events/s'), ('ratio_to_off', 'ratio to off'),
         ('ratio_min', 'lowest'), ('ratio_max', 'highest'),
         ('ratio_to_store_off', 'ratio to off, state in the same store'),
         ('steady_ratio_to_off', 'steady ratio to off'),
         ('ratio_to_smallest_state_off', 'ratio to the smallest state, off'),
         ('checkpoints_taken', 'checkpoints taken'),
         ('state_written_mb', 'state MB the deltas wrote'),
         ('workers_peak_rss_mb', 'workers peak RSS MB'), ('verdict', 'verdict'))
RECOVERY_TABLE = (('state', 'state MB asked'), ('state_held_mb', 'state MB held'),
                  ('store', 'store'), ('detection_s', 'detection s'), ('reset_s', 'reset s'),
                  ('catch_up_s', 'catch-up s'), ('total_s', 'total s'),
                  ('totals', 'total s of each run'),
                  ('first_epoch_after_reset_s', 'first epoch after the reset s'),
                  ('replayed_events', 'events replayed'), ('reset_to', 'reset to checkpoint'),
                  ('workers_peak_rss_mb', 'workers peak RSS MB'), ('verdict', 'verdict'))
GOAL_TABLE = (('goal', 'goal'), ('measured', 'measured'), ('verdict', 'verdict'))
RUN_TABLE = (('repeat', 'repeat'), ('config', 'config'), ('wall_s', 'wall s'),
             ('process_s', 'process s'), ('events_per_s', 'events/s'),
             ('steady_events_per_s', 'steady events/s'), ('cpu_s', 'CPU s'),
             ('checkpoints', 'checkpoints'), ('epochs', 'epochs'),
             ('state_held_mb', 'state held MB'), ('keyed_states_max', 'keyed states'),
             ('state_written_mb', 'deltas MB'), ('driver_peak_rss_mb', 'driver RSS MB'),
             ('jvm_peak_rss_mb', 'JVM RSS MB'), ('workers_peak_rss_mb', 'workers RSS MB'),
             ('workers_peak_pss_mb', 'workers PSS MB'), ('verdict', 'verdict'), ('log', 'log'))


def notes(meta: dict) -> list[str]:
    """What the figures mean (the report's Notes)."""
    return [
        "* events/s = events / wall s, the pipeline's time from `Pipeline.run()` to the "
        'end of the stream in a fresh process whose SparkSession and Python workers were '
        'started before it; only for a run whose verdict is ok. Ratio to off = the median '
        'with checkpoints / the median with checkpoints off of the same state size, both '
        'of this invocation; lowest and highest: each run of it over that median. '
        f'Steady: from the end of the first epoch by which {STEADY_FROM:.0%} of the events '
        'were read to the end of the last (the epochs\' ramp-up and the ballast\'s fill '
        'left out).',
        f'* State: {pipeline.STATE_KEYS} keys of a stateful DoFn in the global window, '
        'each holding state MB / 1024 random bytes from its first element to the end of '
        'the stream, when it reads them back (held = the sizes it read). The runner '
        "writes every epoch's changed keys as a delta (so the ballast once) and a full "
        f'snapshot of a partition at a multiple of {SNAPSHOT_EVERY} of its revisions once '
        'its deltas hold twice its bytes; a reset, and a task in a Python worker that does '
        'not hold the current state, reload it from the store. Checkpoints off still keep '
        "the partitions' state in a store (PySpark gives tasks no affinity to a worker): "
        'a temporary local directory for "off"; in Redis for "off, state in redis". The '
        'ratio to off is what checkpointing to a store costs against the default; the '
        'ratio to off with the state in the same store, what the consistent regions cost '
        '(commit records, drains) when the state is there anyway; the ratio to the '
        'smallest state, what the size costs.',
        '* Modes: blocking writes the commit record before the next epoch; non-blocking '
        'while the next epochs run. file: a fresh directory under '
        f"{meta['tmp']} per run. redis: one redis-server on 127.0.0.1 (AOF on, appendfsync "
        f"{meta['redis_appendfsync']}, automatic AOF rewrites off), emptied and its AOF "
        'rewritten before every run.',
        f"* Recovery: the Python worker reading event {meta['fail_index']:,} fails once "
        f"({meta['fault']}). Detection: from the failure (the time it wrote in its marker "
        "file) to the controller's 'resetting after a failed epoch' line; reset: to its "
        "'reset ... to checkpoint S' line (the region's members back at cut S); catch-up: "
        'to the end of the first epoch whose read position (events read up to the '
        "cut's epoch, plus those since the reset) passes the failed event. The partitions' "
        'keyed state is reloaded by the tasks of the first epoch after the reset, so it '
        'counts in catch-up (that epoch alone: its own column). The sink is at-least-once: '
        'a recovery run may write a line twice (its verdict says how many).',
        '* Verdict: the output lines equal those computed from the generator\'s definition '
        '(not empty); a checkpointing run took a checkpoint once it lasted two periods, a '
        'run with checkpoints off none; the deltas wrote at least 90% of the state asked.',
    ]


def write_report(out: str, runs: Sequence[dict], configs: Sequence, recoveries: Sequence,
                 meta: dict) -> str:
    """`report.md`, `runs.json` and `checkpoints.png` in `out`; returns the tables and
    the goals as Markdown (what the command prints)."""
    os.makedirs(out, exist_ok=True)
    rows = summarize(runs, configs)
    recovery_rows = summarize_recovery(runs, recoveries)
    judged = goals(rows, recovery_rows)
    with open(os.path.join(out, 'runs.json'), 'w', encoding='utf-8') as f:
        json.dump({'meta': meta, 'summary': rows, 'recovery': recovery_rows,
                   'goals': judged, 'runs': list(runs)}, f, indent=1)
    problems = [f"* {r['config']} r{r['repeat']} ({r['log']}): {line}"
                for r in runs for line in r['log_problems']]
    tables = ['## Throughput', '', *micro.markdown_columns(rows, TABLE), '',
              '## Recovery', '', *(micro.markdown_columns(recovery_rows, RECOVERY_TABLE)
                                   if recovery_rows else ['no recovery run']), '',
              '## Goals', '', *micro.markdown_columns(judged, GOAL_TABLE), '']
    text = ['# Consistent regions: checkpoint overhead and recovery', '']
    text += [f'* {key}: {value}' for key, value in meta['environment'].items()]
    text += ['', 'Command:', '', '```', meta['command'], '```', '',
             f"{meta['events']:,} events (`PeriodicImpulse` over past timestamps, 1 ms of "
             f'event time apart), {pipeline.KEYS} keys, fixed windows of {pipeline.WINDOW_S} '
             's, CombinePerKey(sum) and a stateful DoFn (BagState, ReadModifyWriteState, an '
             'event-time timer), plus the keyed state of each size; '
             f"{meta['repeats']} repeat(s), interleaved, {meta['recovery_repeats']} of each "
             f"recovery; runner options `{' '.join(meta['runner_args'])}`.", '',
             *tables, '![throughput ratio and recovery](checkpoints.png)', '',
             '## Notes', '', *notes(meta), '',
             '## Every run', '', *micro.markdown_columns(runs, RUN_TABLE), '',
             '## Log problems (runner WARNING and above, tracebacks)', '',
             *(problems or ['none']), '']
    with open(os.path.join(out, 'report.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(text))
    plot(rows, recovery_rows, meta, os.path.join(out, 'checkpoints.png'))
    return '\n'.join(tables)


def _ratio_lines(ax, rows: Sequence[dict], x_key: str) -> None:
    """A line per mode and store of the rows' ratio to off against `x_key`."""
    colors = {'file': 'tab:blue', 'redis': 'tab:red'}
    drawn = [r for r in rows if r['ratio_to_off'] != '']
    for mode, style in (('non_blocking', '-'), ('blocking', '--')):
        for store, color in colors.items():
            points = sorted((r[x_key], r['ratio_to_off']) for r in drawn
                            if r['mode'] == mode and r['store'] == store)
            if points:
                ax.plot([x for x, _ in points], [y for _, y in points], style, marker='o',
                        color=color, label=f"{mode.replace('_', '-')}, {STORE_NAMES[store]}")
    ax.axhline(1.0, color='grey', linestyle=':', linewidth=1)
    ax.set_ylabel('throughput / checkpoints off')
    ax.grid(alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, 'not measured', ha='center', transform=ax.transAxes)
        return
    xs = sorted({r[x_key] for r in drawn})
    ax.set_xticks(xs, [f'{x:g}' for x in xs])
    ratios = [r['ratio_to_off'] for r in drawn]
    ax.set_ylim(min(0.8, min(ratios) - 0.05), max(1.1, max(ratios) + 0.05))
    ax.legend(fontsize=7, loc='best')


def _recovery_bars(ax, recovery_rows: Sequence[dict]) -> None:
    """Stacked bars of detection, reset and catch-up per state size and store."""
    done = [r for r in recovery_rows if r['total_s'] != '']
    labels = [f"{r['state_mb']:g} MB\n{STORE_NAMES[r['store']]}" for r in done]
    bottom = [0.0] * len(done)
    for key, color in (('detection_s', 'tab:orange'), ('reset_s', 'tab:purple'),
                       ('catch_up_s', 'tab:green')):
        heights = [r[key] for r in done]
        ax.bar(range(len(done)), heights, bottom=bottom, color=color,
               label=key[:-2].replace('_', '-'))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f'{total:.1f}', ha='center', va='bottom', fontsize=7)
    ax.set_xticks(range(len(done)), labels, fontsize=7)
    ax.set_ylabel('seconds')
    ax.set_title('Recovery (median)', fontsize=9)
    if done:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, 'not measured', ha='center', transform=ax.transAxes)


def plot(rows: Sequence[dict], recovery_rows: Sequence[dict], meta: dict, path: str) -> None:
    """Three panels: the ratio to off against the period (at the period sweep's state
    size) and against the state size (at the state sweep's period), blocking and
    non-blocking per store; the recovery bars."""
    plt = micro.pyplot()
    fig, (by_period, by_state, recovery) = plt.subplots(1, 3, figsize=(15, 4.5))
    state, period = meta['period_sweep_state_mb'], meta['state_sweep_period_s']
    _ratio_lines(by_period, [r for r in rows if r['state_mb'] == state and r['period_s']],
                 'period_s')
    by_period.set_xlabel('checkpoint period (s)')
    by_period.set_title(f'Overhead against the period, {state:g} MB of state', fontsize=9)
    by_state.set_xscale('log')  # before the ticks, which setting the scale would reset
    by_state.minorticks_off()
    _ratio_lines(by_state, [r for r in rows if r['period_s'] == period], 'state_mb')
    by_state.set_xlabel('keyed state (MB)')
    by_state.set_title(f'Overhead against the state size, every {period:g} s', fontsize=9)
    _recovery_bars(recovery, recovery_rows)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
