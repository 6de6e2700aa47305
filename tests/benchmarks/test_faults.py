"""The fault matrix (benchmarks/faults.py): its cells, how it judges a run, its report,
and two cells end to end (a worker SIGKILLed, and a region that exhausts its resets,
each a driver program of its own against a redis-server the command starts)."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from benchmarks import faults
from tests.faults import harness


def test_the_matrix_has_250_cells_in_three_seeds_and_a_fixed_order():
    first = list(faults.cells(faults.PIPELINES, faults.SINKS, faults.FAULTS, 3))
    assert len(first) >= 250
    assert first == list(faults.cells(faults.PIPELINES, faults.SINKS, faults.FAULTS, 3))
    assert len(set(first)) == len(first), 'two cells are the same run'
    for fault in faults.FAULTS:
        for sink in faults.SINKS:
            assert any(c.fault == fault and c.sink == sink for c in first), (fault, sink)
    assert {c.store for c in first} == {'file', 'redis'}
    assert {c.mode for c in first} == {'blocking', 'non_blocking'}
    assert all(c.mode == 'non_blocking' for c in first
               if c.place == 'during_non_blocking_write')
    assert not any(c.place == 'published' for c in first if c.sink == 'redis')


def test_an_unknown_fault_family_is_named():
    with pytest.raises(ValueError, match="'F99'"):
        list(faults.cells(['combine'], ['files'], ['F99'], 1))


def judge(cell, runs, lines_or_keys, tmp_path):
    """`Matrix._judge` of a made-up run whose file sink holds `lines_or_keys`."""
    tmp_path.mkdir()
    spec = harness.Spec(cell.pipeline, cell.sink, str(tmp_path / 'out'), 1_000_000_000,
                        fault=harness.Fault('raise', str(tmp_path / 'fault'), cell.at,
                                            'source', 1))
    (tmp_path / 'fault.0').write_text('fired')
    golden = harness.golden_lines(spec)
    (tmp_path / 'out').mkdir()
    for window in range(spec.span_s):
        start = spec.start + window
        name = f'{harness.TEXT_PREFIX}-[{start}.0, {start + 1}.0)-00000-of-00001'
        mine = [line for line in lines_or_keys(golden) if line.startswith(f'w{start} ')]
        (tmp_path / 'out' / name).write_text(''.join(f'{line}\n' for line in mine))
    matrix = faults.Matrix.__new__(faults.Matrix)
    matrix.sink_client = None
    return matrix._judge(cell, spec, runs, '')


def cell(fault='F2', place='source'):
    return faults.Cell('combine', 'text', fault, place, 250, 'file', 'blocking', 0)


OK = SimpleNamespace(returncode=0, stderr='')


def test_a_run_is_judged_by_its_output(tmp_path):
    assert judge(cell(), [OK], lambda g: g, tmp_path / 'a').outcome == 'exact'
    lost = judge(cell(), [OK], lambda g: g[1:], tmp_path / 'b')
    assert not lost.passed and lost.lost == 1
    twice = judge(cell(), [OK], lambda g: g + g[:2], tmp_path / 'c')
    assert not twice.passed and twice.duplicated == 2
    failed = judge(cell(), [SimpleNamespace(returncode=1, stderr='boom')], lambda g: g,
                   tmp_path / 'd')
    assert not failed.passed and 'exit 1' in failed.outcome


def test_past_the_reset_limit_a_run_must_fail_with_the_region_error(tmp_path):
    limit = cell('F6', f'k={faults.MAX_RESETS + 1}')
    region_error = SimpleNamespace(returncode=1, stderr='RegionResetError: failed 6 times')
    assert judge(limit, [region_error], lambda g: g[:5], tmp_path / 'a').passed
    assert not judge(limit, [OK], lambda g: g, tmp_path / 'b').passed
    assert not judge(limit, [region_error], lambda g: g[:5] + g[:1], tmp_path / 'c').passed


def test_the_report_sums_the_cells(tmp_path):
    results = [faults.Outcome(cell(), True, 'exact', wall_s=3.0),
               faults.Outcome(cell('F1'), False, 'lost', lost=2, wall_s=4.0, log='the log')]
    faults.write_report(str(tmp_path), results, {'date': 'today', 'command': 'cmd',
                                                  'versions': {'Beam': 'x'}})
    report = (tmp_path / 'report.md').read_text()
    assert '| all | 2 | 1 | 2 | 0 | 7.0 |' in report
    assert (tmp_path / 'faults.png').stat().st_size > 0
    assert len(json.loads((tmp_path / 'cells.json').read_text())['cells']) == 2
    assert [p.read_text() for p in (tmp_path / 'logs').iterdir()] == ['the log']


def test_two_cells_end_to_end(tmp_path):
    """The command itself, on two cells: F1 at the source of the combine pipeline into
    WriteToFiles, and F6 past the reset limit into Redis (its run must fail)."""
    done = subprocess.run(
        ['python', '-m', 'benchmarks.faults', '--pipelines=combine', '--seeds=1',
         '--sinks=files,redis', '--faults=F1,F6', '--only=files source@|redis k=6@',
         f'--out={tmp_path}'], capture_output=True, text=True, timeout=600,
        cwd=harness.REPO)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    cells = json.loads((tmp_path / 'cells.json').read_text())['cells']
    assert [(c['fault'], c['sink'], c['outcome']) for c in cells] == [
        ('F1', 'files', 'exact'), ('F6', 'redis', 'failed as expected')]
    assert '[1/2] F1 combine/files source@' in done.stdout
