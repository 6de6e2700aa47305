"""PySpark's Python worker daemon, with Beam and the runner imported before it forks.

PySpark starts one daemon per executor, which forks a Python worker per task
slot. Each new worker imported Beam, pyarrow and the runner on its first task
(about 1.5 s of CPU per worker, measured with py-spy on streaming NEXMark Q0:
a third of all Python worker time at 100k events). Imported here once, in the
daemon, every forked worker inherits them. Spark runs this module through
`spark.python.daemon.module` (set by `driver.spark_session` for sessions the runner
starts; `--spark_conf spark.python.daemon.module=pyspark.daemon` restores
PySpark's own). Beam starts no Python threads on import, so forking after it
is safe (PySpark's daemon defers only its worker module's import, for pandas
and pyarrow's threads in workers that use them; native allocator threads are
fork-safe).

What the imports built is then frozen out of Python's cyclic garbage collector
(`gc.freeze`, before any fork): those objects live as long as the worker, and
PySpark's daemon runs a full collection after every task a reused worker runs;
each one scanned them all (and, touching every object's header, copied the
daemon's pages into the worker). Measured on the keyed-state benchmark
(`benchmarks/keyed_state_gc.py`, synthetic case, 50k events, local[2], on a
loaded machine): each Python worker spent 17-25 s of wall time in full
collections before, 1-3 s after, and the events were read in half the time.

Two more costs of each fork, 9% of the Python worker time of a streaming ParDo
at bundle size 10 (py-spy, `benchmarks/sweep.py`), are paid once here instead:

* PySpark's worker module, which the daemon imports in each fork (from
  `pyspark.zip`: zipimport compiles it from source every time). It starts no
  thread (checked: `threading.active_count()` stays 1).
* `importlib.invalidate_caches()`, which PySpark calls on a fork's first task
  (its files directory joins `sys.path`): every zipimporter of a package of
  `pyspark.zip` re-read the archive's whole directory (1,500 entries, ~8 ms
  each), and so did the importer of the `spark-core` jar, which Spark puts on every
  Python worker's path (tens of thousands of entries: 6% of the Python worker time
  of the batch GroupByKey benchmark, py-spy). The archives on `sys.path` when the
  daemon starts are PySpark's and Spark's own (`pyspark.zip`, py4j's, the jar) and
  do not change while it runs, so their importers keep what they read; any other
  archive is still re-read.
"""

import gc
import os
import sys
import zipimport

import pyspark.worker  # noqa: F401
from pyspark import daemon

import beam_streams_runner.driver.batch
import beam_streams_runner.worker.epoch_tasks  # noqa: F401

_FIXED_ARCHIVES = frozenset(path for path in sys.path if os.path.isfile(path))
_reread_directory = zipimport.zipimporter.invalidate_caches


def _invalidate_caches(importer: zipimport.zipimporter) -> None:
    if importer.archive not in _FIXED_ARCHIVES:
        _reread_directory(importer)


if __name__ == '__main__':
    zipimport.zipimporter.invalidate_caches = _invalidate_caches
    gc.collect()
    gc.freeze()
    daemon.manager()
