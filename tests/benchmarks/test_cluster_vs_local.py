"""The cluster-vs-local comparison's table and report (the runs themselves are the
cluster tests' and the benchmark's)."""

from __future__ import annotations

import csv

from benchmarks import cluster_vs_local

ROWS = [
    {'case': 'Q0 batch', 'master': 'local[2]', 'wall_s': 20.0, 'events': 1000,
     'events_per_s': 50, 'verdict': 'yes', 'note': ''},
    {'case': 'Q0 batch', 'master': 'cluster', 'wall_s': 25.0, 'events': 1000,
     'events_per_s': 40, 'verdict': 'yes', 'note': ''},
    {'case': 'Q5 batch', 'master': 'local[2]', 'wall_s': 10.0, 'events': 1000,
     'events_per_s': 100, 'verdict': 'yes', 'note': ''},
    {'case': 'Q5 batch', 'master': 'cluster', 'wall_s': 9.0, 'events': 1000,
     'events_per_s': '', 'verdict': 'failed: expected 5, got 4', 'note': ''},
]


def test_a_ratio_only_where_both_outputs_are_right():
    table = cluster_vs_local.ratio_rows(ROWS)
    assert [(r['case'], r['ratio']) for r in table] == [('Q0 batch', '1.25'), ('Q5 batch', '')]
    assert table[1]['verdicts'] == 'yes / failed: expected 5, got 4'


def test_the_report_has_the_table_the_rows_and_the_plot(tmp_path):
    table = cluster_vs_local.ratio_rows(ROWS)
    meta = {'command': 'python -m benchmarks.cluster_vs_local', 'date': '2026-11-27',
            'machine': '2 cores', 'pyspark': '4.x', 'beam': '2.77.0', 'python': '3.11'}
    cluster_vs_local.write_report(str(tmp_path), ROWS, table, meta)
    report = (tmp_path / 'report.md').read_text()
    assert '| Q0 batch | 20.0 | 25.0 | 1.25 |' in report
    assert (tmp_path / 'cluster.png').stat().st_size > 0
    with open(tmp_path / 'results.csv', encoding='utf-8') as f:
        assert len(list(csv.DictReader(f))) == 4
