"""The harness methods `beam_speedups` swaps in compute what Beam's own do."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.runners import sdf_utils
from apache_beam.transforms import window
from apache_beam.utils import windowed_value
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.worker import beam_speedups


@pytest.fixture
def installed():
    beam_speedups.install()
    yield
    beam_speedups.install()  # the workers' state: the runtime installs them at import


def test_the_worker_runtime_installs_them():
    """In a fresh interpreter, as a Python worker imports the harness: this test process
    may have installed them already."""
    probe = ('import beam_streams_runner.worker.runtime\n'
             'from apache_beam.runners import sdf_utils\n'
             'from apache_beam.transforms import window\n'
             'from apache_beam.utils import windowed_value\n'
             'print(window.GlobalWindows.assign.__module__,'
             ' sdf_utils.ThreadsafeWatermarkEstimator.__getattr__.__module__,'
             ' type(windowed_value.MAX_TIMESTAMP).__module__)')
    done = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == [beam_speedups.__name__] * 3


def test_assign_gives_the_global_window_as_beam_does(installed):
    context = window.WindowFn.AssignContext(Timestamp(5), 'x')
    fast = window.GlobalWindows().assign(context)
    assert fast is not window.GlobalWindows().assign(context)  # a list of its own each time
    beam_speedups.uninstall()
    beams = window.GlobalWindows().assign(context)
    assert fast == beams and type(fast) is type(beams) and len(fast) == 1
    assert fast[0] is beams[0]
    assert fast[0].max_timestamp() == beams[0].max_timestamp() < MAX_TIMESTAMP


class CountingLock:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_the_estimator_wrapper_still_locks_and_reaches_the_estimator(installed):
    wrapped = sdf_utils.ThreadsafeWatermarkEstimator(ManualWatermarkEstimator(None))
    wrapped._lock = CountingLock()
    for second in (1, 2, 3):
        wrapped.set_watermark(Timestamp(second))
        assert wrapped.current_watermark() == Timestamp(second)
    assert wrapped._lock.entered == 6
    assert 'set_watermark' in vars(wrapped)  # built once
    with pytest.raises(AttributeError):
        wrapped.no_such_method  # noqa: B018 - the lookup is what is tested
    assert 'no_such_method' not in vars(wrapped)


BOUNDS = st.one_of(st.integers(-2**63 + 1, 2**63 - 1), st.sampled_from(
    [MIN_TIMESTAMP.micros, MAX_TIMESTAMP.micros, MIN_TIMESTAMP.micros - 1,
     MAX_TIMESTAMP.micros + 1, 0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(BOUNDS, BOUNDS), min_size=2, max_size=2))
def test_interval_windows_hash_and_compare_as_beams(bounds):
    def observe():
        windows = [window.IntervalWindow(Timestamp(micros=start), Timestamp(micros=end))
                   for start, end in bounds]
        first, second = windows
        return (hash(first), hash(second), first == second, first != second,
                first < second, first.start, first.end, first.max_timestamp())
    beam_speedups.install()
    try:
        fast = observe()
        beam_speedups.uninstall()
        assert fast == observe()
    finally:
        beam_speedups.install()


def test_the_end_of_time_stays_a_timestamp_equal_to_beams(installed):
    for name, original in (('MIN_TIMESTAMP', MIN_TIMESTAMP), ('MAX_TIMESTAMP', MAX_TIMESTAMP)):
        fixed = getattr(windowed_value, name)
        assert fixed is not original and isinstance(fixed, Timestamp)
        assert fixed == original and hash(fixed) == hash(original)
        assert fixed.micros == original.micros and repr(fixed) == repr(original)
        assert fixed.precision() == original.precision()
