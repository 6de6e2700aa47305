"""Consistent regions reset and replay: a fault in the middle of a streaming run
leaves its final output exact (design section 12).

The pipeline counts elements per key of a bounded-in-time `PeriodicImpulse` (past
timestamps, read over several epochs) in the global window, so its output is
written once, when the stream ends; a reset that lost state or replayed a source
twice shows as a wrong count. The fault is an exception in a DoFn that passes after
a reset (it fails as many times as Spark runs a failing task, at a given element,
remembered in marker files, so that the epoch fails once).
"""

from __future__ import annotations

import glob
import os
import time
import uuid

import apache_beam as beam
import pytest

from beam_streams_runner.regions.controller import RegionResetError
from tests.faults.counting import counts_pipeline, expected, output

ELEMENTS = 3000


class FailOnce(beam.DoFn):
    """Raises once at element `at` (the marker file remembers it), then passes."""

    def __init__(self, marker: str, at: int, times: int = 1) -> None:
        self.marker, self.at, self.times = marker, at, times

    def process(self, element):
        if element == self.at:
            done = len(glob.glob(self.marker + '.*'))
            if done < self.times:
                open(f'{self.marker}.{done}', 'w').close()
                raise RuntimeError(f'injected fault {done + 1} at element {element}')
        yield element


def run_counts(tmp_path, *flags: str, fail_at: int | None = None, fail_times: int = 1):
    step = (FailOnce(str(tmp_path / 'marker'), fail_at, fail_times)
            if fail_at is not None else None)
    counts_pipeline(tmp_path, [
        '--streaming', '--spark_master=local[2]', f'--job_name=faults-{uuid.uuid4().hex[:8]}',
        '--checkpoint_period_s=0.2', '--target_latency_ms=300', '--bundle_size=50', *flags],
        time.time() - 1000, ELEMENTS, 0.01, step).run().wait_until_finish()
    return output(tmp_path)


def test_a_transient_dofn_failure_resets_and_the_counts_are_exact(tmp_path, attempts):
    """F2 in the global window: the DoFn fails through one whole epoch (every attempt
    Spark makes of the task), the region resets, and the counts are exact."""
    assert run_counts(tmp_path, fail_at=2000, fail_times=attempts) == expected(ELEMENTS)
    assert os.path.exists(str(tmp_path / f'marker.{attempts - 1}'))


def test_a_failure_that_keeps_coming_back_ends_with_the_region_error(tmp_path, attempts):
    """F6: a DoFn that fails at every attempt ends the run after 2 resets with the
    region error naming the 3 failed attempts and the last cause."""
    with pytest.raises(RegionResetError) as info:
        run_counts(tmp_path, '--max_consecutive_reset_attempts=2', fail_at=1500,
                   fail_times=100)
    message = str(info.value)
    assert "region 'default'" in message and 'attempt 3' in message
    assert f'injected fault {3 * attempts} at element 1500' in message
