"""The side-by-side report's wall-time table (`benchmarks.side_by_side.wall_times`)."""

from __future__ import annotations

import csv
from pathlib import Path

from benchmarks.side_by_side import CommitRun, wall_times


def _run(tmp_path: Path, label: str, rows: list[dict]) -> CommitRun:
    out = tmp_path / label
    out.mkdir()
    with (out / 'results.csv').open('w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)
    return CommitRun(commit=label, sha=label, out=out)


def test_nexmark_rows_line_up_per_query_and_runner(tmp_path):
    runs = [_run(tmp_path, 'a', [{'query': '5', 'runner': 'R', 'wall_s': '10.0'},
                                 {'query': '10', 'runner': 'R', 'wall_s': '4.0'}]),
            _run(tmp_path, 'b', [{'query': '5', 'runner': 'R', 'wall_s': '8.0'}])]
    assert wall_times(runs) == [('Q5 R', [10.0, 8.0]), ('Q10 R', [4.0, None])]


def test_rows_without_a_query_are_left_to_their_own_report(tmp_path):
    # The stateful-speed benchmark's rows (case, repeat, ...) have no query: under one
    # label they overwrote each other and the table showed one arbitrary row.
    rows = [{'case': 'dofn', 'repeat': '1', 'wall_s': '18.7'},
            {'case': 'gbk', 'repeat': '1', 'wall_s': '20.5'}]
    assert wall_times([_run(tmp_path, 'a', rows), _run(tmp_path, 'b', rows)]) == []
