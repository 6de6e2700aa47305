"""Faults of a cluster, as cells of the fault matrix (design section 12): a streaming
pipeline on the session's cluster, its checkpoints in a redis-server of the test's own,
and once its first cut is consistent, one of:

* `executor`: an executor SIGKILLed (its Python workers and live state with it);
  the master gives the application a new one;
* `worker`: a worker daemon SIGKILLed (its executors, shuffle files and local
  directories go with it), started again 2 s later;
* `master`: the master SIGKILLed and started again 2 s later
  (`spark.deploy.recoveryMode=FILESYSTEM`: it recovers its workers and applications);
* `redis`: the redis-server holding the checkpoints SIGKILLed while executors write to
  it, started again 1 s later (its AOF reloads).

Golden-run rule: the exactly-once file sink holds exactly the golden output. The CI
subset is one cell per fault; `BEAM_STREAMS_RUNNER_CLUSTER_FAULTS=all` in the
environment runs every fault on P2 (keyed count), P4 (timers) and P5 (streaming side
input).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid

import pytest

from beam_streams_runner.cluster import processes_under
from tests.faults import harness, judging
from tests.faults.injection import AfterFirstCut

ALL = [(fault, pipeline) for fault in ('executor', 'worker', 'master', 'redis')
       for pipeline in ('combine', 'stateful', 'side_input')]
CI = [('executor', 'combine'), ('worker', 'stateful'), ('master', 'side_input'),
      ('redis', 'combine')]
CELLS = ALL if os.environ.get('BEAM_STREAMS_RUNNER_CLUSTER_FAULTS') == 'all' else CI


def _executors(cluster) -> list[int]:
    pids = []
    for pid in processes_under(cluster.directory):
        with contextlib.suppress(OSError):
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                if b'CoarseGrainedExecutorBackend' in f.read():
                    pids.append(pid)
    return pids


def _fault_and_restore(kind: str, cluster, redis):
    """What the fault does, and what puts the cluster back as the next test expects it."""
    if kind == 'executor':
        def kill_executor():
            pids = _executors(cluster)
            assert pids, 'no executor to kill'
            os.kill(pids[0], signal.SIGKILL)
        return kill_executor, None
    if kind == 'worker':
        return (lambda: cluster.kill(cluster.workers[0]),
                lambda: (cluster.start_worker(0), cluster.wait_for_workers(2)))
    if kind == 'master':
        return (lambda: cluster.kill(cluster.master),
                lambda: (cluster.start_master(), cluster.wait_for_master(),
                         cluster.wait_for_workers(2)))
    return redis.kill, redis.start


@pytest.mark.parametrize('fault, pipeline', CELLS)
def test_cluster_fault_loses_and_duplicates_nothing(local_cluster, own_redis, tmp_path,
                                                    fault, pipeline):
    run_id = uuid.uuid4().hex[:8]
    job = f'cluster-{fault}-{run_id}'
    spec = harness.Spec(pipeline, 'files', str(tmp_path / 'out'), 0, span_s=12)
    spec_file = harness.write_spec(spec, str(tmp_path / 'spec.json'))
    flags = harness.runner_flags(job, own_redis.url_of(0), master=local_cluster.url)
    do, undo = _fault_and_restore(fault, local_cluster, own_redis)
    injected = AfterFirstCut(own_redis, job, do, undo, down_s=1 if fault == 'redis' else 2)
    injected.start()
    try:
        done = harness.run_subprocess(spec_file, flags, timeout=480)
    finally:
        injected.stop.set()
        injected.join(timeout=120)
    assert injected.error is None, injected.error
    assert injected.faulted_at is not None, 'the fault did not happen (no consistent cut)'
    assert done.returncode == 0, done.stderr[-3000:]
    judging.check_exact(harness.read_spec(spec_file), None)
    assert len(local_cluster.alive_workers()) == 2
    time.sleep(1)  # the finished application's executors exit
