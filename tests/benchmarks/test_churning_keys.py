"""The churning-keys workload: its reference output, and one real run equal to it."""

from __future__ import annotations

import collections
import itertools

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


def test_a_run_on_the_runner_equals_the_reference(spark_session, spark_args):
    figures = churning_keys.run_one(6_000, spark_args)
    assert figures['verdict'] == 'yes', figures
    assert figures['lines'] == len(churning_keys.expected_lines(6_000))
