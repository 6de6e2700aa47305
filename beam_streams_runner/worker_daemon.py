"""PySpark's Python worker daemon, with Beam and the runner imported before it forks.

PySpark starts one daemon per executor, which forks a Python worker per task
slot. Each new worker imported Beam, pyarrow and the runner on its first task
(about 1.5 s of CPU per worker, measured with py-spy on streaming NEXMark Q0:
a third of all Python worker time at 100k events). Imported here once, in the
daemon, every forked worker inherits them. Spark runs this module through
`spark.python.daemon.module` (set by `spark_session` for sessions the runner
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
"""

import gc

from pyspark import daemon

import beam_streams_runner.batch_driver
import beam_streams_runner.epoch_tasks  # noqa: F401

if __name__ == '__main__':
    gc.collect()
    gc.freeze()
    daemon.manager()
