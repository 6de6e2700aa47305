"""What a job does with checkpoints it cannot use, and a failure it cannot get past.

Design section 12. A job that fails keeps its checkpoints (and the runner's journal
remembers the newest sequence id it committed), so that the same command resumes
it. These runs check the cases where it must not:

* F6: a fault that comes back after every reset ends the run with
  `RegionResetError` after --max_consecutive_reset_attempts, naming every cause;
* F9: a store wiped between a failure (a failed run, or a SIGKILLed driver) and
  the next run is detected: the run fails with a `CheckpointStateError` saying so,
  before it publishes anything;
* a different pipeline under the same --job_name is refused with an error naming
  the steps that differ, and --restart_from_scratch runs it from its sources.

In every case the sink holds only golden lines, each once (what the cuts covered),
and a refused run changes nothing in it.
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid

import pytest

from beam_streams_runner.regions.commit_records import CheckpointStateError
from beam_streams_runner.regions.controller import RegionResetError
from tests.faults import harness, judging

WIPE_DB = 4  # the session's redis-server: the store a test flushes


def failing_run(fault_run, pipeline, sink, store, mode, attempts, store_url=None,
                job=None, resets=1, at=350, start=None):
    """A run whose DoFn at the source raises at element `at` until it ends in
    `RegionResetError` after `resets` resets (the job keeps its checkpoints)."""
    run = fault_run(pipeline, sink, store, mode, fault=('raise', 'source', at, 10_000),
                    store_url=store_url, job=job, start=start,
                    extra=[f'--max_consecutive_reset_attempts={resets}'])
    with pytest.raises(RegionResetError) as info:
        run.run()
    assert run.spec.fault.done() == (resets + 1) * attempts
    run.check_subset()
    return run, str(info.value)


def without_fault(run):
    """The same pipeline (its fault step still there) whose fault never fires again."""
    fault = dataclasses.replace(run.spec.fault, times=0)
    return dataclasses.replace(run, spec=dataclasses.replace(run.spec, fault=fault))


@pytest.mark.parametrize('pipeline, sink, store, mode', [
    ('combine', 'files', 'file', 'blocking'),
    ('stateful', 'redis', 'redis', 'non_blocking'),
])
def test_a_failure_that_keeps_coming_back_ends_with_the_region_error(
        pipeline, sink, store, mode, fault_run, attempts):
    """F6: a DoFn at the source raises at every attempt of the same element; after
    --max_consecutive_reset_attempts=2 resets the run fails with `RegionResetError`
    naming the region, the 3 attempts, their causes and how to resume; what the sink
    published before holds only golden lines, each once."""
    _, message = failing_run(fault_run, pipeline, sink, store, mode, attempts, resets=2)
    assert "Consistent region 'default' failed 3 times in a row" in message
    assert 'attempt 3:' in message and 'injected fault' in message
    assert '--max_consecutive_reset_attempts=2' in message
    assert 'run the same command again' in message


@pytest.mark.parametrize('store', ['file', 'redis'])
def test_a_wiped_store_is_detected_after_a_failed_run(store, fault_run, attempts,
                                                      redis_server):
    """F9: a run fails (F6) after some cuts; its checkpoint store is then wiped (the
    directory deleted, or FLUSHDB). The same job started again fails at once with the
    `CheckpointStateError` that says the store was wiped, and publishes nothing."""
    store_url = redis_server.url_of(WIPE_DB) if store == 'redis' else None
    # The stream starts 3 s from now and fails at its last second's element: a slow
    # machine's first epoch (which reads all that is due) cannot reach the fault, and
    # windows are published before it.
    run, _ = failing_run(fault_run, 'combine', 'files', store, 'blocking', attempts,
                         store_url=store_url, at=590,
                         start=harness.stream_start(lag_s=-3))
    before = run.output()
    assert before.lines, 'nothing was published before the failure: no cut to lose'
    if store == 'redis':
        client = redis_server.client(db=WIPE_DB)
        try:
            client.flushdb()
        finally:
            client.close()
    else:
        shutil.rmtree(run.store)
    again = without_fault(run)
    with pytest.raises(CheckpointStateError) as info:
        again.run()
    message = str(info.value)
    assert 'the store was wiped' in message and run.job in message, message
    assert '--restart_from_scratch' in message
    assert run.output() == before


def test_a_wiped_store_is_detected_after_a_driver_kill(tmp_path):
    """F9 (driver): the driver is SIGKILLed right after its third commit record; the
    store's directory is deleted; the same command fails with the `CheckpointStateError`
    that says the store was wiped, and the output stays what it was after the kill
    (golden lines only, each once)."""
    job = f'wiped-{uuid.uuid4().hex[:8]}'
    spec = harness.Spec('stateful', 'files', str(tmp_path / 'out' / 'out'), 0)
    spec_file = harness.write_spec(spec, str(tmp_path / 'spec.json'))
    flags = harness.runner_flags(job, str(tmp_path / 'store'))
    first = harness.run_subprocess(spec_file, flags, kill_at='after_commit_record:3')
    assert first.returncode < 0, first.stderr[-4000:]
    spec = harness.read_spec(spec_file)
    judging.check_subset(spec)
    before = judging.read_files(spec)
    shutil.rmtree(tmp_path / 'store')
    second = harness.run_subprocess(spec_file, flags)
    assert second.returncode != 0
    assert 'CheckpointStateError' in second.stderr
    assert 'the store was wiped' in second.stderr, second.stderr[-4000:]
    assert judging.read_files(spec) == before


@pytest.mark.parametrize('store', ['file', 'redis'])
def test_a_changed_pipeline_is_refused_and_restart_from_scratch_runs_it(
        store, fault_run, attempts):
    """The combine pipeline fails (F6) and keeps its checkpoints; the stateful pipeline
    started with the same --job_name and store is refused with a `CheckpointStateError`
    naming the steps that are gone and new; with --restart_from_scratch it runs from its
    sources and its output equals its golden output."""
    first, _ = failing_run(fault_run, 'combine', 'files', store, 'blocking', attempts)
    changed = fault_run('stateful', 'files', store, 'blocking', store_url=first.store,
                        job=first.job)
    with pytest.raises(CheckpointStateError) as info:
        changed.run()
    message = str(info.value)
    assert 'was checkpointed by another pipeline' in message, message
    assert 'Count/' in message and 'are gone or changed' in message, message
    assert 'CountInState' in message and 'are new or changed' in message, message
    assert not changed.output().lines
    scratch = fault_run('stateful', 'files', store, 'blocking', store_url=first.store,
                        job=first.job, extra=['--restart_from_scratch'])
    scratch.run()
    scratch.check_exact()
