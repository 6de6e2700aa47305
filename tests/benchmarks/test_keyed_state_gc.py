"""The keyed-state GC benchmark: state stays small with GC, keeps every key without.

A tiny synthetic run (12,000 events, 20 one-second windows, one event per key) with GC
on and with `--no_keyed_state_gc`, in this process on the shared Spark session. Timings
and memory are never asserted: only the runner's keyed-state gauges at the end (all
events read, the watermark held just before the last event), that the sink got every
output the closed windows imply, and the report files. The output check, the PSS
reader and the report's rule lines are tested on their own.
"""

from __future__ import annotations

import argparse
import csv
import os

from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from benchmarks import keyed_state_gc, sink_check
from benchmarks.nexmark.capture import output_line

EVENTS = 12_000
WINDOWS = 20


def _by_step(text: str) -> dict[str, int]:
    pairs = (item.rsplit('=', 1) for item in text.split(';') if item)
    return {step: int(count) for step, count in pairs}


def test_churn_keys_and_windows():
    churn = keyed_state_gc.Churn(events=100, windows=10, keys=40)
    assert churn.keys_per_window == 4
    assert [churn.window_of(i) for i in (0, 9, 10, 99)] == [0, 0, 1, 9]
    assert churn.timestamp(10).micros == 1_000_000
    assert len({churn.key(i) for i in range(100)}) == churn.distinct_keys() == 40
    # Keys never recur across windows.
    windows_of_key = {}
    for i in range(100):
        windows_of_key.setdefault(churn.key(i), set()).add(churn.window_of(i))
    assert all(len(ws) == 1 for ws in windows_of_key.values())
    assert keyed_state_gc.Churn(EVENTS, WINDOWS, EVENTS).distinct_keys() == EVENTS


def test_gc_keeps_keyed_state_small_and_no_gc_keeps_every_key(tmp_path, spark_session,
                                                              spark_args):
    rows = keyed_state_gc.main([
        f'--events={EVENTS}', f'--windows={WINDOWS}', '--parts=4',
        '--cases=synthetic', '--in_process', '--progress_s=5', f'--out={tmp_path}',
        *spark_args])
    on, off = rows
    assert (on['gc'], off['gc']) == ('on', 'off')
    for row in rows:
        assert row['status'] == 'ok', row
        # Every key of the 19 closed windows, once from each branch.
        assert row['output_ok'] == 'yes', row
        assert row['events'] == EVENTS
        assert row['distinct_keys'] == EVENTS
    # With GC: only the last window's keys are left (its end is never reached), in the
    # stateful DoFn and in the GroupByKey: 2 x 600 of 12,000 keys.
    on_steps = _by_step(on['keyed_states_end_by_step'])
    assert on['keyed_states_end'] <= EVENTS // 5, on
    assert on_steps.get('GroupByKey', 0) <= 2 * EVENTS // WINDOWS, on_steps
    # Without: the GroupByKey keeps every key it ever saw (the stateful DoFn clears its
    # own state in its timer).
    off_steps = _by_step(off['keyed_states_end_by_step'])
    assert off_steps['GroupByKey'] == EVENTS, off_steps
    assert off['keyed_states_end'] >= EVENTS
    for name in ('gc.md', 'gc.csv', 'gc.png'):
        assert os.path.getsize(tmp_path / name) > 0
    with open(tmp_path / 'gc.csv', newline='') as f:
        samples = list(csv.DictReader(f))
    assert {s['gc'] for s in samples} == {'on', 'off'}
    assert max(int(s['events']) for s in samples) == EVENTS
    report = (tmp_path / 'gc.md').read_text()
    assert '| synthetic | on |' in report and '| synthetic | off |' in report
    assert '| PSS ratio |' in report and 'judged on RSS' in report
    assert all(float(s['pss_mb']) > 0 for s in samples if int(s['workers']))


SMAPS_ROLLUP = """\
55d0c4a1b000-7ffd3e9f5000 ---p 00000000 00:00 0                          [rollup]
Rss:              123456 kB
Pss:               45678 kB
Pss_Dirty:         40000 kB
Pss_Anon:          39000 kB
Pss_File:           6678 kB
Pss_Shmem:             0 kB
Shared_Clean:      80000 kB
"""


def test_pss_reader_parses_smaps_rollup(tmp_path):
    path = tmp_path / 'smaps_rollup'
    path.write_text(SMAPS_ROLLUP)
    assert keyed_state_gc.proc_kb(str(path), 'Pss:') == 45678
    assert keyed_state_gc.proc_kb(str(path), 'Rss:') == 123456
    assert keyed_state_gc.proc_kb(str(tmp_path / 'gone'), 'Pss:') == 0


def test_synthetic_expected_output_of_the_closed_windows():
    # 100 events over 10 windows, 4 keys a window: the hold (just before the last
    # event, in window 9) closes windows 0-8, each with 10 events over 4 keys.
    churn = keyed_state_gc.Churn(events=100, windows=10, keys=40)
    expected = keyed_state_gc.synthetic_expected(churn)
    assert expected.count == 2 * 9 * 4
    base = keyed_state_gc.CHECKSUM_BASE
    assert expected.checksum % base == 2 * 90  # the counts: every event of windows 0-8
    assert expected.checksum // base == 2 * sum(16 * w + 6 for w in range(9))  # the keys
    known = argparse.Namespace(events=100, windows=10, keys=40, window_s=1.0)
    lost = sink_check.SinkOutput(sink_check.Tally(expected.count - 1, expected.checksum), [])
    assert keyed_state_gc.check_synthetic(known, lost) == (
        f'failed: expected {expected.count}, got {expected.count - 1}')
    assert keyed_state_gc.check_synthetic(known, sink_check.SinkOutput(expected, [])) == 'yes'


def test_closed_window_lines_keep_what_a_held_stream_fired():
    def line(start, end):
        w = window.IntervalWindow(Timestamp(start), Timestamp(end))
        return output_line({'n': start}, w, w.max_timestamp())

    lines = [line(0, 2), line(1, 3), line(2, 4)]
    assert keyed_state_gc.closed_window_lines(lines, Timestamp(3)) == lines[:2]
    glob = window.GlobalWindow()
    assert keyed_state_gc.closed_window_lines(
        [output_line(1, glob, glob.max_timestamp())], Timestamp(3)) == []


def _run(output_ok, pss_10x=130.0):
    samples = []
    for events, gauge_time, rss, pss in ((10, 1.0, 100.0, 100.0), (100, 2.0, 117.0, pss_10x)):
        samples.append({'events': events, 'wall': gauge_time, 'gauge_time': gauge_time,
                        'keyed_states': 5, 'timers': 1, 'rss_mb': rss, 'pss_mb': pss,
                        'pushed_back_elements': 0, 'pending_side_windows': 0,
                        'keyed_states_by_step': 'GroupByKey=5'})
    return {'case': 'synthetic', 'gc': 'on', 'samples': samples, 'status': 'ok',
            'output_ok': output_ok, 'distinct_keys': 100, 'wall_s': 1.0}


def test_rule_is_judged_on_rss_with_pss_beside_it():
    row = keyed_state_gc.summarize(_run('yes'), events=100)
    assert (row['rss_ratio'], row['pss_ratio'], row['rule']) == (1.17, 1.3, 'pass')
    (text,) = keyed_state_gc.rule_lines([row])
    assert 'RSS 10x/1x = 1.17 (judged: pass)' in text and 'PSS 10x/1x = 1.3' in text


def test_rule_is_not_judged_when_the_output_failed():
    row = keyed_state_gc.summarize(_run('failed: expected 72, got 0 (empty output)'), 100)
    assert row['rule'] == 'n/a'
    assert row['output_ok'].startswith('failed')
