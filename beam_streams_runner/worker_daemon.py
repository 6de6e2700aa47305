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
"""

from pyspark import daemon

import beam_streams_runner.batch_driver
import beam_streams_runner.epoch_tasks  # noqa: F401

if __name__ == '__main__':
    daemon.manager()
