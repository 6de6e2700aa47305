"""The smoke subset on PySpark 3.5, the long-term line most managed clusters run: a
batch, a streaming and a stateful streaming pipeline, each a program of its own run by
a virtualenv that has PySpark 3.5 over this environment (Beam and the runner come from
here), compared with the DirectRunner or with the fault tests' golden output.

The virtualenv is made once per machine, in the user's cache directory (PySpark 3.5 is
a 320 MB download).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.cluster.fixtures import read_lines, run_program
from tests.faults import harness, judging

PYSPARK_35 = '3.5.9'


@pytest.fixture(scope='module')
def python_35() -> str:
    cache = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
    venv = os.path.join(cache, 'beam-streams-runner', f'pyspark-{PYSPARK_35}-py'
                        f'{sys.version_info[0]}{sys.version_info[1]}')
    python = os.path.join(venv, 'bin', 'python')
    probe = [python, '-c', 'import pyspark, apache_beam, beam_streams_runner; '
                           'print(pyspark.__version__)']
    if not (os.path.exists(python) and run_program(probe).stdout.strip() == PYSPARK_35):
        subprocess.run([sys.executable, '-m', 'venv', '--clear', '--system-site-packages',
                        venv], check=True)
        done = subprocess.run([python, '-m', 'pip', 'install', '--quiet', '--no-deps',
                               '--disable-pip-version-check', f'pyspark=={PYSPARK_35}'],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    found = run_program(probe)
    assert found.stdout.strip() == PYSPARK_35, found.stderr[-3000:]
    return python


def test_batch_word_count_on_pyspark_35(python_35, words, words_direct, tmp_path):
    out = str(tmp_path / 'counts')
    done = run_program([python_35, '-m', 'beam_streams_runner.examples.wordcount',
                        '--runner=StreamsSparkRunner', '--spark_master=local[2]',
                        f'--input={words}', f'--output={out}'])
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_lines(out) == words_direct


@pytest.mark.parametrize('pipeline', ['combine', 'stateful'])
def test_streaming_on_pyspark_35(python_35, tmp_path, pipeline):
    """P2 (keyed count in windows) and P4 (a stateful DoFn with both kinds of timers),
    with consistent regions on, exactly their golden output."""
    run_id = uuid.uuid4().hex[:8]
    spec = harness.Spec(pipeline, 'files', str(tmp_path / 'out'), 0)
    spec_file = harness.write_spec(spec, str(tmp_path / 'spec.json'))
    flags = harness.runner_flags(f'pyspark35-{run_id}', str(tmp_path / 'store'))
    done = run_program([python_35, harness.__file__, spec_file, '--runner=StreamsSparkRunner',
                        *flags])
    assert done.returncode == 0, done.stderr[-3000:]
    judging.check_exact(harness.read_spec(spec_file), None)
