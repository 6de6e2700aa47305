"""Named points of the driver where a fault test kills it, and a task attempt that
writes late (design section 12).

The consistent-region protocol must survive a driver that dies at any of its
transitions, not only at a random moment: after an epoch's deltas are written but
before the cut's commit record, while a non-blocking commit record is being
written, right after it is durable, in the middle of a reset. Each transition
calls `reached(name)`; a test (or the fault matrix in `benchmarks/faults.py`)
sets `BEAM_STREAMS_RUNNER_KILL_AT=name[:n]` in a driver's environment, and the
n-th time (default: the first) the driver reaches that point it SIGKILLs itself,
as a crashed host would end it: no `finally`, no flush, no goodbye. Unset (always,
outside such tests) the check is one dictionary lookup.

Fencing has its own fault: a task attempt that the runner gave up on and whose
write lands after the next attempt's (a zombie). Every task writes its state deltas
through `late_write`, which makes one where a test sets
`BEAM_STREAMS_RUNNER_LATE_WRITE=epoch:wait_s:marker`: the first attempt of every
task of that epoch that writes state forks a copy of itself and dies by SIGKILL
before writing or reporting anything; Spark runs the task again. The copy cuts its
links to Spark and waits until that next attempt has written (it leaves a file
`marker-written-<task>`), at most `wait_s` seconds, then writes the dead attempt's
deltas with every key deleted, so that a read of its revision would show as results
lost, and leaves a marker file `marker.<pid>` saying it wrote. Only the next
attempt's revision may ever be read. Waiting for the next attempt's write, rather
than for a fixed time, makes the write late in every run and lets it land while the
job still runs.
"""

from __future__ import annotations

import collections
import hashlib
import os
import signal
import stat
import sys
import time
from collections.abc import Callable

KILL_AT_ENV = 'BEAM_STREAMS_RUNNER_KILL_AT'
LATE_WRITE_ENV = 'BEAM_STREAMS_RUNNER_LATE_WRITE'

AFTER_EPOCH_DELTAS = 'after_epoch_deltas'  # the epoch's state is written, no cut yet
BEFORE_COMMIT_RECORD = 'before_commit_record'  # the cut's parts taken, record not written
DURING_NON_BLOCKING_WRITE = 'during_non_blocking_write'  # in the background writer
AFTER_COMMIT_RECORD = 'after_commit_record'  # durable, not yet declared consistent
DURING_RESET = 'during_reset'  # some members reset, others not yet
POINTS = (AFTER_EPOCH_DELTAS, BEFORE_COMMIT_RECORD, DURING_NON_BLOCKING_WRITE,
          AFTER_COMMIT_RECORD, DURING_RESET)

_reached: collections.Counter = collections.Counter()


def reached(point: str) -> None:
    """The driver is at `point`: dies here if a test asked for it (see the docstring)."""
    spec = os.environ.get(KILL_AT_ENV)
    if not spec:
        return
    name, _, nth = spec.partition(':')
    if name != point:
        return
    _reached[point] += 1
    if _reached[point] == int(nth or 1):
        sys.stderr.write(f'fault injection: killing the driver at {point} '
                         f'(time {_reached[point]})\n')
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def late_write(epoch: int, attempt: int, task: str, write: Callable[[bool], int]) -> int:
    """Returns `write(False)`, the task attempt's write of its state deltas, unless a test
    asked for a zombie of this epoch (see the docstring): then the first attempt forks
    one and dies, and a later attempt says it wrote."""
    spec = os.environ.get(LATE_WRITE_ENV)
    if not spec:
        return write(False)
    at, wait_s, marker = spec.split(':', 2)
    if int(at) != epoch:
        return write(False)
    written = f'{marker}-written-{hashlib.sha1(task.encode()).hexdigest()[:12]}'
    if attempt == 0:
        if os.fork() == 0:
            _zombie(float(wait_s), written, write, marker, epoch)
        os.kill(os.getpid(), signal.SIGKILL)
    state_bytes = write(False)
    with open(written, 'w', encoding='utf-8') as f:
        f.write(f'epoch {epoch} attempt {attempt}\n')
    return state_bytes


def _zombie(wait_s: float, written: str, write: Callable[[bool], object], marker: str,
            epoch: int) -> None:
    """The forked copy: no socket shared with Spark (its end of them would keep the dead
    attempt's connection open), a wait for the next attempt's write, then the dead
    attempt's write; never returns."""
    outcome = 'wrote'
    try:
        for name in os.listdir('/proc/self/fd'):
            try:
                if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                    os.close(int(name))
            except OSError:
                pass  # the directory's own descriptor, closed by listdir already
        deadline = time.monotonic() + wait_s
        while not os.path.exists(written) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not os.path.exists(written):
            outcome = 'wrote, no later attempt having written'
        write(True)
    except BaseException as exc:  # noqa: BLE001 - reported in the marker, then exits
        outcome = f'failed: {type(exc).__name__}: {exc}'
    finally:
        try:
            with open(f'{marker}.{os.getpid()}', 'w', encoding='utf-8') as f:
                f.write(f'epoch {epoch} attempt 0 {outcome} at {time.time()}\n')
        finally:
            os._exit(0)
