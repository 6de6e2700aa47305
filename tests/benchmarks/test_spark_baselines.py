"""The native PySpark baselines (`benchmarks/nexmark/spark_baselines.py`).

Each baseline's canonical output lines equal those of Beam's own query on the
DirectRunner (run in this process with the launcher's `run_query`), element, window and
timestamp. The baselines run on the test session's SparkSession. Q2 needs ~10,000 events
to select any bid (auction % 123 == 0) and Q3 ~30,000 for a seller to reach its 30-element
pane; the others run at 2,000.
"""

from __future__ import annotations

import itertools

import pytest

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.runs import run_query
from benchmarks.nexmark.spark_baselines import (
    BASELINE_QUERIES,
    position_ranges,
    run_baseline,
)
from benchmarks.nexmark.verdicts import compare_outputs

EVENTS = {0: 1000, 1: 2000, 2: 10000, 3: 30000, 5: 2000, 7: 2000}


@pytest.mark.parametrize('query', BASELINE_QUERIES)
def test_baseline_equals_beam_on_direct_runner(query, spark_session):
    config = NexmarkConfig(num_events=EVENTS[query])
    reference = run_query(query, 'DirectRunner', config)
    assert reference.ok, reference.error
    assert reference.lines, 'the reference output must not be empty'
    lines = run_baseline(query, config, spark_session)
    comparison = compare_outputs(lines, reference.lines)
    assert comparison.equal, comparison.summary()


def test_position_ranges_cover_all_events():
    config = NexmarkConfig(num_events=1001)
    ranges = position_ranges(config, 8)
    assert ranges[0][0] == 0 and ranges[-1][1] == config.max_events
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert position_ranges(NexmarkConfig(num_events=3), 8) == [(0, 1), (1, 2), (2, 3)]


def test_unknown_query_is_rejected(spark_session):
    with pytest.raises(ValueError, match='no native Spark baseline'):
        run_baseline(4, NexmarkConfig(num_events=10), spark_session)


def test_wrong_output_is_detected(spark_session):
    config = NexmarkConfig(num_events=2000)
    lines = run_baseline(7, config, spark_session)
    reference = run_query(7, 'DirectRunner', config)
    assert not compare_outputs(lines[1:], reference.lines).equal
