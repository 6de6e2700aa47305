"""Faults in Spark's Python workers mid-stream leave the published output exact.

Design sections 8, 11 and 12. Each run is one in-process streaming pipeline of
`harness.py` (a per-key count in 1-second windows over a `PeriodicImpulse` spanning
6 s of real time, by a combine or by a stateful DoFn) with consistent regions on
(a cut every 0.5 s), whose sink publishes only what a committed cut covers. One
fault is injected at a given place:

* `source`: at element `at` of the source, before the shuffle;
* `keyed`: at the aggregate of window `at // 100`, key 0, after the shuffle;
* `publish`: in WriteToFiles' publishing step, naming the final file of window
  `at // 100`, before its rename;
* `published`: on what the file sink outputs once it has published window
  `at // 100` (after the rename, in the stage after it or fused with it).

Whatever the fault, the sink must end with exactly the golden output (the lines
computed from the input's definition): every (window, key) once, with its exact
count and sum, one final file per window, no temporary file left in the output
directory.
"""

from __future__ import annotations

import logging

import pytest

# (pipeline, sink, where, at, checkpoint mode, checkpoint store)
PLACES = [
    ('combine', 'text', 'source', 250, 'blocking', 'file'),
    ('combine', 'files', 'keyed', 250, 'non_blocking', 'redis'),
    ('combine', 'redis', 'source', 350, 'non_blocking', 'file'),
    ('stateful', 'text', 'keyed', 350, 'non_blocking', 'file'),
    ('stateful', 'files', 'source', 250, 'blocking', 'redis'),
    ('stateful', 'redis', 'keyed', 250, 'blocking', 'redis'),
    ('combine', 'files', 'publish', 250, 'blocking', 'file'),
    ('combine', 'text', 'published', 250, 'non_blocking', 'redis'),
    ('stateful', 'files', 'published', 350, 'non_blocking', 'file'),
]
# The same places with the other mode and store.
FLIPPED = [(p, s, w, at, 'blocking' if m == 'non_blocking' else 'non_blocking',
            'file' if st == 'redis' else 'redis') for p, s, w, at, m, st in PLACES]


def ids(case) -> str:
    return '-'.join(str(part) for part in case)


@pytest.fixture
def resets(caplog):
    """The controller's reset lines logged so far (a callable)."""
    caplog.set_level(logging.WARNING, logger='beam_streams_runner.regions.controller')
    return lambda: [r.getMessage() for r in caplog.records
                    if r.name == 'beam_streams_runner.regions.controller'
                    and ': reset ' in r.getMessage()]


@pytest.mark.parametrize('case', PLACES, ids=ids)
def test_a_python_worker_sigkilled_once(case, fault_run, attempts, resets):
    """F1: the Python worker running the task at the fault's place SIGKILLs itself once
    (a marker file remembers it). Under local[2,4] Spark runs the task again (under a
    plain local[N] the epoch fails and the region resets instead); either way the
    sink's output must equal the golden output exactly."""
    pipeline, sink, where, at, mode, store = case
    run = fault_run(pipeline, sink, store, mode, fault=('kill_worker', where, at, 1))
    run.run()
    assert run.spec.fault.done() == 1, 'the fault never fired'
    run.check_exact()
    if attempts == 1:
        assert resets(), 'without task retries the lost worker must reset the region'


@pytest.mark.parametrize('case', FLIPPED, ids=ids)
def test_a_dofn_exception_that_exhausts_the_task_retries(case, fault_run, attempts,
                                                         resets):
    """F2: a DoFn raises at the fault's place as many times in a row as Spark runs a
    failing task (4 under local[2,4]), so the epoch fails and the consistent region
    resets to its last cut and replays; the replay passes. The region reset exactly
    once and the sink's output equals the golden output."""
    pipeline, sink, where, at, mode, store = case
    run = fault_run(pipeline, sink, store, mode, fault=('raise', where, at, attempts))
    run.run()
    assert run.spec.fault.done() == attempts, 'the fault never fired'
    assert len(resets()) == 1, resets()
    run.check_exact()


@pytest.mark.parametrize('case', [
    ('combine', 'text', 'keyed', 350, 'blocking', 'redis'),
    ('stateful', 'redis', 'source', 250, 'non_blocking', 'file'),
], ids=ids)
def test_a_dofn_exception_once_is_retried_by_spark(case, fault_run, attempts, resets):
    """F2 (retried task): a DoFn raises once. Under local[2,4] Spark runs the task again
    and no reset happens (its first attempt may have written state deltas and staged
    output: they must not count twice); under local[N] the region resets. Either
    way the output equals the golden output."""
    pipeline, sink, where, at, mode, store = case
    run = fault_run(pipeline, sink, store, mode, fault=('raise', where, at, 1))
    run.run()
    assert run.spec.fault.done() == 1, 'the fault never fired'
    assert len(resets()) == (0 if attempts > 1 else 1), resets()
    run.check_exact()


@pytest.mark.parametrize('case', [
    ('stateful', 'text', 'keyed', 250, 'non_blocking', 'file'),
    ('combine', 'files', 'source', 350, 'blocking', 'redis'),
], ids=ids)
def test_two_resets_in_a_row(case, fault_run, attempts, resets):
    """F2 (twice): the DoFn fails through two whole epochs in a row (twice the task
    retries), so the region resets twice to the same cut before the replay passes
    (within --max_consecutive_reset_attempts=5). The output equals the golden output."""
    pipeline, sink, where, at, mode, store = case
    run = fault_run(pipeline, sink, store, mode, fault=('raise', where, at, 2 * attempts))
    run.run()
    assert run.spec.fault.done() == 2 * attempts, 'the fault never fired'
    assert len(resets()) == 2 and 'reset 2 of 5' in resets()[1], resets()
    run.check_exact()
