"""Operators of stateful partitions kept alive across streaming epochs.

Design section 8 (versioned partition state). PySpark gives no task-to-process
affinity, so partition p of a stateful stage may run in another Python worker
each epoch. Each worker process keeps the live operator of every partition it
ran, tagged with the version (the last epoch it applied); a task of epoch e
reuses it when its version is e-1. Otherwise (another worker ran epoch e-1, or
this worker is new) the task restores the operator from the snapshot the last
task of that partition wrote to the run's state directory before reporting
success. Snapshots are written per version and the one before is kept, so a
retried task of epoch e still finds version e-1.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Protocol


class SnapshotOperator(Protocol):
    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class PartitionOperatorCache:
    """Process-local live operators, versioned, backed by a state directory."""

    _lock = threading.Lock()
    _live: ClassVar[dict[tuple[str, str], tuple[int, Any]]] = {}

    @classmethod
    def load(cls, state_dir: str, name: str, version: int,
             create: Callable[[], SnapshotOperator]) -> SnapshotOperator:
        """The operator `name` as of `version` (-1: a fresh one)."""
        with cls._lock:
            cached = cls._live.pop((state_dir, name), None)
        if cached is not None and cached[0] == version:
            return cached[1]
        operator = create()
        if version >= 0:
            path = _path(state_dir, name, version)
            try:
                with open(path, 'rb') as f:
                    data = f.read()
            except FileNotFoundError:
                raise RuntimeError(
                    f'The state of {name} at epoch {version} is missing from {state_dir}: '
                    'the state directory must stay in place (and be shared by every '
                    'worker of this host) while the pipeline runs.') from None
            operator.restore(data)
        return operator

    @classmethod
    def commit(cls, state_dir: str, name: str, version: int,
               operator: SnapshotOperator) -> None:
        """Writes `operator` as `version`, then keeps it live in this process."""
        directory = os.path.dirname(_path(state_dir, name, version))
        os.makedirs(directory, exist_ok=True)
        path = _path(state_dir, name, version)
        temporary = f'{path}.{os.getpid()}.tmp'
        with open(temporary, 'wb') as f:
            f.write(operator.snapshot())
        os.replace(temporary, path)
        stale = _path(state_dir, name, version - 2)
        if os.path.exists(stale):
            os.remove(stale)
        with cls._lock:
            cls._live[(state_dir, name)] = (version, operator)


def _path(state_dir: str, name: str, version: int) -> str:
    return os.path.join(state_dir, name, f'{version:012d}.snapshot')
