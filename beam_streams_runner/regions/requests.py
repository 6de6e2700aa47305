"""Operator-driven cuts: a DoFn or a source asks for a checkpoint (design section 12).

`request_checkpoint()` may be called from any user code that runs in an epoch's
task (a DoFn's `process`, `finish_bundle`, a splittable DoFn after finishing a
file): the task's report carries the request to the driver, and every consistent
region cuts after that epoch, whatever its period. Called outside a streaming
run of this runner (a batch run, another runner), it does nothing.

The request is a flag of the Python worker process: PySpark runs one task at a
time in a worker, and the task reads and clears the flag when it reports.
"""

from __future__ import annotations

import threading

_requested = threading.Event()


def request_checkpoint() -> None:
    """Asks for a consistent cut after the current epoch."""
    _requested.set()


def take_checkpoint_request() -> bool:
    """Whether a cut was asked for since the last call (and forgets the request)."""
    requested = _requested.is_set()
    _requested.clear()
    return requested
