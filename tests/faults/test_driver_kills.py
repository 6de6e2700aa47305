"""A driver SIGKILLed mid-stream resumes when the same command runs again, and the
published output is exact (design section 12: "the driver itself may be the thing
that died").

Each test runs a pipeline of `harness.py` as a program of its own (its driver is
the process that dies), twice with the same command: the first run is killed, by
a DoFn that SIGKILLs the driver's pid at a given element (F3) or by the driver
itself at the n-th time it reaches a named point of the consistent-region protocol
(`BEAM_STREAMS_RUNNER_KILL_AT`, F4, `regions/fault_points.py`). After the kill, the
sink may hold only golden lines, each once; the second run (without the kill)
resumes from the newest consistent cut in the store and must end with exactly the
golden output.
"""

from __future__ import annotations

import json
import signal
import uuid

import pytest

from tests.faults import harness, judging
from tests.faults.fixtures import SINK_DB, STORE_DB
from tests.faults.harness import SecondRunFailed

ATTEMPTS = 4  # the runs' --spark_master=local[2,4]
KILLED = -signal.SIGKILL



@pytest.fixture
def driver_run(tmp_path, request):
    """`driver_run(pipeline, sink, store, mode, fault=None) -> (spec_file, flags, client)`:
    the spec file (its start set by the first run) and flags of a fresh job."""
    clients = []

    def make(pipeline, sink, store, mode, fault=None):
        job = f'driver-{uuid.uuid4().hex[:8]}'
        client = None
        if sink == 'redis' or store == 'redis':
            server = request.getfixturevalue('redis_server')
        if sink == 'redis':
            out = server.url_of(SINK_DB)
            client = server.client(db=SINK_DB)
            clients.append(client)
        else:
            out = str(tmp_path / 'out' / 'out')
        store_url = server.url_of(STORE_DB) if store == 'redis' else str(tmp_path / 'store')
        injected = None
        if fault is not None:
            kind, where, at, times = fault
            injected = harness.Fault(kind, str(tmp_path / 'fault'), at, where, times)
        spec = harness.Spec(pipeline, sink, out, 0, key_prefix=f'{job}:', fault=injected)
        spec_file = harness.write_spec(spec, str(tmp_path / 'spec.json'))
        return spec_file, harness.runner_flags(job, store_url, mode=mode), client

    yield make
    for client in clients:
        client.close()


def kill_and_resume(spec_file, flags, client, kill_at=None, point=None):
    """Runs the command (killed), checks what is published so far, runs it again;
    returns the spec (with its start)."""
    first = harness.run_subprocess(spec_file, flags, kill_at=kill_at)
    assert first.returncode == KILLED, (
        f'the driver was not killed (exit {first.returncode}):\n{first.stderr[-4000:]}')
    if point is not None:
        assert f'fault injection: killing the driver at {point}' in first.stderr
    assert 'is consistent' in first.stderr, (
        'the driver was killed before its first consistent cut: there is nothing to resume')
    spec = harness.read_spec(spec_file)
    judging.check_subset(spec, client)
    second = harness.run_subprocess(spec_file, flags)
    if second.returncode != 0:
        raise SecondRunFailed(
            f'the second run failed (exit {second.returncode}):\n{second.stderr[-6000:]}')
    assert 'resumes from its checkpoints' in second.stderr, second.stderr[-4000:]
    judging.check_exact(spec, client)
    return spec


# The CI subset: one cell for each place a DoFn kills the driver, each sink kind and
# store once; every pipeline, sink and place is in `python -m benchmarks.faults`.
@pytest.mark.parametrize('case', [
    ('combine', 'files', 'source', 400, 'blocking', 'file'),
    ('stateful', 'redis', 'keyed', 450, 'non_blocking', 'redis'),
    ('combine', 'text', 'published', 350, 'blocking', 'file'),
], ids=lambda case: '-'.join(map(str, case)))
def test_a_driver_killed_by_a_dofn_mid_epoch(case, driver_run):
    """F3: a DoFn SIGKILLs the driver (its pid) while an epoch runs, once (a marker file
    remembers it): at a source element, at an aggregate, or right after the file sink
    published a window (in the epoch that published it, before a cut covers it). The
    same command run again resumes from the newest cut and the output equals the
    golden output."""
    pipeline, sink, where, at, mode, store = case
    spec_file, flags, client = driver_run(pipeline, sink, store, mode,
                                          fault=('kill_driver', where, at, 1))
    spec = kill_and_resume(spec_file, flags, client)
    assert spec.fault.done() == 1


# The CI subset: each protocol point once; every pipeline, sink, mode and store at each
# point is in `python -m benchmarks.faults --faults=F4`.
@pytest.mark.parametrize('kill_at, case', [
    ('after_epoch_deltas:4', ('stateful', 'redis', 'non_blocking', 'redis')),
    ('before_commit_record:2', ('stateful', 'files', 'blocking', 'redis')),
    ('during_non_blocking_write:2', ('combine', 'redis', 'non_blocking', 'file')),
    ('after_commit_record:3', ('combine', 'text', 'blocking', 'redis')),
], ids=lambda value: value if isinstance(value, str) else '-'.join(value))
def test_a_driver_killed_at_a_protocol_point(kill_at, case, driver_run):
    """F4: the driver SIGKILLs itself the n-th time it reaches a point of the protocol
    (`kill_at` = point:n, a few cuts into the stream): after an epoch's deltas before
    its cut, before a cut's commit record, in the background writer of a non-blocking
    cut, right after a commit record is durable. The same command run again (without
    the kill) resumes and the output equals the golden output."""
    pipeline, sink, mode, store = case
    spec_file, flags, client = driver_run(pipeline, sink, store, mode)
    kill_and_resume(spec_file, flags, client, kill_at=kill_at,
                    point=kill_at.partition(':')[0])


@pytest.mark.parametrize('case', [
    ('stateful', 'redis', 'non_blocking', 'redis'),
], ids=lambda case: '-'.join(case))
def test_a_driver_killed_in_the_middle_of_a_reset(case, driver_run):
    """F4 + F2: a DoFn at the source raises through a whole epoch (every task retry),
    so the region resets; the driver SIGKILLs itself in the middle of that reset (some
    members reset, the others not yet: `during_reset:3`, as the resume at start
    reaches the point twice). The same command run again resumes and the output
    equals the golden output."""
    pipeline, sink, mode, store = case
    spec_file, flags, client = driver_run(pipeline, sink, store, mode,
                                          fault=('raise', 'source', 350, ATTEMPTS))
    spec = kill_and_resume(spec_file, flags, client, kill_at='during_reset:3',
                           point='during_reset')
    assert spec.fault.done() == ATTEMPTS, 'the reset was not caused by the fault'


PROCESSES = 6


def test_every_driver_process_plans_the_same_stages():
    """What a restarted driver depends on: a new driver process (its own string hashes
    and object addresses, as every plain run of the same command has) must plan the
    same stages under the same names, since the stored graph, the partitions' keyed
    state and revisions and the sources' positions are keyed by them. The four
    file-sink pipelines are planned in PROCESSES fresh interpreters (two at a time) and
    must come out the same.

    Beam's own fused stage names and the order of independent stages do differ between
    processes (measured: combine+WriteToFiles two names for one stage, 3:5 in 8
    processes; the WriteToText pipelines two stage orders, 3:5 and 1:7), which is why
    the runner names stages after their transforms (`plan.stable_stage_name`). The
    chance that the four would come out the same in 6 processes by luck, if they still
    differed as measured, is below 0.1%."""
    specs = [harness.Spec(pipeline, sink, '/nonexistent/out', 1_000_000_000)
             for pipeline in ('combine', 'stateful') for sink in ('files', 'text')]
    plans = []
    for _ in range(PROCESSES // 2):
        running = [harness.plans_in_a_new_process(specs) for _ in range(2)]
        for process in running:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err[-3000:]
            plans.append(json.loads(out.strip().splitlines()[-1]))
    for index, spec in enumerate(specs):
        seen = {json.dumps(plan[index]) for plan in plans}
        if len(seen) > 1:
            first, second = (set(map(json.dumps, json.loads(plan))) for plan in sorted(seen)[:2])
            raise AssertionError(
                f'{spec.pipeline}+{spec.sink}: {len(seen)} different plans in {PROCESSES} '
                f'driver processes; e.g. {first ^ second}')
