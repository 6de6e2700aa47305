"""The stateful-speed benchmark's bookkeeping: rows, medians, goals and the report (the
runs themselves are `churning_keys` runs, tested there)."""

from __future__ import annotations

from benchmarks import stateful_speed

FIGURES = {'wall_s': 30.0, 'events_per_s': 16_000, 'steady_events_per_s': 20_000,
           'verdict': 'yes', 'state_loads': {'initial': 2, 'live': 6, 'hit': 2},
           'state_load_ms': {'initial': 2.0, 'live': 0.6, 'hit': 10.0},
           'pss_mb_tenth': 200.0, 'pss_mb_end': 220.0}


def rows():
    out = []
    for repeat, steady in ((1, 20_000), (2, 30_000)):
        row = stateful_speed.row_of('dofn', 'host', {**FIGURES, 'steady_events_per_s': steady})
        row['repeat'] = repeat
        out.append(row)
    failed = stateful_speed.row_of('dofn', 'process', {'verdict': 'failed: exit code 1'})
    failed['repeat'] = 1
    return [*out, failed]


def test_rows_give_the_cost_per_load_and_the_memory_ratio():
    row = rows()[0]
    assert row['ms_per_load_hit'] == 5.0 and row['ms_per_load_live'] == 0.1
    assert row['ms_per_load_catch-up'] == '' and row['loads_catch-up'] == 0
    assert row['pss_ratio'] == 1.1


def test_medians_judge_every_repeat_and_the_goals_follow():
    summaries = {s['live_state']: s for s in stateful_speed.medians(rows())}
    host = summaries['host']
    assert host['steady_events_per_s'] == 25_000 and host['verdict'] == 'yes'
    assert host['host_hit_rate'] == 1.0  # live and hit loads, of those not initial
    assert summaries['process']['verdict'] == 'failed'
    goals = dict((goal, verdict) for goal, _, verdict in
                 stateful_speed.goals(list(summaries.values())))
    assert list(goals.values()) == ['not met', 'met']


def test_the_report_has_its_table_and_plot(tmp_path):
    all_rows = rows()
    stateful_speed.write_report(str(tmp_path), all_rows, stateful_speed.medians(all_rows),
                                'python -m benchmarks.stateful_speed')
    report = (tmp_path / 'report.md').read_text()
    assert '| dofn | host | 2 | 25000' in report and 'not met' in report
    assert (tmp_path / 'stateful_speed.png').stat().st_size > 0
    assert (tmp_path / 'results.csv').read_text().count('\n') == 4
