"""The faults of the fault tests and the fault matrix, and how each is injected.

Design section 12. A `Fault` is done in a pipeline's own code at one place (see
`harness.hooks`): at element `at` of stream A (`where='source'`: before the shuffle),
on window `at // 100`'s line of key 0 (`'keyed'`: in the stage after the shuffle),
inside a sink's publishing step (`'publish'`: while WriteToFiles names window
`at // 100`'s file, before its rename; for the Redis sink, between two halves of a
bundle's writes that hold a line of that window), or on what a file sink outputs
once it has published that window (`'published'`). Kinds: `kill_worker` (the Python
worker SIGKILLs itself), `raise` (an exception), `kill_driver` (SIGKILL to the
driver's pid), `sleep` (`SLEEP_S` seconds: an epoch past the drain timeout); `times`
faults in a row, counted in marker files `marker.N`, so that the replay after them
passes.

`StoreFault` is the checkpoint store's own fault: its redis-server SIGKILLed and
started again, or paused (SIGSTOP) and continued, once a job's first cut is
consistent. The driver's faults at the protocol's transitions and a task attempt
that writes late are the runner's `regions.fault_points`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable

import apache_beam as beam
from apache_beam.io import fileio

from beam_streams_runner.io import redis_sink
from tests.faults.pipelines import PER_SECOND

SLEEP_S = 12  # a `sleep` fault: well past the drain timeout the matrix runs with


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: `kind` at `where`, element or window `at`, `times` in a row (see the
    module docstring); with `whole_epochs`, `times` counts epochs instead: the fault
    hits every attempt, in every Spark stage, of the first `times` epochs that reach
    it (an element of a stage read by two shuffles is computed by both; a count of
    hits would fail fewer epochs than asked)."""

    kind: str  # 'kill_worker' | 'raise' | 'kill_driver' | 'sleep'
    marker: str  # path prefix of the marker files counting the faults done
    at: int = 250
    where: str = 'source'  # 'source' | 'keyed' | 'publish' (files) | 'published'
    times: int = 1
    whole_epochs: bool = False

    def done(self) -> int:
        return len(glob.glob(self.marker + '.*'))



# DoFn faults -------------------------------------------------------------------------------------
def inject(fault: Fault, driver_pid: int, what: object) -> None:
    """Does `fault` unless it was done `times` times (or in `times` epochs) already (see
    `Fault`)."""
    if not _hits(fault, what):
        return
    if fault.kind == 'kill_worker':
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == 'kill_driver':
        os.kill(driver_pid, signal.SIGKILL)
    elif fault.kind == 'raise':
        raise RuntimeError(f'injected fault {fault.done()} at {what!r}')
    elif fault.kind == 'sleep':
        time.sleep(SLEEP_S)
    else:
        raise ValueError(fault.kind)


def _hits(fault: Fault, what: object) -> bool:
    """Whether `fault` hits now; its marker file is written when it does."""
    if fault.whole_epochs:
        marker = f'{fault.marker}.epoch-{epoch_of_task()}'
        if os.path.exists(marker):  # an epoch it failed already: fails again
            return True
    else:
        marker = f'{fault.marker}.{fault.done()}'
    if fault.done() >= fault.times:
        return False
    with open(marker, 'w') as f:
        f.write(f'{os.getpid()} {time.time()} {what!r}\n')
    return True


def epoch_of_task() -> int:
    """The streaming epoch of the running Spark task, from its job's description
    (`Beam streaming epoch N ...`)."""
    from pyspark import TaskContext
    description = TaskContext.get().getLocalProperty('spark.job.description') or ''
    match = re.match(r'Beam streaming epoch (\d+)', description)
    if match is None:
        raise RuntimeError(f'not a streaming epoch\'s task: {description!r}')
    return int(match.group(1))


class Inject(beam.DoFn):
    """Injects `fault` at its element (see the module docstring); passes every element on.

    At the source, the element is (key, index) and the fault hits index `at`; on the
    lines ('keyed') it hits window `at // 100`'s line of key 0 (or of element `at` or
    `at + 1`, one of which a stateless chain keeps); on what a file sink outputs once it
    has published a window ('published') it hits window `at // 100`."""

    def __init__(self, fault: Fault, driver_pid: int, start: int) -> None:
        self.fault = fault
        self.driver_pid = driver_pid
        self.window = start + fault.at // PER_SECOND

    def process(self, element, w=beam.DoFn.WindowParam):
        fault = self.fault
        if fault.where == 'source':
            hit = element[1] == fault.at
        elif fault.where == 'keyed':
            first, second = element.split()[:2]
            hit = first == f'w{self.window}' and (
                second == 'k0' or second in (f'e{fault.at}', f'e{fault.at + 1}'))
        else:
            hit = w.start.micros // 1_000_000 == self.window
        if hit:
            inject(fault, self.driver_pid, element)
        yield element


def file_naming(window, pane, shard_index, total_shards, compression, destination) -> str:
    """WriteToFiles' default naming, after the destination when there is one: each
    firing of a window then gets names of its own (Beam's naming repeats a window's
    names in every firing; see `write`)."""
    prefix = f'output-{destination}' if destination else 'output'
    naming = fileio.default_file_naming(prefix)
    return naming(window, pane, shard_index, total_shards, compression, destination)


class FaultyNaming:
    """`file_naming`, injecting `fault` when it names a file of window `at // 100`:
    inside the publishing step, before its rename."""

    def __init__(self, fault: Fault, driver_pid: int, start: int) -> None:
        self.fault = fault
        self.driver_pid = driver_pid
        self.window = start + fault.at // PER_SECOND

    def __call__(self, window, pane, shard_index, total_shards, compression, destination):
        if window.start.micros // 1_000_000 == self.window:
            inject(self.fault, self.driver_pid, f'naming {window}')
        return file_naming(window, pane, shard_index, total_shards, compression, destination)


class CrashingRedisWrite(redis_sink._WriteToRedisFn):
    """WriteToRedis' DoFn, injecting `fault` in the middle of a bundle's writes that
    hold a line of window `at // 100`: the first half written, the rest not yet."""

    def __init__(self, url: str, key_prefix: str, fault: Fault, driver_pid: int,
                 start: int) -> None:
        super().__init__(url, key_prefix, redis_sink.default_sink_name(url, key_prefix))
        self.fault = fault
        self.driver_pid = driver_pid
        self.window = start + fault.at // PER_SECOND

    def _flush(self) -> None:
        writes = self._buffer
        if not any(str(value).startswith(f'w{self.window} ') for _, value, _ in writes):
            return super()._flush()
        half = len(writes) // 2
        self._buffer = writes[:half]
        super()._flush()
        inject(self.fault, self.driver_pid, f'after {half} of {len(writes)} Redis writes')
        self._buffer = writes[half:]
        return super()._flush()


def crashing_write_to_redis(url: str, key_prefix: str, fault: Fault, driver_pid: int,
                            start: int) -> beam.PTransform:
    """`WriteToRedis(url, key_prefix=key_prefix)` whose writes `CrashingRedisWrite`."""
    write = redis_sink.WriteToRedis(url, key_prefix=key_prefix)
    write._fn = CrashingRedisWrite(url, key_prefix, fault, driver_pid, start)
    return write


class AfterFirstCut(threading.Thread):
    """Once job `job` has a consistent cut in `region` (its `latest` pointer in database
    `db` of the redis-server `server` holding its checkpoints), `fault()`; `down_s`
    seconds later (or when `stop` is set), `restore()`. `stop` also ends the wait for
    the cut early."""

    def __init__(self, server, job: str, fault: Callable[[], object],
                 restore: Callable[[], object] | None = None, down_s: float = 0.0,
                 db: int = 0, region: str = 'default', deadline_s: float = 120) -> None:
        super().__init__(daemon=True)
        self.server, self.job, self.down_s = server, job, down_s
        self._fault, self._restore = fault, restore
        self.db, self.region = db, region
        self.deadline = time.monotonic() + deadline_s
        self.faulted_at: float | None = None
        self.restored_at: float | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            if not self._wait_for_a_cut():
                return
            self._fault()
            self.faulted_at = time.monotonic()
            self.stop.wait(self.down_s)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            if self.faulted_at is not None and self._restore is not None:
                self._restore()
                self.restored_at = time.monotonic()

    def _wait_for_a_cut(self) -> bool:
        client = self.server.client(db=self.db, socket_timeout=5)
        try:
            while not client.hexists(f'bsr:jobs/{self.job}/region/{self.region}', 'latest'):
                if self.stop.is_set() or time.monotonic() > self.deadline:
                    return False
                time.sleep(0.02)
            return True
        finally:
            client.close()


class StoreFault(AfterFirstCut):
    """The checkpoint store's own fault, once the job has a consistent cut: `action`
    'kill' (SIGKILL, then started again on the same port and directory `down_s` seconds
    later: the AOF reloads) or 'pause' (SIGSTOP, SIGCONT `down_s` seconds later)."""

    def __init__(self, server, job: str, action: str, down_s: float, db: int = 0,
                 region: str = 'default', deadline_s: float = 120) -> None:
        fault, restore = ((server.kill, server.start) if action == 'kill'
                          else (server.pause, server.resume))
        super().__init__(server, job, fault, restore, down_s, db, region, deadline_s)
        self.action = action


if __name__ != '__main__':
    # Spark's Python workers cannot import the tests: ship this module's code by value.
    from apache_beam.internal import cloudpickle as _beam_cloudpickle
    _beam_cloudpickle.register_pickle_by_value(sys.modules[__name__])
