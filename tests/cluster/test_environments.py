"""Python environments reaching a cluster's executors the PySpark way.

A cluster of its own whose workers' `python3` is a bare virtualenv (no Beam, no
runner): a pipeline left to PySpark's default interpreter fails with the short
error naming the executor's host; the same pipeline with an environment packed by
`venv-pack` and shipped with `spark.archives` (the README's recipe) runs there and
equals the DirectRunner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest

from tests.cluster.fixtures import REPO, read_lines, run_program, start_cluster, stop_cluster


@pytest.fixture(scope='module')
def bare_cluster(tmp_path_factory):
    venv = tmp_path_factory.mktemp('bare') / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    directory = str(tmp_path_factory.mktemp('bare-cluster'))
    try:
        yield start_cluster(directory, '--python', str(venv / 'bin' / 'python3'))
    finally:
        if os.path.exists(os.path.join(directory, 'cluster.json')):
            stop_cluster(directory)


@pytest.fixture(scope='module')
def packed_environment(tmp_path_factory) -> str:
    """The README's recipe: a virtualenv with Beam and the runner (PySpark comes from
    the cluster), packed by venv-pack."""
    import venv_pack
    root = tmp_path_factory.mktemp('packed')
    venv = root / 'env'
    # --copies: Spark unpacks archives with Hadoop's untar, which refuses a symlink that
    # points outside the archive (a venv's bin/python links to its base interpreter).
    subprocess.run([sys.executable, '-m', 'venv', '--copies', str(venv)], check=True)
    pip = [str(venv / 'bin' / 'python'), '-m', 'pip', 'install', '--quiet',
           '--disable-pip-version-check']
    for args in ([f'apache-beam=={metadata.version("apache-beam")}', 'redis>=5',
                  'sortedcontainers>=2.4', 'lmdb>=1.4'], ['--no-deps', REPO]):
        done = subprocess.run(pip + args, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    # .tar.gz: Spark unpacks it with the system's tar, which keeps the files' modes (its
    # own untar of a plain .tar drops the executable bits).
    archive = str(root / 'environment.tar.gz')
    venv_pack.pack(prefix=str(venv), output=archive, verbose=False)
    return archive


def _wordcount(cluster, words: str, out: str, *extra: str) -> subprocess.CompletedProcess:
    return run_program([sys.executable, '-m', 'beam_streams_runner.examples.wordcount',
                        '--runner=StreamsSparkRunner', f'--spark_master={cluster.url}',
                        f'--input={words}', f'--output={out}', *extra])


def test_workers_without_beam_get_the_short_error_naming_the_host(bare_cluster, words,
                                                                  tmp_path):
    done = _wordcount(bare_cluster, words, str(tmp_path / 'counts'))
    assert done.returncode != 0
    error = 'beam_streams_runner.errors.WorkerPythonError: '
    lines = [line for line in done.stderr.splitlines() if line.startswith(error)]
    assert len(lines) == 1, done.stderr[-3000:]
    assert any(f'cannot import {name}' in lines[0]
               for name in ('beam_streams_runner', 'apache_beam'))
    assert ' of host 127.0.0.' in lines[0] and 'spark.pyspark.python' in lines[0]
    assert 'org.apache' not in done.stderr.split(error)[1]


def test_packed_environment_through_spark_archives(bare_cluster, packed_environment, words,
                                                   words_direct, tmp_path):
    out = str(tmp_path / 'counts')
    done = _wordcount(bare_cluster, words, out,
                      f'--spark_conf=spark.archives={packed_environment}#environment',
                      '--spark_conf=spark.pyspark.python=./environment/bin/python')
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_lines(out) == words_direct
