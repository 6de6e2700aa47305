"""Spark's Python workers run an interpreter that can run them, or the run says why not.

* A pipeline started with a virtualenv's interpreter without activating it (PATH
  without the venv, the first `python3` on PATH without Beam) runs: on a local
  master the workers use the driver's interpreter.
* A worker interpreter without Beam (PYSPARK_PYTHON, spark.pyspark.python) fails
  on a local master before any JVM starts, with one short `WorkerPythonError`
  naming the interpreter, what it cannot import and how to fix it.
* On an existing session (any master) the same failures inside Spark become that
  short error too, the Spark trace going to the DEBUG log.

The Spark tests run in subprocesses: each needs a SparkContext of its own.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import read_shards

import beam_streams_runner
from beam_streams_runner import errors
from beam_streams_runner.driver import worker_python as wp
from beam_streams_runner.errors import (
    WorkerPythonError,
    spark_failures_as_pipeline_errors,
    worker_python_error,
)

LINES = ['the cat and the hat', 'the end']
FIX = ('pip install beam-streams-runner', 'PYSPARK_PYTHON=/path/to/python',
       '--spark_conf spark.pyspark.python=/path/to/python')


def _script(path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def no_beam_python(tmp_path):
    """An interpreter that starts but cannot import Beam: this Python without site-packages."""
    (tmp_path / 'nobeam').mkdir()
    python = _script(tmp_path / 'nobeam' / 'python3',
                     f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    found = subprocess.run([python, '-c', 'import apache_beam'], env=env, check=False,
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert found.returncode != 0, 'the shim imports apache_beam: the test would prove nothing'
    return python


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYSPARK_PYTHON', 'PYSPARK_DRIVER_PYTHON', 'PYTHONPATH', 'VIRTUAL_ENV')}
    env.update(extra)
    return env


# --- Choosing and probing the interpreter -------------------------------------------

@pytest.mark.parametrize('master', ['local', 'local[2]', 'local[*]', 'local[4,2]',
                                    'local-cluster[2,1,1024]'])
def test_local_masters(master):
    assert wp.is_local_master(master)


@pytest.mark.parametrize('master', ['spark://h:7077', 'yarn', 'k8s://https://x:6443',
                                    'localhost', 'mesos://local'])
def test_other_masters(master):
    assert not wp.is_local_master(master)


def test_the_users_choice_wins_conf_first():
    conf = {'spark.pyspark.python': '/from/conf'}
    env = {'PYSPARK_PYTHON': '/from/env'}
    assert wp.worker_python('local[2]', conf, env) == (
        '/from/conf', '--spark_conf spark.pyspark.python')
    assert wp.worker_python('yarn', {}, env) == ('/from/env', 'PYSPARK_PYTHON')


def test_local_master_gets_the_drivers_interpreter_other_masters_their_own():
    assert wp.worker_python('local[2]', {}, {}) == (sys.executable, "the driver's interpreter")
    assert wp.worker_python('spark://h:7077', {}, {}) is None


def test_drivers_interpreter_is_not_probed(monkeypatch):
    monkeypatch.setattr(subprocess, 'run', lambda *a, **k: pytest.fail('probed'))
    wp.check_worker_python(sys.executable)


def test_probe_names_what_is_missing(no_beam_python, monkeypatch):
    monkeypatch.delenv('PYTHONPATH', raising=False)
    with pytest.raises(WorkerPythonError) as info:
        wp.check_worker_python(no_beam_python, 'PYSPARK_PYTHON')
    message = str(info.value)
    assert (f'{no_beam_python} (set by PYSPARK_PYTHON) cannot import apache_beam '
            "(No module named 'apache_beam')") in message
    assert all(fix in message for fix in FIX), message


def test_probe_looks_for_the_runner_too(tmp_path, monkeypatch):
    fake = tmp_path / 'site'
    (fake / 'apache_beam').mkdir(parents=True)
    (fake / 'apache_beam' / '__init__.py').write_text('')
    monkeypatch.setenv('PYTHONPATH', str(fake))
    monkeypatch.chdir(tmp_path)  # Not next to the runner's source folder.
    python = _script(tmp_path / 'python', f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    with pytest.raises(WorkerPythonError, match="cannot import beam_streams_runner "
                                                r"\(No module named 'beam_streams_runner'\)"):
        wp.check_worker_python(python)


def test_probe_of_a_missing_interpreter(tmp_path):
    with pytest.raises(WorkerPythonError, match=r'could not start with .*nope/python3: '
                                                r'No such file or directory'):
        wp.check_worker_python(str(tmp_path / 'nope' / 'python3'))


def test_probe_of_another_python_version(tmp_path):
    # As Python 2 would: the version, then a failure on what it lacks.
    python = _script(tmp_path / 'python', '#!/bin/sh\necho version 2.7\nexit 1\n')
    with pytest.raises(WorkerPythonError, match=r'it is Python 2\.7, the driver is Python'):
        wp.check_worker_python(python)


def test_probe_of_an_interpreter_that_fails(tmp_path):
    python = _script(tmp_path / 'python', '#!/bin/sh\necho "SyntaxError: invalid" >&2\nexit 1\n')
    with pytest.raises(WorkerPythonError, match='SyntaxError: invalid'):
        wp.check_worker_python(python)


def test_probe_timeout_lets_the_run_go_on(tmp_path, monkeypatch, caplog):
    def slow(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs['timeout'])

    monkeypatch.setattr(subprocess, 'run', slow)
    with caplog.at_level(logging.WARNING, logger=wp.__name__):
        wp.check_worker_python(str(tmp_path / 'python'))
    assert 'without checking it' in caplog.text


# --- Recognizing the failure in Spark's error (any master) ---------------------------

# Abridged from the errors PySpark 4.3 raised for these cases.
_DAEMON_WITHOUT_MODULE = '''\
An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 \
failed 4 times, most recent failure: Lost task 0.3 (TID 3) (10.0.0.7 executor 1): \
org.apache.spark.SparkException: \nError from python worker:
  /usr/bin/python3.11: Error while finding module specification for \
'beam_streams_runner.worker.daemon' (ModuleNotFoundError: No module named 'beam_streams_runner')
PYTHONPATH was:
  /opt/spark/python/lib/pyspark.zip:/opt/spark/python/lib/py4j-0.10.9.9-src.zip
org.apache.spark.SparkException: EOFException occurred while reading the port number from \
beam_streams_runner.worker.daemon's stdout.
\tat org.apache.spark.errors.SparkCoreErrors$.eofExceptionWhileReadPortNumberError(x.scala:55)
'''
_DAEMON_SYNTAX_ERROR = '''\
org.apache.spark.SparkException: \nError from python worker:
  Traceback (most recent call last):
    File "/opt/x/beam_streams_runner/__init__.py", line 8
      print "x"
  SyntaxError: Missing parentheses in call to 'print'
PYTHONPATH was:
  /opt/spark/python/lib/pyspark.zip
org.apache.spark.SparkException: EOFException occurred while reading the port number from \
beam_streams_runner.worker.daemon's stdout.
'''
_PYSPARK_DAEMON_UNPICKLE = '''\
An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/opt/spark/python/lib/pyspark.zip/pyspark/worker_util.py", line 75, in read_command
    command = serializer.loads(file)
  File "/opt/spark/python/lib/pyspark.zip/pyspark/serializers.py", line 483, in loads
    return cloudpickle.loads(obj, encoding=encoding)
ModuleNotFoundError: No module named 'apache_beam'
'''


@pytest.fixture
def workers_on_python3(monkeypatch):
    # The message names the interpreter the active SparkContext starts workers with;
    # other tests' shared session would make it the driver's.
    monkeypatch.setattr(errors, '_configured_worker_python', lambda: 'python3')


def test_daemon_that_cannot_find_the_runner(workers_on_python3):
    message = str(worker_python_error(_DAEMON_WITHOUT_MODULE))
    # On a cluster the message names the executor and its host (from "Lost task ...").
    assert ("python3 (/usr/bin/python3.11) on executor 1 of host 10.0.0.7 cannot import "
            "beam_streams_runner (No module named 'beam_streams_runner')") in message
    assert all(fix in message for fix in FIX) and 'org.apache' not in message


def test_daemon_that_fails_otherwise_names_the_daemon_and_its_error():
    message = str(worker_python_error(_DAEMON_SYNTAX_ERROR))
    assert ("cannot import beam_streams_runner.worker.daemon (SyntaxError: Missing "
            "parentheses in call to 'print')") in message


def test_daemon_without_error_output_points_to_the_executor_logs():
    text = _DAEMON_SYNTAX_ERROR.split('PYTHONPATH was:\n  /opt/spark/python/lib/pyspark.zip\n')[1]
    message = str(worker_python_error(text))
    assert "beam_streams_runner.worker.daemon exited before it started" in message
    assert "executors' logs" in message


def test_worker_of_pysparks_daemon_that_cannot_load_beam():
    message = str(worker_python_error(_PYSPARK_DAEMON_UNPICKLE))
    assert "cannot import apache_beam (No module named 'apache_beam')" in message


@pytest.mark.parametrize('text', [
    'org.apache.spark.SparkException: Job aborted: java.lang.OutOfMemoryError',
    # A user's own missing module is the user's error, not the workers'.
    _PYSPARK_DAEMON_UNPICKLE.replace('apache_beam', 'my_pipeline_lib'),
])
def test_other_failures_are_left_alone(text):
    assert worker_python_error(text) is None


def test_conversion_logs_the_spark_failure_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger='beam_streams_runner.errors'):
        with pytest.raises(WorkerPythonError) as info:
            with spark_failures_as_pipeline_errors():
                raise RuntimeError(_DAEMON_WITHOUT_MODULE)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert 'EOFException occurred' in caplog.text


# --- Real Spark, in subprocesses ----------------------------------------------------

def _expected_counts() -> list[str]:
    words = collections.Counter(word for line in LINES for word in line.split())
    return sorted(f'{word}: {count}' for word, count in words.items())


@pytest.mark.timeout(400)
def test_unactivated_virtualenv_runs_the_pipeline(tmp_path, no_beam_python):
    """`venv/bin/python -m ...wordcount` with PATH's python3 unable to import Beam."""
    venv = tmp_path / 'v'
    subprocess.run([sys.executable, '-m', 'venv', '--system-site-packages', '--without-pip',
                    str(venv)], check=True, timeout=120, stdin=subprocess.DEVNULL)
    source = tmp_path / 'input.txt'
    source.write_text('\n'.join(LINES) + '\n')
    out = str(tmp_path / 'out' / 'counts')
    path = os.pathsep.join([os.path.dirname(no_beam_python), os.environ['PATH']])
    assert str(venv) not in path
    proc = subprocess.run(
        [str(venv / 'bin' / 'python'), '-m', 'beam_streams_runner.examples.wordcount',
         '--runner=StreamsSparkRunner', '--spark_master=local[2]',
         '--input', str(source), '--output', out],
        env=_clean_env(PATH=path), cwd=str(tmp_path), capture_output=True, text=True,
        timeout=380, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert read_shards(out) == _expected_counts()


_WORDCOUNT = textwrap.dedent('''
    import sys
    from beam_streams_runner.examples import wordcount
    wordcount.main(sys.argv[1:])
''')


@pytest.mark.timeout(300)
@pytest.mark.parametrize('how', ['PYSPARK_PYTHON', 'spark.pyspark.python'])
def test_worker_python_without_beam_gets_the_short_error(tmp_path, no_beam_python, how):
    source = tmp_path / 'input.txt'
    source.write_text('\n'.join(LINES) + '\n')
    args = ['--runner=StreamsSparkRunner', '--spark_master=local[2]',
            '--input', str(source), '--output', str(tmp_path / 'counts')]
    env = _clean_env()
    if how == 'PYSPARK_PYTHON':
        env['PYSPARK_PYTHON'] = no_beam_python
    else:
        args.append(f'--spark_conf=spark.pyspark.python={no_beam_python}')
    proc = subprocess.run([sys.executable, '-c', _WORDCOUNT, *args], env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=280,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode != 0
    stderr = proc.stderr
    assert 'WorkerPythonError' in stderr, stderr[-4000:]
    assert f"{no_beam_python} (set by " in stderr
    assert "cannot import apache_beam (No module named 'apache_beam')" in stderr
    assert all(fix in stderr for fix in FIX), stderr
    # Short: no Java frames, and no JVM at all (it fails before Spark starts).
    assert len(stderr.splitlines()) < 30, stderr
    assert 'at org.apache' not in stderr and 'log4j' not in stderr, stderr


_ON_A_SESSION = textwrap.dedent('''
    import json, logging, sys
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from beam_streams_runner import StreamsSparkRunner
    from beam_streams_runner.errors import WorkerPythonError
    from beam_streams_runner.options import StreamsSparkOptions
    from beam_streams_runner.driver.spark_session import get_or_create_spark

    chosen, *broken = sys.argv[1:]
    args = ['--spark_master=local[1]', '--spark_conf=spark.ui.enabled=false']
    spark = get_or_create_spark(PipelineOptions(
        args + ['--spark_conf=spark.pyspark.python=' + chosen]).view_as(StreamsSparkOptions), 't')
    sc = spark.sparkContext
    ran = sc.parallelize([0], 1).map(lambda _: sys.executable).first()
    print('CHOSEN', json.dumps([sc.pythonExec, sc.getConf().get('spark.pyspark.python'), ran]))

    debug = []
    handler = logging.Handler()
    handler.emit = lambda record: debug.append(logging.Formatter().format(record))
    logging.getLogger('beam_streams_runner.errors').addHandler(handler)
    logging.getLogger('beam_streams_runner.errors').setLevel(logging.DEBUG)
    for python in broken:
        # The runner reuses this session as it is: nothing is probed, Spark fails.
        sc.pythonExec = python
        debug.clear()
        try:
            with beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(args)) as p:
                p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x + 1)
        except WorkerPythonError as exc:
            print('ERROR', json.dumps([str(exc), any('EOFException' in d or 'Cannot run' in d
                                                     for d in debug)]))
        else:
            print('ERROR', json.dumps(['no error', False]))
    spark.stop()
''')


@pytest.mark.timeout(400)
def test_failures_inside_spark_become_the_short_error(tmp_path, no_beam_python):
    """On a session the runner did not start (as on a cluster): Spark's error is converted."""
    chosen = tmp_path / 'chosen-python'
    chosen.symlink_to(sys.executable)
    # Finds the runner (its source folder on PYTHONPATH) but not Beam, which it imports.
    runner_only = _script(tmp_path / 'python-runner-only', textwrap.dedent(f'''\
        #!/bin/sh
        PYTHONPATH="$PYTHONPATH:{os.path.dirname(os.path.dirname(beam_streams_runner.__file__))}"
        export PYTHONPATH
        exec {no_beam_python} "$@"
    '''))
    missing = str(tmp_path / 'missing' / 'python3')
    proc = subprocess.run(
        [sys.executable, '-c', _ON_A_SESSION, str(chosen), no_beam_python, runner_only, missing],
        # Not next to the runner's source folder, which `python -m` would find from there.
        env=_clean_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=380,
        stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    chosen_line = [json.loads(line[7:]) for line in lines if line.startswith('CHOSEN ')]
    # --spark_conf spark.pyspark.python is what the workers ran (PySpark alone ignores it).
    assert chosen_line == [[str(chosen)] * 3], proc.stdout
    errors = [json.loads(line[6:]) for line in lines if line.startswith('ERROR ')]
    assert len(errors) == 3, proc.stdout + proc.stderr[-4000:]
    for message, logged in errors:
        assert logged, message
        assert 'org.apache' not in message and len(message.splitlines()) == 1, message
        assert 'PYSPARK_PYTHON=/path/to/python' in message, message
    assert errors[0][0].startswith(f"Spark's Python workers could not start: {no_beam_python} ")
    assert ("cannot import beam_streams_runner (No module named 'beam_streams_runner')"
            in errors[0][0])
    assert errors[1][0].startswith(f"Spark's Python workers could not start: {runner_only} ")
    assert "cannot import apache_beam (No module named 'apache_beam')" in errors[1][0]
    assert errors[2][0].startswith(
        f"Spark's Python workers could not start with {missing}: No such file or directory")
