"""The churning-keys workload: its reference output, and one real run equal to it."""

from __future__ import annotations

import collections
import itertools

import pytest

from benchmarks import churning_keys


def test_each_window_has_its_own_keys_and_every_event_is_counted():
    lines = churning_keys.expected_lines(20_000)
    rows = [tuple(int(x) for x in line.split('\t')) for line in lines]
    assert sum(count for _, _, count in rows) == 20_000
    windows = collections.defaultdict(set)
    for key, start, _ in rows:
        windows[start].add(key)
    assert len(windows) == 4
    assert all(len(keys) == churning_keys.KEYS_PER_WINDOW for keys in windows.values())
    firsts = sorted(windows)
    assert all(windows[a].isdisjoint(windows[b]) for a, b in itertools.pairwise(firsts))


@pytest.mark.parametrize('case', churning_keys.CASES)
def test_a_run_on_the_runner_equals_the_reference(spark_session, spark_args, case):
    """The counting cases give every key's count, the floors count every event at their
    end; the run reports how its partitions loaded their state (the source floor has
    none) and its Python workers' memory."""
    figures = churning_keys.run_one(6_000, spark_args, case)
    assert figures['verdict'] == 'yes', figures
    floor = case in churning_keys.FLOOR_CASES
    assert figures['lines'] == (0 if floor else len(churning_keys.expected_lines(6_000)))
    assert (figures['state_loads'].get('initial', 0) > 0) == (case != 'source'), figures
    assert set(figures['state_load_ms']) == set(figures['state_loads'])
    assert figures['pss_mb_end'] == '' or figures['pss_mb_end'] > 0


def test_a_floor_that_loses_events_fails():
    class Counted:
        def __init__(self, committed):
            self.committed = committed

    class Result:
        def __init__(self, *committed):
            self._counters = [Counted(c) for c in committed]

        def metrics(self):
            return self

        def query(self, _):
            return {'counters': self._counters}

    assert churning_keys.reached_verdict(Result(400, 600), 1000) == 'yes'
    assert churning_keys.reached_verdict(Result(999), 1000).startswith('failed: 999 of 1000')
    assert churning_keys.reached_verdict(Result(), 1000).startswith('failed: 0 of 1000')


def test_the_steady_rate_leaves_out_the_ramp_up():
    points = [(100.0, 10), (101.0, 20), (102.0, 60), (104.0, 100)]
    assert churning_keys.steady_rate(points, 100) == 27  # 80 events in 3 s, from event 20
    assert churning_keys.steady_rate(points[:2], 100) == ''  # it starts at the last epoch
    assert churning_keys.steady_rate([(100.0, 100)], 100) == ''
