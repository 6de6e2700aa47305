"""Peak memory of the processes a benchmark run starts: its subprocess, the JVM and the
Python workers under it, sampled from outside.

Each run of the comparison is a subprocess of the orchestrator (a Beam pipeline, a
PySpark or PyFlink program); the engine's own processes (Spark's JVM and Python workers,
Flink's JVM and its Python UDF workers) are its descendants. `PeakMemory` samples the
resident set size summed over every descendant of this process every `interval_s`
seconds while the run lasts and keeps the largest sum: the memory the run held at its
peak, whatever process held it.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

import psutil


def tree_rss(root: psutil.Process) -> int:
    """Bytes resident in every descendant of `root` (not `root` itself)."""
    total = 0
    for child in root.children(recursive=True):
        try:
            total += child.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between the listing and the read
    return total


class PeakMemory:
    """`with PeakMemory() as peak: run()`, then `peak.mb`: the largest summed RSS (MB) of
    this process's descendants seen while the block ran (0 when none was seen)."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self._interval_s = interval_s
        self._root = psutil.Process(os.getpid())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.peak_bytes = 0

    def _sample(self) -> None:
        while True:
            self.peak_bytes = max(self.peak_bytes, tree_rss(self._root))
            if self._stop.wait(self._interval_s):
                return

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mb(self) -> float:
        return self.peak_bytes / 2**20
