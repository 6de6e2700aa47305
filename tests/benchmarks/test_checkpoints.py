"""The checkpoint overhead and recovery benchmark: its reference output and keyed-state
ballast, its plan, what it reads from the runner's logs (recovery times included), its
verdicts, goals, report and exit code, and one tiny run end to end.

Timings are never asserted. The end-to-end test runs 5,000 events with 1 MB of keyed
state, checkpoints off and every 0.5 s, and one recovery from a Python worker that
SIGKILLs itself (three child processes, each with its own JVM); everything else runs
on made-up child results and log lines, without Spark.
"""

from __future__ import annotations

import json
import os
import zlib

import pytest
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from beam_streams_runner.driver.progress import summary
from benchmarks import batch_speed
from benchmarks import checkpoints as ck
from benchmarks import checkpoints_logs as logs
from benchmarks import checkpoints_pipeline as cp
from benchmarks import checkpoints_report as cr
from benchmarks import checkpoints_runs as runs

START_US = int(cp.START * 1_000_000)
WINDOW_US = cp.WINDOW_S * 1_000_000


# The events, the ballast and the reference ---------------------------------------------
def test_the_generator_emits_exactly_the_events_asked_for():
    for events in (1, 7, 999, 10_000, 123_457, 1_000_000):
        assert cp.generated_events(events) == events
    for n in (0, 1, 9_999, 10_000, 123_456):
        assert cp.event_index(cp.START + cp.INTERVAL_S * n) == n


def test_reference_counts_every_key_of_every_window():
    # 25,000 events: windows [0, 10 s), [10 s, 20 s) with 10 events per key, and
    # [20 s, 25 s) with 5; each (window, key) once from each branch; 1024 pads.
    lines = cp.expected_lines(25_000, 1)
    windowed = [line for line in lines if not line.startswith('pad\t')]
    assert lines == sorted(lines) and len(windowed) == 2 * 3 * cp.KEYS
    assert len(lines) - len(windowed) == cp.STATE_KEYS
    second = START_US + WINDOW_US
    assert cp.sum_line(7, START_US, 10) in lines
    assert cp.bag_line(7, second, 10, 10, sum(7 + 1000 * j for j in range(10, 20))) in lines
    assert cp.sum_line(999, START_US + 2 * WINDOW_US, 5) in lines
    # Event 10,000 is the first of the second window, as its Timestamp says.
    assert Timestamp.of(cp.START + cp.INTERVAL_S * 10_000).micros == second
    # The sink's line of an output is the reference's line of it.
    w = window.IntervalWindow(Timestamp(micros=second), Timestamp(micros=second + WINDOW_US))
    assert cp.output_lines(('sum', 3, (10,)), w, w.max_timestamp()) == [
        cp.sum_line(3, second, 10)]


def test_the_ballast_holds_the_state_asked_for_and_its_reference_says_so():
    assert cp.pad_size(1) * cp.STATE_KEYS == cp.MB
    assert cp.pad_size(512) == 512 * 1024 and cp.pad_size(10) == 10240
    pad = cp.pad_of(5, 1000)
    # The same bytes in every process, other bytes for another key, none compressible.
    assert pad == cp.pad_of(5, 1000) and pad != cp.pad_of(6, 1000)
    assert len(zlib.compress(pad)) > 990
    assert cp.ballast_keys(500) == 500 and cp.ballast_keys(5000) == cp.STATE_KEYS
    pads = cp.pad_lines(500, 1)
    assert pads[5] == cp.pad_line(5, 1024, zlib.crc32(cp.pad_of(5, 1024)))
    assert len(pads) == 500 and all(line in cp.expected_lines(500, 1) for line in pads)
    # The ballast's output, as the sink writes it, and the state it says was held.
    assert cp.output_lines(('pad', 5, (1024, zlib.crc32(cp.pad_of(5, 1024)))), None,
                           None) == [pads[5]]
    assert runs.held_mb(cp.pad_lines(5000, 8)) == 8.0
    assert runs.held_mb([cp.sum_line(1, 0, 3)]) == 0


# The plan -------------------------------------------------------------------------------
def test_the_slices_sweep_periods_at_one_size_and_sizes_at_one_period():
    configs = ck.configurations([1, 10, 512], [0, 1, 8], ['blocking', 'non_blocking'],
                                ['file'], 'slices', sweep_state_mb=10, sweep_period_s=8)
    assert [c.name for c in configs] == [
        '10mb-off', '10mb-1s-blocking-file', '10mb-1s-non_blocking-file',
        '10mb-8s-blocking-file', '10mb-8s-non_blocking-file',
        '1mb-off', '1mb-8s-blocking-file', '1mb-8s-non_blocking-file',
        '512mb-off', '512mb-8s-blocking-file', '512mb-8s-non_blocking-file']
    full = ck.configurations([1, 10], [0, 1, 8], ['non_blocking'], ['file', 'redis'], 'full')
    assert len(full) == 2 * (2 + 2 * 2) and full[0] == runs.Config(1, 0, runs.OFF, runs.OFF)
    assert [c.name for c in full[:2]] == ['1mb-off', '1mb-off-redis']
    assert full[1].label == 'off, state in redis'
    recoveries = ck.recovery_configurations([10, 512], 1.0, 'non_blocking', ['file'])
    assert [c.name for c in recoveries] == ['recovery-10mb-1s-non_blocking-file',
                                            'recovery-512mb-1s-non_blocking-file']
    with pytest.raises(ValueError):
        ck.recovery_configurations([10], 0.0, 'non_blocking', ['file'])
    plan = ck.plan_runs(configs[:2], 2, recoveries[:1], 1)
    assert [(c.name, r) for c, r in plan] == [
        ('10mb-off', 1), ('10mb-1s-blocking-file', 1), ('10mb-off', 2),
        ('10mb-1s-blocking-file', 2), ('recovery-10mb-1s-non_blocking-file', 1)]
    assert ck.fail_index(200_000, 0.5) == 100_000 and ck.fail_index(10, 2.0) == 9


def test_quick_and_the_default_plan():
    configs, recoveries = ck.plan_of(ck.parser().parse_args([]))
    # The docstring's estimate counts these.
    assert (len(configs), len(recoveries)) == (38, 10)
    p = ck.parser()
    p.set_defaults(**ck.QUICK)
    configs, recoveries = ck.plan_of(p.parse_args([]))
    assert [c.name for c in configs + recoveries] == [
        '1mb-off', '1mb-1s-non_blocking-file', 'recovery-1mb-1s-non_blocking-file']


# The logs -------------------------------------------------------------------------------
def _epoch_line(time: str, epoch: int, read: int, state_bytes: int = 123) -> str:
    record = {'epoch': epoch, 'duration_ms': 900, 'read_ms': 250,
              'sources': {'Events': {'elements': read, 'input_rate_per_s': 1.0}},
              'sinks': {'Write': {'elements': 10}},
              'watermark': {'input_watermark': None}, 'keyed_states': 2000 + epoch,
              'timers': 2000, 'state_bytes_written': state_bytes}
    return f'{time} INFO beam_streams_runner.runner: StreamsSparkRunner: {summary(record)}'


# The controller's own format strings.
def _checkpoint_line(time: str, sequence: int, epoch: int) -> str:
    message = 'Consistent region %r: checkpoint %d after epoch %d is consistent' % (
        'default', sequence, epoch)
    return f'{time} INFO beam_streams_runner.regions.controller: {message}'


def _reset_lines(start: str, end: str, sequence: int, seconds: float) -> list[str]:
    cause = 'PipelineExecutionError: Python worker exited unexpectedly (crashed)'
    started = 'Consistent region %r: resetting after a failed epoch: %s' % ('default', cause)
    done = 'Consistent region %r: reset %d of %d to checkpoint %d after: %s (%.1f s)' % (
        'default', 1, 5, sequence, cause, seconds)
    return [f'{start} INFO beam_streams_runner.regions.controller: {started}',
            f'{end} WARNING beam_streams_runner.regions.controller: {done}']


LOG = '\n'.join([
    '26/11/25 00:41:42 WARN BlockManager: Block rdd_25_0 already exists',
    _epoch_line('2026-11-25 00:00:01,000', 0, 1000),
    _epoch_line('2026-11-25 00:00:02,000', 1, 1000),
    _checkpoint_line('2026-11-25 00:00:02,001', 1, 0),
    _epoch_line('2026-11-25 00:00:03,000', 2, 4000),
    _checkpoint_line('2026-11-25 00:00:03,001', 2, 1),
    _epoch_line('2026-11-25 00:00:04,500', 3, 4000),
    '2026-11-25 00:00:04,600 WARNING beam_streams_runner.regions.controller: write failed',
])


def test_checkpoints_epochs_state_and_problems_are_read_from_the_log():
    assert logs.checkpoints_in(LOG) == [('default', 1, 0), ('default', 2, 1)]
    assert [read for _, read in logs.epochs_in(LOG)] == [1000, 2000, 6000, 10000]
    # Steady from the first epoch with 20% of 10,000 events read (epoch 1, at 2 s):
    # 8,000 more events in 2.5 s.
    assert logs.steady_rate(LOG, 10_000) == 3200
    assert logs.steady_rate('', 10_000) == ''
    assert logs.problems_in(LOG) == [LOG.splitlines()[-1]]
    assert logs.state_figures(LOG) == {'keyed_states_max': 2003, 'state_written_mb': 0.0}
    big = _epoch_line('2026-11-25 00:00:01,000', 0, 10, state_bytes=3 * cp.MB)
    assert logs.state_figures(big)['state_written_mb'] == 3.0


# Epochs 0-2 read events 0-5999, checkpoint 1 is after epoch 0 (1,000 events), the worker
# dies on event 4500 (in epoch 3) at 3.2 s; the controller hears of it at 3.5 s, has reset
# to checkpoint 1 at 3.6 s; epochs 4 and 5 replay from event 1000: 2000 events, then 4000,
# past event 4500 at 6.0 s.
FAILED_AT = logs.log_time('2026-11-25 00:00:03,200')
RECOVERY_LOG = '\n'.join([
    _epoch_line('2026-11-25 00:00:01,000', 0, 1000, state_bytes=cp.MB),
    _checkpoint_line('2026-11-25 00:00:01,100', 1, 0),
    _epoch_line('2026-11-25 00:00:02,000', 1, 2000),
    _epoch_line('2026-11-25 00:00:03,000', 2, 3000),
    *_reset_lines('2026-11-25 00:00:03,500', '2026-11-25 00:00:03,600', 1, 0.1),
    _epoch_line('2026-11-25 00:00:05,000', 4, 2000),
    _epoch_line('2026-11-25 00:00:06,000', 5, 4000),
    _epoch_line('2026-11-25 00:00:07,000', 6, 1000),
])


def test_a_recovery_is_split_into_detection_reset_and_catch_up():
    assert logs.recovery_times(RECOVERY_LOG, FAILED_AT, 4500) == {
        'detection_s': 0.3, 'reset_s': 0.1, 'catch_up_s': 2.4, 'total_s': 2.8,
        'reset_to_checkpoint': 1, 'cut_epoch': 0, 'replayed_events': 3501,
        'first_epoch_after_reset_s': 1.4, 'caught_up_epoch': 5, 'resets': 1}
    # Reset to the initial state (checkpoint 0): the replay starts at event 0, and 6,000
    # events pass event 4,500 at the second epoch too.
    initial = RECOVERY_LOG.replace('to checkpoint 1 after', 'to checkpoint 0 after')
    assert logs.recovery_times(initial, FAILED_AT, 4500)['replayed_events'] == 4501
    # Not caught up by the end of the log; no reset at all.
    short = '\n'.join(RECOVERY_LOG.splitlines()[:-2])
    assert logs.recovery_times(short, FAILED_AT, 4500)['total_s'] == ''
    assert logs.recovery_times(LOG, FAILED_AT, 4500) is None


# Verdicts -------------------------------------------------------------------------------
def test_verdict_needs_the_exact_output_fitting_checkpoints_and_the_state():
    expected = cp.expected_lines(2000, 1)
    done = {'ok': True, 'state': 'PipelineState.DONE', 'wall_s': 5.0}
    on, off = runs.Config(1, 1.0, 'non_blocking', 'file'), runs.Config(1, 0.0, '-', '-')
    assert runs.run_verdict(done, list(reversed(expected)), expected, on, 3) == 'yes'
    assert runs.run_verdict(done, expected, expected, off, 0) == 'yes'
    wrong = [*expected[:-1], expected[-1] + '0']
    assert runs.run_verdict(done, wrong, expected, on, 3).startswith(
        f'failed: expected {len(expected)}')
    assert runs.run_verdict(done, expected[1:], expected, on, 3).startswith('failed')
    assert runs.run_verdict(done, [], expected, on, 3).endswith('(empty output)')
    assert runs.run_verdict(done, expected, expected, on, 0) == 'failed: no checkpoint in 5.0 s'
    assert runs.run_verdict(done, expected, expected, off, 2).startswith('failed: 2 checkpoints')
    assert runs.run_verdict(done, expected, expected, on, 3, written_mb=0.2) == (
        'failed: the runner wrote 0.2 MB of state, 1 MB asked')
    assert runs.run_verdict({'ok': False, 'error': 'RuntimeError: boom'}, expected, expected,
                            on, 3) == 'failed: the run ended RuntimeError: boom'
    assert runs.run_verdict(None, expected, expected, on, 3) == 'failed: the run left no result'
    # A line twice fails a throughput run; a recovery run replayed it (at-least-once).
    twice = [*expected, expected[0]]
    assert runs.run_verdict(done, twice, expected, on, 3).startswith('failed')
    recovery = runs.Config(1, 1.0, 'non_blocking', 'file', recovery=True)
    figures = logs.recovery_times(RECOVERY_LOG, FAILED_AT, 4500)
    assert runs.run_verdict(done, twice, expected, recovery, 3, 1.0, figures) == (
        'yes (1 lines twice, from the replay)')
    # A line lost is lost, whatever else came twice.
    assert runs.run_verdict(done, [*expected[1:], expected[1]], expected, recovery, 3, 1.0,
                            figures).startswith('failed')
    assert runs.run_verdict(done, expected, expected, recovery, 3, 1.0, None) == (
        'failed: the fault never fired or no reset followed it')
    assert runs.run_verdict(done, expected, expected, recovery, 3, 1.0,
                            {**figures, 'total_s': ''}).startswith('failed: no epoch after')


def _row(state, period, mode, store, ratio):
    return {'state_mb': state, 'period_s': period, 'mode': mode, 'store': store,
            'ratio_to_off': ratio}


def test_the_goals_are_met_not_met_or_not_measured():
    rows = [_row(10, 0, '-', '-', 1.0), _row(10, 1, 'non_blocking', 'file', 0.93),
            _row(10, 1, 'non_blocking', 'redis', 0.91), _row(10, 8, 'non_blocking', 'file', 0.96),
            _row(512, 2, 'non_blocking', 'file', ''), _row(512, 2, 'blocking', 'file', 0.6)]
    recovery = [{'state_mb': 10, 'period_s': 1, 'store': 'file', 'total_s': 2.5},
                {'state_mb': 10, 'period_s': 1, 'store': 'redis', 'total_s': 5.5}]
    judged = {g['goal'].split(' with')[0].split(' (')[0]: g for g in cr.goals(rows, recovery)}
    at_1s = judged['overhead <= 10% at a 1 s period']
    assert at_1s['verdict'] == 'met'
    assert at_1s['measured'] == '0.93 (local directory); 0.91 (Redis)'
    assert judged['overhead <= 3% at an 8 s period']['verdict'] == 'not met'
    at_512 = judged['non-blocking keeps >= 94% of the throughput at 512 MB']
    assert at_512['verdict'] == 'not met'  # its run failed
    assert at_512['measured'] == ('failed (local directory, every 2 s); '
                                  'blocking: 0.6 (local directory, every 2 s)')
    assert judged['recovery <= 5 s at 10 MB'] == {
        'goal': 'recovery <= 5 s at 10 MB', 'verdict': 'not met',
        'measured': '2.5 s (local directory, every 1 s); 5.5 s (Redis, every 1 s)'}
    assert judged['recovery <= 60 s at 512 MB']['verdict'] == 'not measured'


def test_redis_rows_have_a_ratio_to_off_with_the_state_in_redis_too():
    rows = [{**_row(512, 0, '-', '-', ''), 'events_per_s': 5000, 'config': 'a'},
            {**_row(512, 0, '-', 'redis', ''), 'events_per_s': 4000, 'config': 'b'},
            {**_row(512, 2, 'non_blocking', 'redis', ''), 'events_per_s': 3900, 'config': 'c'},
            {**_row(512, 2, 'non_blocking', 'file', ''), 'events_per_s': 4900, 'config': 'd'}]
    for row in rows:
        row['steady_events_per_s'] = ''
    cr.add_ratios(rows, [])
    assert [r['ratio_to_off'] for r in rows] == [1.0, 0.8, 0.78, 0.98]
    assert [r['ratio_to_store_off'] for r in rows] == ['', '', 0.975, 0.98]
    judged = {g['goal'][:40]: g for g in cr.goals(rows, [])}
    at_512 = judged['non-blocking keeps >= 94% of the through']
    assert at_512['verdict'] == 'not met'
    assert at_512['measured'] == ('0.78 (Redis, every 2 s; 0.975 against off with the state '
                                  'in Redis); 0.98 (local directory, every 2 s)')


# The command, on made-up runs -------------------------------------------------------------
def _fake_launch(wrong_in: str | None):
    """A `launch` without Spark: the reference output (one count off in `wrong_in`),
    epochs whose deltas wrote the state asked for, checkpoints if on, and a recovery in
    the log of a recovery run."""
    def launch(config, repeat, events, store_url, runner_args, work, log_dir, fault=None,
               timeout_s=0):
        assert (store_url is None) == (config.store == runs.OFF)
        lines = cp.expected_lines(events, config.state_mb)
        if config.name == wrong_in:
            lines[0] = lines[0] + '1'
        if config.recovery:
            assert fault == runs.Fault(1000, 'kill_worker')
            return runs.Launched(_child(2.5), RECOVERY_LOG,
                                 lines + lines[:3], 0, 12.0, f'logs/{config.name}.log',
                                 FAILED_AT)
        log = '\n'.join([_epoch_line('2026-11-25 00:00:01,000', 0, events // 2,
                                     int(config.state_mb * cp.MB)),
                         _epoch_line('2026-11-25 00:00:02,000', 1, events // 2)]
                        + ([_checkpoint_line('2026-11-25 00:00:02,001', 1, 0)]
                           if config.period_s else []))
        wall = 2.0 if config.period_s else 1.6
        return runs.Launched(_child(wall), log, lines, 0, wall + 10, f'logs/{config.name}.log')
    return launch


def _child(wall: float) -> dict:
    return {'ok': True, 'state': 'PipelineState.DONE', 'wall_s': wall, 'cpu_s': 3.0,
            'epochs': 2, 'driver_peak_rss_mb': 170.0, 'jvm_peak_rss_mb': 400.0,
            'workers_peak_rss_mb': 300.0, 'workers_peak_pss_mb': 200.0}


@pytest.mark.parametrize('wrong_in', [None, '1mb-1s-non_blocking-file'])
def test_the_report_and_a_wrong_output_failing_the_command(tmp_path, monkeypatch, wrong_in):
    monkeypatch.setattr(ck, 'launch', _fake_launch(wrong_in))
    monkeypatch.setattr(batch_speed, 'session_cores', lambda: 2.0)
    code = ck.main(['--events=2000', '--state_mb=1', '--periods=0,1', '--modes=non_blocking',
                    '--store=file', '--repeats=2', '--fail_at=0.5', f'--out={tmp_path}'])
    data = json.loads((tmp_path / 'runs.json').read_text())
    off, on = data['summary']
    assert off['events_per_s'] == 1250 and off['ratio_to_off'] == 1.0
    assert [r['config'] for r in data['runs']] == ['1mb-off', '1mb-1s-non_blocking-file'] * 2 + [
        'recovery-1mb-1s-non_blocking-file']
    assert off['state_held_mb'] == 1.0 and off['state_written_mb'] == 1.0
    recovery, = data['recovery']
    # Event 1,000 is passed again by the first epoch after the reset.
    assert (recovery['detection_s'], recovery['reset_s'], recovery['total_s']) == (0.3, 0.1, 1.8)
    assert recovery['verdict'] == 'yes'
    assert data['runs'][-1]['verdict'] == 'yes (3 lines twice, from the replay)'
    report = (tmp_path / 'report.md').read_text()
    assert os.path.getsize(tmp_path / 'checkpoints.png') > 0
    for part in ('| state MB asked | state MB held | checkpoints | mode | store | median '
                 'events/s | ratio to off |', '| detection s | reset s | catch-up s | total s |',
                 '## Goals', '| recovery <= 5 s at 10 MB | - | not measured |',
                 'redis-server', 'Python', '--repeats=2'):
        assert part in report
    if wrong_in is None:
        assert code == 0
        assert (on['events_per_s'], on['ratio_to_off'], on['verdict']) == (1000, 0.8, 'yes')
        assert on['checkpoints_taken'] == '1 / 1'
    else:
        assert code == 1
        assert on['events_per_s'] == '' and on['ratio_to_off'] == ''
        assert on['verdict'].startswith('r1: failed: expected')
        assert '| 1 | 1.0 | every 1 s | non_blocking | file | - | - |' in report


# One tiny run end to end ------------------------------------------------------------------
def test_a_tiny_run_and_a_recovery_end_to_end(tmp_path):
    code = ck.main(['--events=5000', '--state_mb=1', '--periods=0,0.5',
                    '--modes=non_blocking', '--store=file', '--repeats=1',
                    '--recovery_period_s=0.5', '--fail_at=0.6', '--target_latency_ms=300',
                    f'--out={tmp_path}'])
    data = json.loads((tmp_path / 'runs.json').read_text())
    off, on, recovery = data['runs']
    assert code == 0, [(r['verdict'], r['log_problems']) for r in data['runs']]
    assert (off['config'], on['config'], recovery['config']) == (
        '1mb-off', '1mb-0.5s-non_blocking-file', 'recovery-1mb-0.5s-non_blocking-file')
    for run in (off, on, recovery):
        assert run['verdict'].startswith('yes') and run['state_held_mb'] == 1.0
        assert run['keyed_states_max'] >= cp.STATE_KEYS and run['state_written_mb'] >= 1
        assert run['driver_peak_rss_mb'] > 0 and run['epochs']
    assert off['checkpoints'] == 0 and off['events_per_s'] != ''
    figures = recovery['recovery_figures']
    assert recovery['failed_at'] and figures['resets'] == 1
    assert all(figures[key] != '' for key in cr.PARTS)
    assert data['summary'][1]['ratio_to_off'] != '' and data['recovery'][0]['total_s'] != ''
    report = (tmp_path / 'report.md').read_text()
    assert '## Recovery' in report and '## Goals' in report
    for name in ('checkpoints.png', 'logs/recovery-1mb-0.5s-non_blocking-file-r1.log'):
        assert os.path.getsize(tmp_path / name) > 0
