"""A redis-server holding the checkpoints SIGKILLed mid-run and started again (F7), or
paused past the drain timeout (F8).

Design sections 8 and 12: the Redis checkpoint store is a fault domain of its own.
Each run checkpoints into a `RedisServer` of the test's own (AOF on, fsync before
every reply, so that what it acknowledged survives the kill). A thread
(`injection.StoreFault`) waits until the run has committed its first cut, SIGKILLs
the server, leaves it down for `down_s` seconds (the fault's length, not a wait for
anything) and starts it again on the same port and directory. A store failure is a
fault like any other: the epoch that hit it fails, the region resets (retrying the
store while it is down) and replays, and the run ends with exactly the golden output.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.injection import StoreFault

DRAIN_TIMEOUT_S = 4


@pytest.mark.parametrize('pipeline, sink, mode, action, down_s', [
    ('combine', 'text', 'blocking', 'kill', 0.0),
    ('stateful', 'redis', 'non_blocking', 'kill', 1.0),
    ('combine', 'files', 'non_blocking', 'kill', 3.0),
    ('stateful', 'files', 'blocking', 'kill', 1.5),
    ('side_input', 'redis', 'blocking', 'pause', DRAIN_TIMEOUT_S + 3),
    ('windows', 'files', 'non_blocking', 'pause', DRAIN_TIMEOUT_S + 3),
])
def test_the_redis_store_killed_or_paused_mid_run(pipeline, sink, mode, action, down_s,
                                                  own_redis, fault_run, caplog):
    """F7: the run's checkpoint store (its own redis-server) is SIGKILLed after the
    first consistent cut and started again `down_s` seconds later on the same port; F8:
    it is paused (SIGSTOP) for longer than --drain_timeout_s. For the `redis` sink the
    same server also receives the published output. The run goes on (resetting while
    the store is away) and its output equals the golden output."""
    caplog.set_level('WARNING', logger='beam_streams_runner.regions.controller')
    run = fault_run(pipeline, sink, 'redis', mode, store_url=own_redis.url_of(0),
                    sink_server=own_redis, extra=[f'--drain_timeout_s={DRAIN_TIMEOUT_S}'])
    fault = StoreFault(own_redis, run.job, action, down_s)
    fault.start()
    started = time.monotonic()
    try:
        run.run()
        finished = time.monotonic()
    finally:
        fault.stop.set()
        fault.join(30)
    assert fault.error is None, fault.error
    assert fault.faulted_at is not None, f'the store was never {action}ed'
    assert started < fault.faulted_at < finished, f'the store was {action}ed outside the run'
    assert own_redis.running
    if down_s >= 1:
        assert any(': reset ' in r.getMessage() for r in caplog.records), (
            'the store was away for a second or more, yet no epoch failed')
    run.check_exact()
