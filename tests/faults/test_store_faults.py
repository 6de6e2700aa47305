"""A redis-server holding the checkpoints SIGKILLed mid-run and started again (F7).

Design sections 8 and 12: the Redis checkpoint store is a fault domain of its own.
Each run checkpoints into a `RedisServer` of the test's own (AOF on, fsync before
every reply, so that what it acknowledged survives the kill). A thread waits until
the run has committed its first cut, SIGKILLs the server, leaves it down for
`down_s` seconds (the fault's length, not a wait for anything) and starts it again
on the same port and directory. A store failure is a fault like any other: the
epoch that hit it fails, the region resets (retrying the store while it is down)
and replays, and the run ends with exactly the golden output.
"""

from __future__ import annotations

import threading
import time

import pytest


class StoreKiller(threading.Thread):
    """Kills `server` once job `job` committed a cut, restarts it `down_s` later."""

    def __init__(self, server, job: str, down_s: float, deadline_s: float = 120) -> None:
        super().__init__(daemon=True)
        self.server, self.job, self.down_s = server, job, down_s
        self.deadline = time.monotonic() + deadline_s
        self.killed_at: float | None = None
        self.restarted_at: float | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            client = self.server.client(socket_timeout=5)
            try:
                # Polled: the region's `latest` pointer exists once a cut is consistent.
                while not client.hexists(f'bsr:jobs/{self.job}/region/default', 'latest'):
                    if self.stop.is_set() or time.monotonic() > self.deadline:
                        return
                    time.sleep(0.02)
            finally:
                client.close()
            self.server.kill()
            self.killed_at = time.monotonic()
            self.stop.wait(self.down_s)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            if self.killed_at is not None:
                self.server.start()
                self.restarted_at = time.monotonic()


@pytest.mark.parametrize('pipeline, sink, mode, down_s', [
    ('combine', 'text', 'blocking', 0.0),
    ('stateful', 'redis', 'non_blocking', 1.0),
    ('combine', 'files', 'non_blocking', 3.0),
    ('stateful', 'files', 'blocking', 1.5),
])
def test_the_redis_store_sigkilled_and_restarted_mid_run(pipeline, sink, mode, down_s,
                                                         own_redis, fault_run, caplog):
    """F7: the run's checkpoint store (its own redis-server) is SIGKILLed after the
    first consistent cut and started again `down_s` seconds later on the same port; for
    the `redis` sink the same server also receives the published output. The run goes
    on (resetting while the store is away) and its output equals the golden output."""
    caplog.set_level('WARNING', logger='beam_streams_runner.regions.controller')
    run = fault_run(pipeline, sink, 'redis', mode, store_url=own_redis.url_of(0),
                    sink_server=own_redis)
    killer = StoreKiller(own_redis, run.job, down_s)
    killer.start()
    started = time.monotonic()
    try:
        run.run()
        finished = time.monotonic()
    finally:
        killer.stop.set()
        killer.join(30)
    assert killer.error is None, killer.error
    assert killer.killed_at is not None, 'the store was never killed'
    assert started < killer.killed_at < finished, 'the store was killed outside the run'
    assert own_redis.running
    if down_s >= 1:
        assert any(': reset ' in r.getMessage() for r in caplog.records), (
            'the store was down for a second or more, yet no epoch failed')
    run.check_exact()
