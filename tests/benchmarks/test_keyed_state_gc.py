"""The keyed-state GC benchmark: state stays small with GC, keeps every key without.

A tiny synthetic run (12,000 events, 20 one-second windows, one event per key) with GC
on and with `--no_keyed_state_gc`, in this process on the shared Spark session. Timings
and memory are never asserted: only the runner's keyed-state gauges at the end (all
events read, the watermark held just before the last event) and the report files.
"""

from __future__ import annotations

import csv
import os

from benchmarks import keyed_state_gc

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
