"""Stateful streaming speed: the churning-keys workload, where partitions load their state
from, and what it costs (design sections 7 and 8).

    python -m benchmarks.stateful_speed [--events 500000] [--cases dofn,gbk] \\
        [--live_state host,process] [--repeats 1] [--out DIR] [runner options]

Each run is `python -m benchmarks.churning_keys` in a child process on `local[2]` (unless
the runner options name another master): case `dofn`, the stateful DoFn counting in
keyed state and flushing on an event-time timer, `gbk`, a windowed GroupByKey and a
sum over the same events, or one of the two floors under them, `source` (the read and
the stateless steps alone) and `noop_state` (into a stateful DoFn that touches no
state; see `churning_keys`). `--live_state` runs each case with the host's live state
(every Python worker of the host shares the partitions' copies, LMDB) and with each
worker's copies in its own memory (`BEAM_STREAMS_RUNNER_LIVE_STATE=process`), side by
side in one invocation. For each run: wall time, steady events/s (from the epoch by
which 20% of the events were read), the state loads by kind (`live`: the worker's own
backend of the partition's last task; `hit`: from the host's copy; `catch-up` and
`snapshot`: from the checkpoint store) with their milliseconds, the Python workers'
PSS once a tenth of the events were read and at the end, and the verdict of the output
(every key's count, equal to the expected lines; for a floor, every event counted at
its end). Writes `OUT/report.md`,
`OUT/results.csv`, `OUT/stateful_speed.png` and each run's log under `OUT/logs/`.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks import sink_check
from benchmarks.children import REPO_ROOT, child_environment

GOAL_EVENTS_PER_S = 100_000
SPARK_NATIVE_EVENTS_PER_S = 83_000  # Spark's JVM-native window count here (design section 7)
GOAL_PSS_RATIO = 1.2
LIVE_STATE_ENV = 'BEAM_STREAMS_RUNNER_LIVE_STATE'
KINDS = ('live', 'hit', 'catch-up', 'snapshot', 'initial')
FIELDS = ('case', 'live_state', 'repeat', 'wall_s', 'events_per_s', 'steady_events_per_s',
          *(f'loads_{k}' for k in KINDS), *(f'ms_per_load_{k}' for k in KINDS),
          'pss_mb_tenth', 'pss_mb_end', 'pss_ratio', 'verdict')


def run_case(case: str, live_state: str, events: int, runner_args: Sequence[str],
             log_path: str, timeout_s: float) -> dict:
    """One run in a child process: its figures (see the module docstring)."""
    command = [sys.executable, '-m', 'benchmarks.churning_keys', f'--events={events}',
               f'--case={case}', *runner_args]
    env = child_environment()
    env.pop(LIVE_STATE_ENV, None)
    if live_state == 'process':
        env[LIVE_STATE_ENV] = 'process'
    with open(log_path, 'w', encoding='utf-8') as log:
        try:
            done = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=log, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
            lines = done.stdout.strip().splitlines()
            figures = json.loads(lines[-1]) if done.returncode == 0 and lines else {
                'verdict': f'{sink_check.FAILED}: exit code {done.returncode}'}
        except subprocess.TimeoutExpired:
            figures = {'verdict': f'{sink_check.FAILED}: no end after {timeout_s:.0f} s'}
    return row_of(case, live_state, figures)


def row_of(case: str, live_state: str, figures: dict) -> dict:
    loads, load_ms = figures.get('state_loads') or {}, figures.get('state_load_ms') or {}
    tenth, end = figures.get('pss_mb_tenth', ''), figures.get('pss_mb_end', '')
    row = {'case': case, 'live_state': live_state, 'wall_s': figures.get('wall_s', ''),
           'events_per_s': figures.get('events_per_s', ''),
           'steady_events_per_s': figures.get('steady_events_per_s', ''),
           'pss_mb_tenth': tenth, 'pss_mb_end': end,
           'pss_ratio': round(end / tenth, 2) if tenth and end else '',
           'verdict': figures.get('verdict', '')}
    for kind in KINDS:
        row[f'loads_{kind}'] = loads.get(kind, 0)
        row[f'ms_per_load_{kind}'] = (round(load_ms.get(kind, 0.0) / loads[kind], 2)
                                      if loads.get(kind) else '')
    return row


def progress_line(index: int, total: int, row: dict) -> str:
    loads = ', '.join(f"{kind} {row[f'loads_{kind}']}"
                      + (f" ({row[f'ms_per_load_{kind}']} ms)" if row[f'loads_{kind}'] else '')
                      for kind in KINDS if row[f'loads_{kind}'])
    return (f"[{index}/{total}] {row['case']}, live state {row['live_state']}, repeat "
            f"{row['repeat']}: {row['wall_s']} s, {row['events_per_s']} events/s, steady "
            f"{row['steady_events_per_s']}/s; loads {loads or 'none'}; PSS "
            f"{row['pss_mb_tenth']} -> {row['pss_mb_end']} MB; verdict {row['verdict']}")


def medians(rows: Sequence[dict]) -> list[dict]:
    """Per (case, live state): the median of each figure over the repeats whose verdict
    is ok, the loads summed, the verdict 'yes' only if every repeat's was."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row['case'], row['live_state']), []).append(row)
    out = []
    for (case, live_state), mine in groups.items():
        ok = [r for r in mine if sink_check.is_ok(r['verdict'])]

        def median(field: str, rows: Sequence[dict] = ok) -> float | str:
            values = [r[field] for r in rows if r[field] != '']
            return round(statistics.median(values), 2) if values else ''
        summary = {'case': case, 'live_state': live_state, 'repeats': len(mine),
                   **{f: median(f) for f in ('wall_s', 'events_per_s', 'steady_events_per_s',
                                             'pss_mb_tenth', 'pss_mb_end', 'pss_ratio')}}
        for kind in KINDS:
            summary[f'loads_{kind}'] = sum(r[f'loads_{kind}'] for r in mine)
            summary[f'ms_per_load_{kind}'] = median(f'ms_per_load_{kind}')
        loaded = sum(summary[f'loads_{k}'] for k in ('live', 'hit', 'catch-up', 'snapshot'))
        summary['host_hit_rate'] = (round((summary['loads_live'] + summary['loads_hit'])
                                          / loaded, 3) if loaded else '')
        summary['verdict'] = 'yes' if len(ok) == len(mine) else 'failed'
        out.append(summary)
    return out


def goals(summaries: Sequence[dict]) -> list[tuple[str, str, str]]:
    lines = []
    for summary in summaries:
        if summary['case'] != 'dofn' or summary['live_state'] != 'host':
            continue
        steady, ratio = summary['steady_events_per_s'], summary['pss_ratio']
        lines.append((f'churning-keys stateful DoFn >= {GOAL_EVENTS_PER_S:,} events/s steady',
                      f'{steady}', 'met' if steady and steady >= GOAL_EVENTS_PER_S
                      else 'not met'))
        lines.append((f'worker PSS after 10x the events <= {GOAL_PSS_RATIO}x', f'{ratio}',
                      'met' if ratio and ratio <= GOAL_PSS_RATIO else 'not met'))
    return lines


def write_report(out: str, rows: Sequence[dict], summaries: Sequence[dict],
                 command: str) -> None:
    with open(os.path.join(out, 'results.csv'), 'w', newline='', encoding='utf-8') as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    columns = ('case', 'live_state', 'repeats', 'steady_events_per_s', 'events_per_s',
               'wall_s', 'host_hit_rate', *(f'loads_{k}' for k in KINDS),
               *(f'ms_per_load_{k}' for k in KINDS), 'pss_mb_tenth', 'pss_mb_end',
               'pss_ratio', 'verdict')
    text = [f'# Stateful streaming speed: churning keys ({datetime.date.today()})', '',
            f'Command: `{command}`', '', __doc__.split('\n\n', 2)[2].strip(), '',
            '| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
    text += ['| ' + ' | '.join(str(s[c]) for c in columns) + ' |' for s in summaries]
    text += ['', '| goal | measured | verdict |', '|---|---|---|']
    text += [f'| {goal} | {measured} | {verdict} |' for goal, measured, verdict in
             goals(summaries)]
    text += ['', '![steady events/s](stateful_speed.png)', '', '## Runs', '',
             '| ' + ' | '.join(FIELDS) + ' |', '|' + '---|' * len(FIELDS)]
    text += ['| ' + ' | '.join(str(r[f]) for f in FIELDS) + ' |' for r in rows]
    with open(os.path.join(out, 'report.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(text) + '\n')
    plot(out, summaries)


def plot(out: str, summaries: Sequence[dict]) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{s['case']}\n{s['live_state']}" for s in summaries]
    ax.bar(labels, [s['steady_events_per_s'] or 0 for s in summaries], color='tab:blue')
    ax.axhline(GOAL_EVENTS_PER_S, color='tab:red', linestyle='--', label='goal')
    ax.axhline(SPARK_NATIVE_EVENTS_PER_S, color='tab:gray', linestyle=':',
               label="Spark's JVM-native window count")
    ax.set_ylabel('steady events/s')
    ax.set_title('Churning keys on local[2]')
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'stateful_speed.png'), dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--events', type=int, default=500_000)
    parser.add_argument('--cases', default='dofn,gbk')
    parser.add_argument('--live_state', default='host,process')
    parser.add_argument('--repeats', type=int, default=1)
    parser.add_argument('--timeout', type=float, default=1800.0)
    parser.add_argument('--out', default=os.path.join(
        REPO_ROOT, 'benchmarks', 'results', f'{datetime.date.today()}-stateful-speed'))
    known, runner_args = parser.parse_known_args(argv)
    if not any(a.startswith('--spark_master') for a in runner_args):
        runner_args.append('--spark_master=local[2]')
    os.makedirs(os.path.join(known.out, 'logs'), exist_ok=True)
    plan = [(case, live, repeat) for repeat in range(1, known.repeats + 1)
            for case in known.cases.split(',') for live in known.live_state.split(',')]
    rows = []
    for index, (case, live, repeat) in enumerate(plan, 1):
        started = time.monotonic()
        row = run_case(case, live, known.events, runner_args,
                       os.path.join(known.out, 'logs', f'{case}-{live}-r{repeat}.log'),
                       known.timeout)
        row['repeat'] = repeat
        row['wall_s'] = row['wall_s'] or round(time.monotonic() - started, 1)
        rows.append(row)
        print(progress_line(index, len(plan), row), flush=True)
    summaries = medians(rows)
    write_report(known.out, rows, summaries,
                 'python -m benchmarks.stateful_speed ' + ' '.join(argv or sys.argv[1:]))
    print(f"report: {os.path.join(known.out, 'report.md')}")
    return 0 if all(s['verdict'] == 'yes' for s in summaries) else 1


if __name__ == '__main__':
    sys.exit(main())
