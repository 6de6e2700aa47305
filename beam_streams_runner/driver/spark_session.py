"""Get the SparkSession a pipeline runs on: the active one, or a new one from the options.

An active SparkSession (or SparkContext) in the process is reused as it is, so
a pipeline launched from a notebook runs on that Spark. Under `spark-submit`
(client mode) the JVM is up but no session yet: the session started here takes
spark-submit's `--master` and configuration, unless `--spark_master` names another
master (a setting in the program wins, as in Spark).
Otherwise a session is started from `StreamsSparkOptions`, after checking that
a Java PySpark supports is there and, for a `spark://` master, that the master
answers, so that both mistakes fail fast with a message saying what to do.
Its Python workers run the interpreter `worker_python` picks: the user's
choice, else the driver's own on a local master (checked first when it is not
the driver's).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING

from beam_streams_runner.driver.java import cache_root, ensure_java
from beam_streams_runner.driver.jvm_class_cache import class_sharing_options
from beam_streams_runner.driver.worker_python import (
    PYTHON_CONF,
    check_worker_python,
    is_local_master,
    worker_python,
)
from beam_streams_runner.options import (
    DEFAULT_SPARK_MASTER,
    StreamsSparkOptions,
    configured_parallelism,
    parse_spark_conf,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ['SparkMasterUnreachableError', 'check_master_reachable', 'get_or_create_spark']

_LOGGER = logging.getLogger(__name__)

MASTER_CONNECT_TIMEOUT_S = 5.0

_JVM_OPTIONS = '-XX:TieredStopAtLevel=1'
# Defaults of a session the runner starts; --spark_conf entries override them.
_DEFAULT_CONF = {
    'spark.ui.showConsoleProgress': 'true',
    'spark.python.worker.reuse': 'true',
    'spark.log.level': 'WARN',
    # Same str/bytes hashes in every Python worker (Beam and PySpark partitioning
    # must agree across workers and re-runs).
    'spark.executorEnv.PYTHONHASHSEED': '0',
    # Workers forked with Beam already imported (see worker.daemon).
    'spark.python.daemon.module': 'beam_streams_runner.worker.daemon',
    # The JVM's work here is scheduling, py4j and moving bytes between Python workers;
    # its optimising JIT compiler (C2) took a third of a 2-core machine's CPU for the
    # first minute of a run, more than it ever gives back (docs/decisions.md).
    'spark.driver.extraJavaOptions': _JVM_OPTIONS,
    'spark.executor.extraJavaOptions': _JVM_OPTIONS,
}


class SparkMasterUnreachableError(RuntimeError):
    """The `spark://` master given in --spark_master does not accept connections."""


def _host_ports(master: str) -> list[tuple[str, str]]:
    endpoints = []
    for part in master[len('spark://'):].split(','):
        host, _, port = part.strip().rpartition(':')
        endpoints.append((host.strip('[]'), port))
    return endpoints


def check_master_reachable(master: str, timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """For a spark://host:port[,host:port] master, check that one of the hosts accepts TCP.

    Other masters (local, yarn, k8s) are not checked. Raises SparkMasterUnreachableError.
    """
    if not master.startswith('spark://'):
        return
    failures = []
    for host, port in _host_ports(master):
        if not host or not port.isdigit():
            failures.append(f'{host}:{port} (not of the form host:port)')
            continue
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return
        except OSError as exc:
            failures.append(f'{host}:{port} ({exc.strerror or exc})')
    raise SparkMasterUnreachableError(
        f'Spark master {master} is unreachable: could not connect to '
        f'{", ".join(failures)} within {timeout_s:g} s. Start the standalone master there '
        '(sbin/start-master.sh, then sbin/start-worker.sh ' + master + '), check the host and '
        'port (the master log prints its spark:// URL; the default port is 7077), or run '
        'locally with --spark_master=local[*].')


def _spark_submit_master() -> str | None:
    """The master `spark-submit --master` gave, when this program runs under spark-submit
    (which starts the JVM first and hands its gateway to Python), else None."""
    if not os.environ.get('PYSPARK_GATEWAY_PORT'):
        return None
    from pyspark import SparkConf, SparkContext
    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, whose conf it is
    return SparkConf().get('spark.master', None)


def get_or_create_spark(options: StreamsSparkOptions, app_name: str) -> SparkSession:
    """The active SparkSession if there is one, else a new one built from `options`."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if SparkContext._active_spark_context is not None:
        # A SparkContext without a session: wrap it (getOrCreate reuses the context).
        return SparkSession.builder.getOrCreate()

    options = options.view_as(StreamsSparkOptions)
    master = (options.spark_master or DEFAULT_SPARK_MASTER).strip()
    submitted = _spark_submit_master()
    if submitted and master == DEFAULT_SPARK_MASTER:
        master = submitted  # spark-submit --master, unless --spark_master says otherwise
    conf = dict(_DEFAULT_CONF)
    parallelism = configured_parallelism(options)
    if parallelism is not None:
        conf['spark.default.parallelism'] = str(parallelism)
    users = parse_spark_conf(options.spark_conf)
    conf.update(users)
    effective_master = conf.get('spark.master', master)
    check_master_reachable(effective_master)
    python = worker_python(effective_master, conf)
    if python is not None:
        if is_local_master(effective_master):
            check_worker_python(*python)
        conf[PYTHON_CONF] = python[0]
    java = ensure_java()
    if not submitted and 'spark.driver.extraJavaOptions' not in users:
        # The runner's own driver JVM (not one the user configured): its classes mapped
        # from the user's cache (see jvm_class_cache).
        conf['spark.driver.extraJavaOptions'] = ' '.join(filter(None, [
            _JVM_OPTIONS, class_sharing_options(cache_root(), java, conf)]))

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    _LOGGER.info('Starting a SparkSession on %s', effective_master)
    spark = builder.getOrCreate()
    if python is not None:
        # PySpark gives Spark the workers' interpreter from `pythonExec`, which it
        # took from PYSPARK_PYTHON alone; setting it here, not in os.environ, leaves
        # the process's environment (and any later session) as the user made them.
        spark.sparkContext.pythonExec = python[0]
    return spark
