"""Named points of the driver where a fault test kills it (design section 12).

The consistent-region protocol must survive a driver that dies at any of its
transitions, not only at a random moment: after an epoch's deltas are written but
before the cut's commit record, while a non-blocking commit record is being
written, right after it is durable, in the middle of a reset. Each transition
calls `reached(name)`; a test (or the fault matrix in `benchmarks/faults.py`)
sets `BEAM_STREAMS_RUNNER_KILL_AT=name[:n]` in a driver's environment, and the
n-th time (default: the first) the driver reaches that point it SIGKILLs itself,
as a crashed host would end it: no `finally`, no flush, no goodbye. Unset (always,
outside such tests) the check is one dictionary lookup.
"""

from __future__ import annotations

import collections
import os
import signal
import sys

KILL_AT_ENV = 'BEAM_STREAMS_RUNNER_KILL_AT'

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
