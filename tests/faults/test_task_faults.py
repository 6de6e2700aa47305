"""Faults of one task: a sink that crashes mid-write (F11), an epoch that outlives the
drain timeout (F12), and a task attempt whose write lands after the next attempt's
(F10, a zombie).

Design section 12 ("Fencing", "Sinks publish after the cut"). In each case the
region resets or Spark runs the task again, and the sinks must end with exactly the
golden output: a half-done publish is done again (renames and fenced writes are
idempotent), a cancelled epoch is replayed, and a revision written by an attempt
the driver did not take is never read, even when it is written last.
"""

from __future__ import annotations

import glob
import uuid

import pytest

from tests.faults import harness, judging

DRAIN_TIMEOUT_S = 4


@pytest.mark.parametrize('sink, store', [('redis', 'file'), ('files', 'redis')])
def test_a_sink_crashing_mid_write_publishes_exactly_the_golden_output(sink, store,
                                                                       fault_run):
    """F11: the Python worker SIGKILLs itself between two halves of WriteToRedis' writes
    of a bundle holding window 3's lines, or inside WriteToFiles' publishing step while
    it names window 3's file (before its renames); the publish runs again."""
    run = fault_run('combine', sink, store, 'blocking', fault=('kill_worker', 'publish', 350, 1))
    run.run()
    assert run.spec.fault.done() == 1
    run.check_exact()


def test_an_epoch_past_the_drain_timeout_is_replayed_exactly(fault_run, caplog):
    """F12: a DoFn after the shuffle sleeps 12 s once, past --drain_timeout_s=4: the
    epoch is cancelled, the region resets and replays, and the output is exact."""
    caplog.set_level('WARNING', logger='beam_streams_runner.regions.controller')
    run = fault_run('stateful', 'files', 'file', 'non_blocking',
                    fault=('sleep', 'keyed', 350, 1),
                    extra=[f'--drain_timeout_s={DRAIN_TIMEOUT_S}'])
    run.run()
    assert run.spec.fault.done() == 1
    assert any('exceeded --drain_timeout_s' in r.getMessage() for r in caplog.records)
    run.check_exact()


@pytest.mark.parametrize('store', ['file', 'redis'])
def test_a_late_write_from_an_old_attempt_is_fenced(store, tmp_path, redis_server):
    """F10: every task of epoch 2 that writes state forks a zombie and dies before
    reporting; Spark runs the tasks again; once a task's next attempt has written, its
    zombie writes the dead attempt's deltas, emptied (`fault_points.late_write`). Only
    the second attempts' revisions are read: the output is exact (a read of a zombie's
    revision loses results). Epoch 2: every run has it."""
    job = f'zombie-{uuid.uuid4().hex[:8]}'
    spec = harness.Spec('stateful', 'files', str(tmp_path / 'out' / 'out'), 0)
    spec_file = harness.write_spec(spec, str(tmp_path / 'spec.json'))
    store_url = redis_server.url_of(2) if store == 'redis' else str(tmp_path / 'store')
    run = harness.run_subprocess(spec_file, harness.runner_flags(job, store_url),
                                 late_write=f'2:30:{tmp_path / "zombie"}')
    assert run.returncode == 0, run.stderr[-4000:]
    zombies = [open(path).read() for path in glob.glob(str(tmp_path / 'zombie.*'))]
    assert zombies and all(' wrote ' in text for text in zombies), zombies
    judging.check_exact(harness.read_spec(spec_file))
