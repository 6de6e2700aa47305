"""The checkpoint overhead benchmark: its reference output, its plan, what it reads from the
runner's logs, its verdicts and exit code, and one tiny run end to end.

Timings are never asserted. The end-to-end test runs 20,000 events with checkpoints off
and every 1 s on a redis-server the benchmark starts (two child processes, each with its
own JVM); the verdict logic runs on made-up child results, without Spark.
"""

from __future__ import annotations

import json
import os
import re
import socket

import pytest
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from beam_streams_runner.driver.progress import summary
from benchmarks import checkpoint_overhead as co
from benchmarks import wordcount

START_US = int(co.START * 1_000_000)
WINDOW_US = co.WINDOW_S * 1_000_000


def test_the_generator_emits_exactly_the_events_asked_for():
    for events in (1, 7, 999, 10_000, 123_457, 1_000_000):
        assert co.generated_events(events) == events
    for n in (0, 1, 9_999, 10_000, 123_456):
        assert co.event_index(co.START + co.INTERVAL_S * n) == n


def test_reference_counts_every_key_of_every_window():
    # 25,000 events: windows [0, 10 s), [10 s, 20 s) with 10 events per key, and
    # [20 s, 25 s) with 5; each (window, key) once from each branch.
    lines = co.expected_lines(25_000)
    assert lines == sorted(lines) and len(lines) == 2 * 3 * co.KEYS
    second = START_US + WINDOW_US
    assert co.sum_line(7, START_US, 10) in lines
    assert co.bag_line(7, second, 10, 10, sum(7 + 1000 * j for j in range(10, 20))) in lines
    assert co.sum_line(999, START_US + 2 * WINDOW_US, 5) in lines
    # Event 10,000 is the first of the second window, as its Timestamp says.
    assert Timestamp.of(co.START + co.INTERVAL_S * 10_000).micros == second
    # The sink's line of an output is the reference's line of it.
    w = window.IntervalWindow(Timestamp(micros=second), Timestamp(micros=second + WINDOW_US))
    assert co.output_lines(('sum', 3, (10,)), w, w.max_timestamp()) == [
        co.sum_line(3, second, 10)]


def test_configurations_interleave_across_repeats():
    configs = co.configurations([0, 1, 8], ['file', 'redis'])
    assert [c.name for c in configs] == ['period-0-off', 'period-1-file', 'period-1-redis',
                                         'period-8-file', 'period-8-redis']
    plan = co.plan_runs(configs, 2)
    assert [(c.name, r) for c, r in plan] == [(c.name, 1) for c in configs] + [
        (c.name, 2) for c in configs]


def _epoch_line(time: str, epoch: int, read: int) -> str:
    record = {'epoch': epoch, 'duration_ms': 900, 'read_ms': 250,
              'sources': {'Events': {'elements': read, 'input_rate_per_s': 1.0}},
              'sinks': {'Write': {'elements': 10}},
              'watermark': {'input_watermark': None}, 'keyed_states': 2000, 'timers': 2000,
              'state_bytes_written': 123}
    return f'{time} INFO beam_streams_runner.runner: StreamsSparkRunner: {summary(record)}'


def _checkpoint_line(time: str, sequence: int, epoch: int) -> str:
    # The controller's own format string.
    message = 'Consistent region %r: checkpoint %d after epoch %d is consistent' % (
        'default', sequence, epoch)
    return f'{time} INFO beam_streams_runner.regions.controller: {message}'


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


def test_checkpoints_epochs_and_problems_are_read_from_the_log():
    assert co.checkpoints_in(LOG) == [('default', 1, 0), ('default', 2, 1)]
    assert [read for _, read in co.epochs_in(LOG)] == [1000, 2000, 6000, 10000]
    # Steady from the first epoch with 20% of 10,000 events read (epoch 1, at 2 s):
    # 8,000 more events in 2.5 s.
    assert co.steady_rate(LOG, 10_000) == 3200
    assert co.steady_rate('', 10_000) == ''
    assert co.problems_in(LOG) == [LOG.splitlines()[-1]]


def test_verdict_needs_the_exact_output_and_fitting_checkpoints():
    expected = co.expected_lines(2000)
    done = {'ok': True, 'state': 'PipelineState.DONE', 'wall_s': 5.0}
    on, off = co.Config(1.0, 'file'), co.Config(0.0, co.OFF)
    assert co.run_verdict(done, list(reversed(expected)), expected, on, 3) == 'yes'
    assert co.run_verdict(done, expected, expected, off, 0) == 'yes'
    wrong = [*expected[:-1], expected[-1].rsplit('\t', 1)[0] + '\t3']
    assert expected[-1].endswith('\t2') and wrong != expected
    assert co.run_verdict(done, wrong, expected, on, 3).startswith('failed: expected 2000')
    assert co.run_verdict(done, expected[1:], expected, on, 3).startswith('failed')
    assert co.run_verdict(done, [], expected, on, 3).endswith('(empty output)')
    assert co.run_verdict(done, expected, expected, on, 0) == (
        'failed: no checkpoint in 5.0 s')
    assert co.run_verdict(done, expected, expected, co.Config(8.0, 'file'), 0) == 'yes'
    assert co.run_verdict(done, expected, expected, off, 2).startswith('failed: 2 checkpoints')
    assert co.run_verdict({'ok': False, 'error': 'RuntimeError: boom'}, expected, expected,
                          on, 3) == 'failed: the run ended RuntimeError: boom'
    assert co.run_verdict(None, expected, expected, on, 3) == 'failed: the run left no result'


def _fake_launch(wrong_in: str):
    """A `launch` without Spark: the reference output (one count off in `wrong_in`
    configurations), two epochs and checkpoints if on."""
    def launch(config, repeat, events, store_url, runner_args, work, logs):
        assert (store_url is None) == (config.store == co.OFF)
        lines = co.expected_lines(events)
        if config.name == wrong_in:
            lines[0] = lines[0][:-1] + str(int(lines[0][-1]) + 1)
        log = '\n'.join([_epoch_line('2026-11-25 00:00:01,000', 0, events // 2),
                         _epoch_line('2026-11-25 00:00:02,000', 1, events // 2)]
                        + ([_checkpoint_line('2026-11-25 00:00:02,001', 1, 0)]
                           if config.period_s else []))
        wall = 2.0 if config.period_s else 1.6
        child = {'ok': True, 'state': 'PipelineState.DONE', 'wall_s': wall, 'cpu_s': 3.0,
                 'epochs': 2, 'driver_peak_rss_mb': 170.0, 'jvm_peak_rss_mb': 400.0}
        return co.Launched(child, log, lines, 0, wall + 10, f'logs/{config.name}.log')
    return launch


@pytest.mark.parametrize('wrong_in', [None, 'period-1-file'])
def test_a_wrong_output_fails_the_command(tmp_path, monkeypatch, wrong_in):
    monkeypatch.setattr(co, 'launch', _fake_launch(wrong_in))
    monkeypatch.setattr(wordcount, 'session_cores', lambda: 2.0)
    code = co.main(['--events=2000', '--periods=0,1', '--store=file', '--repeats=2',
                    f'--out={tmp_path}'])
    data = json.loads((tmp_path / 'runs.json').read_text())
    off, on = data['summary']
    assert off['events_per_s'] == 1250 and off['ratio_to_off'] == 1.0
    assert [r['config'] for r in data['runs']] == ['period-0-off', 'period-1-file'] * 2
    report = (tmp_path / 'report.md').read_text()
    assert os.path.getsize(tmp_path / 'overhead.png') > 0
    assert '| checkpoints | store | median events/s | ratio to off |' in report
    assert 'redis-server' in report and 'Python' in report and '--repeats=2' in report
    if wrong_in is None:
        assert code == 0
        assert (on['events_per_s'], on['ratio_to_off'], on['verdict']) == (1000, 0.8, 'yes')
        assert on['checkpoints_taken'] == '1 / 1'
    else:
        assert code == 1
        assert on['events_per_s'] == '' and on['ratio_to_off'] == ''
        assert on['verdict'] == '; '.join(
            f'r{r}: failed: expected 2000, got 2000 (1 missing, 1 unexpected)' for r in (1, 2))
        assert all(r['events_per_s'] == '' for r in data['runs'] if r['config'] == wrong_in)
        assert '| every 1 s | file | - | - |' in report


def test_a_tiny_run_off_and_on_redis_end_to_end(tmp_path):
    from beam_streams_runner.stores.redis_server import (
        RedisServerNotFoundError,
        redis_server_binary,
    )
    try:
        redis_server_binary()
    except RedisServerNotFoundError:
        pytest.skip('no redis-server')
    code = co.main(['--events=20000', '--repeats=1', '--periods=0,1', '--store=redis',
                    f'--out={tmp_path}'])
    data = json.loads((tmp_path / 'runs.json').read_text())
    off, on = data['runs']
    assert code == 0, [(r['verdict'], r['log_problems']) for r in data['runs']]
    assert (off['config'], on['config']) == ('period-0-off', 'period-1-redis')
    for run in (off, on):
        assert run['verdict'] == 'yes' and run['events_per_s'] != ''
        assert run['output_lines'] == run['expected_lines'] == 2 * 2 * co.KEYS
        assert run['driver_peak_rss_mb'] > 0 and run['epochs']
    assert off['checkpoints'] == 0 and on['checkpoints'] >= 1
    assert data['summary'][1]['ratio_to_off'] != ''
    for name in ('report.md', 'overhead.png', 'logs/period-1-redis-r1.log'):
        assert os.path.getsize(tmp_path / name) > 0
    log = (tmp_path / 'logs/period-1-redis-r1.log').read_text()
    port = int(re.search(r'go to redis://127\.0\.0\.1:(\d+)/0', log).group(1))
    # The benchmark stopped its redis-server.
    with pytest.raises(OSError), socket.create_connection(('127.0.0.1', port), timeout=2):
        pass
