"""Fixtures of the cluster tests, made known to pytest by the tests' conftest.py (a
conftest.py here would shadow that one's module name, which other tests import).

* `local_cluster`: a standalone master and two workers (127.0.0.2 and 127.0.0.3),
  started once for the session with the command a user types
  (`python -m beam_streams_runner.cluster start`), on free ports in a directory of
  the session's own, and always stopped at the end, checking that nothing of it
  (daemons, executors, Python workers) outlives the stop.
* `run_program(args, env=None, timeout=..., cwd=REPO)`: runs a program as a user would, with the
  repository on PYTHONPATH (the tests' pipelines import `tests.*`); returns the
  completed process.
* `cli(directory, *args)`: the cluster command on `directory`.
* `words` (a text file) and `words_direct`: what Beam's word count example writes for
  it on the DirectRunner, sorted (`read_lines`).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

import pytest

from beam_streams_runner.cluster import LocalCluster, processes_under

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_TIMEOUT_S = 420


def run_program(args: Sequence[str], env: Mapping[str, str] | None = None,
                timeout: float = RUN_TIMEOUT_S, cwd: str = REPO) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    environment['PYTHONPATH'] = os.pathsep.join(
        filter(None, [REPO, environment.get('PYTHONPATH')]))
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          env=environment, cwd=cwd, stdin=subprocess.DEVNULL)


def cli(directory: str, *args: str) -> subprocess.CompletedProcess:
    return run_program([sys.executable, '-m', 'beam_streams_runner.cluster',
                        '--dir', directory, *args], timeout=300)


def start_cluster(directory: str, *args: str) -> LocalCluster:
    started = cli(directory, 'start', '--workers', '2', '--port', '0', '--webui-port', '0',
                  *args)
    assert started.returncode == 0, started.stdout + started.stderr
    return LocalCluster.load(directory)


def stop_cluster(directory: str) -> None:
    stopped = cli(directory, 'stop')
    left = processes_under(directory)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not left, f'processes of the cluster left after its stop: {left}'


def read_lines(prefix: str) -> list[str]:
    lines = []
    for path in glob.glob(prefix + '*'):
        with open(path, encoding='utf-8') as f:
            lines += f.read().splitlines()
    return sorted(lines)


@pytest.fixture(scope='session')
def words(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp('words') / 'words.txt'
    vocabulary = [f'w{i}' for i in range(50)]
    path.write_text('\n'.join(' '.join(vocabulary[(i * 7 + j) % 50] for j in range(i % 9 + 1))
                              for i in range(2000)) + '\n')
    return str(path)


@pytest.fixture(scope='session')
def words_direct(words, tmp_path_factory) -> list[str]:
    out = str(tmp_path_factory.mktemp('direct') / 'counts')
    done = run_program([sys.executable, '-m', 'beam_streams_runner.examples.wordcount',
                        '--runner=DirectRunner', f'--input={words}', f'--output={out}'])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = read_lines(out)
    assert lines, 'the DirectRunner wrote nothing'
    return lines


@pytest.fixture(scope='session')
def local_cluster(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp('cluster'))
    try:
        yield start_cluster(directory)
    finally:
        if os.path.exists(os.path.join(directory, 'cluster.json')):
            stop_cluster(directory)
