"""The fault matrix (benchmarks/faults.py): its cells, how it judges a run, its report,
and two cells end to end (a worker SIGKILLed, and a region that exhausts its resets,
each a driver program of its own against a redis-server the command starts)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from types import SimpleNamespace

import pytest

from benchmarks import fault_cells, faults
from tests.faults import harness


def test_the_matrix_has_250_cells_in_one_seed_and_a_fixed_order():
    first = list(faults.cells(faults.PIPELINES, faults.SINKS, faults.FAULTS, 1))
    assert len(first) >= 250
    assert first == list(faults.cells(faults.PIPELINES, faults.SINKS, faults.FAULTS, 1))
    assert len(set(first)) == len(first), 'two cells are the same run'
    for fault in faults.FAULTS:
        for pipeline in faults.PIPELINES:
            for sink in ('files', 'redis'):
                assert any(c.fault == fault and c.pipeline == pipeline and c.sink == sink
                           for c in first), (fault, pipeline, sink)
    assert {c.sink for c in first if c.pipeline in ('combine', 'stateful')} == {
        'files', 'redis', 'text'}
    assert {c.store for c in first} == {'file', 'redis'}
    assert {c.mode for c in first} == {'blocking', 'non_blocking'}
    assert {c.place for c in first if c.fault == 'F4'} == set(faults.PROTOCOL_POINTS)
    assert {c.place for c in first if c.fault == 'F6'} == {'k=3', 'k=6'}
    assert all(c.store == 'redis' for c in first if c.fault in ('F7', 'F8'))
    assert all(c.mode == 'non_blocking' for c in first
               if c.place == 'during_non_blocking_write')
    assert not any(c.place == 'published' for c in first if c.sink == 'redis')
    for pipelines, sinks in ((['windows'], ['redis']), (['cuts', 'stateful'], ['text', 'files'])):
        chosen = list(faults.cells(pipelines, sinks, faults.FAULTS, 1))
        assert chosen and set(chosen) <= set(first), 'a cell changes with the others chosen'


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
    golden = harness.golden(spec)['']
    (tmp_path / 'out').mkdir()
    for window in range(spec.span_s):
        start = spec.start + window
        name = f'{harness.TEXT_PREFIX}-[{start}.0, {start + 1}.0)-00000-of-00001'
        mine = [line for line in lines_or_keys(golden) if line.startswith(f'w{start} ')]
        (tmp_path / 'out' / name).write_text(''.join(f'{line}\n' for line in mine))
    setup = fault_cells.Setup(str(tmp_path), '', [], '')
    return fault_cells.CellRunner(str(tmp_path), None)._judge(cell, spec, runs, None, setup,
                                                             {})


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


def test_a_run_past_its_timeout_fails_its_cell_and_the_matrix_goes_on(tmp_path,
                                                                      monkeypatch):
    def stuck(*args, **kwargs):
        raise subprocess.TimeoutExpired('harness.py', 300, stderr=b'the end of its log')

    monkeypatch.setattr(fault_cells.harness, 'run_subprocess', stuck)
    run = fault_cells._run(fault_cells.Setup(str(tmp_path), 'spec.json', [], ''))
    assert (run.returncode, run.stderr) == ('timeout', 'the end of its log')
    timed_out = judge(cell(), [run], lambda g: g, tmp_path / 'a')
    assert not timed_out.passed and 'timed out after 300 s' in timed_out.outcome


def test_a_wiped_store_must_be_detected_and_change_nothing(tmp_path):
    killed = SimpleNamespace(returncode=faults.KILLED, stderr='')
    wiped = SimpleNamespace(returncode=1, stderr='CheckpointStateError: ... the store was '
                                                 'wiped ...')
    f9 = cell('F9', 'wiped')
    assert judge(f9, [killed, wiped], lambda g: g[:6], tmp_path / 'a').outcome == (
        'failed as expected')
    resumed = judge(f9, [killed, OK], lambda g: g, tmp_path / 'b')
    assert not resumed.passed and 'instead of failing' in resumed.outcome
    other = judge(f9, [killed, SimpleNamespace(returncode=1, stderr='boom')], lambda g: g,
                  tmp_path / 'c')
    assert not other.passed and 'failed without the store was wiped' in other.outcome


def test_a_fault_that_did_not_happen_fails_its_cell(tmp_path):
    late = judge(cell('F10', 'late_write'), [OK], lambda g: g, tmp_path / 'a')
    assert not late.passed and 'no late write landed' in late.outcome
    sleep = judge(cell('F12', 'source'), [OK], lambda g: g, tmp_path / 'b')
    assert not sleep.passed and 'drain timeout' in sleep.outcome


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
    again = faults.done_before(str(tmp_path))
    assert [again[r.cell.name] for r in results] == [dataclasses.replace(r, log='')
                                                     for r in results]


def test_two_cells_end_to_end(tmp_path):
    """The command itself, on two cells: F1 at the source of the combine pipeline into
    WriteToFiles, and F6 past the reset limit of the stateless chain into Redis (its
    run must fail)."""
    command = ['python', '-m', 'benchmarks.faults', '--pipelines=combine,stateless',
               '--seeds=1', '--sinks=files,redis', '--faults=F1,F6',
               '--only=F1 combine/files source@|F6 stateless/redis k=6@', f'--out={tmp_path}']
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          cwd=harness.REPO)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    cells = json.loads((tmp_path / 'cells.json').read_text())['cells']
    assert [(c['fault'], c['sink'], c['outcome']) for c in cells] == [
        ('F1', 'files', 'exact'), ('F6', 'redis', 'failed as expected')]
    assert '[1/2] F1 combine/files source@' in done.stdout
    # Started again on the same report: nothing left to run, the same result.
    again = subprocess.run(command, capture_output=True, text=True, timeout=600,
                           cwd=harness.REPO)
    assert again.returncode == 0 and '2 cells, 2 done before, 0 to run' in again.stdout
