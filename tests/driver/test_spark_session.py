"""Tests of starting (or reusing) the SparkSession a pipeline runs on."""

import re
import socket
import subprocess
import sys
import textwrap

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_streams_runner.driver import spark_session
from beam_streams_runner.driver.spark_session import (
    SparkMasterUnreachableError,
    check_master_reachable,
    get_or_create_spark,
)
from beam_streams_runner.errors import WorkerPythonError
from beam_streams_runner.options import StreamsSparkOptions


@pytest.fixture
def no_active_spark(monkeypatch):
    """Pretend no SparkSession/SparkContext is active, and fail if a JVM would start.

    Returns the calls that reached pyspark's gateway launch (the spark-submit JVM of
    a new SparkContext): tests assert there were none, since the AssertionError
    raised there could be swallowed on its way out.
    """
    import pyspark.core.context
    import pyspark.java_gateway
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, 'getActiveSession', classmethod(lambda cls: None))
    monkeypatch.setattr(SparkContext, '_active_spark_context', None)

    def no_jvm():
        raise AssertionError('ensure_java() was reached: a JVM would have started')

    monkeypatch.setattr(spark_session, 'ensure_java', no_jvm)
    launches = []

    def no_gateway(*args, **kwargs):
        launches.append((args, kwargs))
        raise AssertionError('launch_gateway() was reached: a JVM would have started')

    # SparkContext calls the name it imported; patch the source too for other callers.
    monkeypatch.setattr(pyspark.core.context, 'launch_gateway', no_gateway)
    monkeypatch.setattr(pyspark.java_gateway, 'launch_gateway', no_gateway)
    return launches


def _options(*flags):
    return PipelineOptions(list(flags)).view_as(StreamsSparkOptions)


def test_unreachable_master_fails_fast_before_any_jvm(no_active_spark, monkeypatch):
    from pyspark import SparkContext

    # "Fast" is what is done before failing, not a time: one TCP connect per host,
    # bounded by the connect timeout, and no JVM (ensure_java, gateway) at all.
    probes = []
    connect = socket.create_connection

    def probe(address, timeout=None, *args, **kwargs):
        probes.append((address, timeout))
        return connect(address, timeout, *args, **kwargs)

    monkeypatch.setattr(socket, 'create_connection', probe)
    with pytest.raises(SparkMasterUnreachableError) as info:
        get_or_create_spark(_options('--spark_master=spark://127.0.0.1:1'), 'test')
    assert probes == [(('127.0.0.1', 1), spark_session.MASTER_CONNECT_TIMEOUT_S)]
    message = str(info.value)
    assert 'spark://127.0.0.1:1' in message
    assert 'start-master.sh' in message and '--spark_master=local[*]' in message
    assert SparkContext._active_spark_context is None
    assert no_active_spark == []


def test_unreachable_master_from_spark_conf(no_active_spark):
    with pytest.raises(SparkMasterUnreachableError, match=re.escape('spark://127.0.0.1:1')):
        get_or_create_spark(_options('--spark_conf=spark.master=spark://127.0.0.1:1'), 'test')
    assert no_active_spark == []


def test_error_is_runtime_error():
    assert issubclass(SparkMasterUnreachableError, RuntimeError)


def test_one_reachable_master_of_several_is_enough():
    with socket.socket() as server:
        server.bind(('127.0.0.1', 0))
        server.listen()
        port = server.getsockname()[1]
        check_master_reachable(f'spark://127.0.0.1:1,127.0.0.1:{port}')
        with pytest.raises(SparkMasterUnreachableError):
            check_master_reachable('spark://127.0.0.1:1,127.0.0.1:2')


@pytest.mark.parametrize('master', ['local', 'local[*]', 'yarn', 'k8s://https://x:6443'])
def test_other_masters_are_not_probed(master):
    check_master_reachable(master)


def test_malformed_master_is_reported():
    with pytest.raises(SparkMasterUnreachableError, match='host:port'):
        check_master_reachable('spark://nohost')


@pytest.mark.parametrize('how', ['PYSPARK_PYTHON', 'spark.pyspark.python'])
def test_worker_python_without_beam_fails_before_any_jvm(no_active_spark, tmp_path,
                                                         monkeypatch, how):
    shim = tmp_path / 'python3'
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    shim.chmod(0o755)
    monkeypatch.delenv('PYTHONPATH', raising=False)
    monkeypatch.delenv('PYSPARK_PYTHON', raising=False)
    flags = ['--spark_master=local[2]']
    if how == 'PYSPARK_PYTHON':
        monkeypatch.setenv('PYSPARK_PYTHON', str(shim))
    else:
        flags.append(f'--spark_conf=spark.pyspark.python={shim}')
    with pytest.raises(WorkerPythonError, match=re.escape(f'{shim} (set by ')):
        get_or_create_spark(_options(*flags), 'test')
    assert no_active_spark == []


def test_non_local_master_is_not_probed(no_active_spark, monkeypatch):
    # Its workers run elsewhere: the interpreter they run cannot be checked from here.
    monkeypatch.delenv('PYSPARK_PYTHON', raising=False)
    monkeypatch.setattr(spark_session, 'check_worker_python', lambda *a: pytest.fail('probed'))
    with pytest.raises(AssertionError, match='ensure_java'):
        get_or_create_spark(_options('--spark_master=yarn'), 'test')
    monkeypatch.setenv('PYSPARK_PYTHON', '/cluster/python3')
    with pytest.raises(AssertionError, match='ensure_java'):
        get_or_create_spark(_options('--spark_master=yarn'), 'test')


def test_active_session_is_reused(monkeypatch):
    from pyspark.sql import SparkSession

    sentinel = object()
    monkeypatch.setattr(SparkSession, 'getActiveSession', classmethod(lambda cls: sentinel))
    assert get_or_create_spark(_options('--spark_master=spark://127.0.0.1:1'), 'x') is sentinel


def test_new_session_gets_the_options():
    """Starts a real local Spark, in a subprocess so that no session leaks into other tests."""
    script = textwrap.dedent('''
        import os
        import sys
        from apache_beam.options.pipeline_options import PipelineOptions
        from beam_streams_runner.options import StreamsSparkOptions
        from beam_streams_runner.driver.spark_session import get_or_create_spark
        opts = PipelineOptions(['--spark_master=local[2]', '--parallelism=3',
                                '--spark_conf=spark.ui.enabled=false',
                                '--spark_conf=spark.app.id.custom=yes'])
        spark = get_or_create_spark(opts.view_as(StreamsSparkOptions), 'bsr-test')
        sc = spark.sparkContext
        conf = sc.getConf()
        seeds = sc.parallelize(range(2), 2).map(
            lambda _: os.environ.get('PYTHONHASHSEED')).collect()

        def forked_from(_):
            with open(f'/proc/{os.getppid()}/cmdline', 'rb') as f:
                return f.read().split(b'\\0')[2].decode()

        def kept_archives(_):
            import zipimport
            fixed = getattr(sys.modules['__main__'], '_FIXED_ARCHIVES', ())
            names = {os.path.basename(path).split('-')[0] for path in fixed}
            return (zipimport.zipimporter.invalidate_caches.__name__,
                    {'pyspark.zip', 'py4j', 'spark'} <= names)

        jvm_args = sc._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean(
            ).getInputArguments()
        print('JVM', '-XX:TieredStopAtLevel=1' in list(jvm_args))
        print('RESULT', sc.master, sc.appName, sc.defaultParallelism,
              conf.get('spark.app.id.custom'), conf.get('spark.python.worker.reuse'),
              ','.join(seeds), get_or_create_spark(opts, 'again') is spark,
              sc.parallelize([0], 1).map(forked_from).first(),
              sc.parallelize([0], 1).map(kept_archives).first())
        spark.stop()
    ''')
    proc = subprocess.run([sys.executable, '-c', script], check=False, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith('RESULT')]
    # Python workers fork from the runner's daemon, which imported Beam already and
    # keeps the directories of PySpark's and Spark's own archives read once.
    assert result == ['RESULT local[2] bsr-test 3 yes true 0,0 True '
                      "beam_streams_runner.worker.daemon ('_invalidate_caches', True)"
                      ], proc.stdout
    # The driver's JVM was started with the runner's JIT setting (C1 only).
    assert 'JVM True' in proc.stdout.splitlines(), proc.stdout
