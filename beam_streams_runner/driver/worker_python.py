"""Which Python interpreter Spark's Python workers run, and whether it can run them.

PySpark starts its workers with `PYSPARK_PYTHON`, else the first `python3` on
PATH; it reads that once, when the SparkContext starts, and ignores
`spark.pyspark.python` in a session started from Python (that property is read
only by `spark-submit`). A driver started as `venv/bin/python` without
activating the virtualenv therefore gets workers that run some other
`python3`, which cannot import Beam or the runner: the daemon module
(`beam_streams_runner.worker.daemon`) fails to start and the driver gets a long
Java trace.

For a session the runner starts itself, `worker_python()` picks the
interpreter: the user's choice (`--spark_conf spark.pyspark.python=...`, then
`PYSPARK_PYTHON`, Spark's own precedence) on any master; else, on a local
master, the driver's own `sys.executable`, which runs the runner already. On
other masters the executors' Python is the cluster's business and is left to
PySpark. An interpreter other than the driver's, on a local master, is probed
first (`check_worker_python`): one short subprocess that starts it and looks
for `apache_beam` and `beam_streams_runner` without importing them, so that a
wrong choice fails before any JVM starts with a `WorkerPythonError` saying
which interpreter, what it lacks and how to fix it. Failures the probe cannot
see (remote executors, a package that is found but does not import) are
recognized in Spark's error by `errors.pipeline_error_from_spark`.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Mapping

from beam_streams_runner.errors import WorkerPythonError

__all__ = ['PYTHON_CONF', 'check_worker_python', 'is_local_master', 'worker_python']

_LOGGER = logging.getLogger(__name__)

PYTHON_CONF = 'spark.pyspark.python'
PROBE_TIMEOUT_S = 60.0

# `local`, `local[N]`, `local[N,F]`, `local[*]`, `local-cluster[...]`: all run the
# workers on this machine, where the driver's interpreter exists.
_LOCAL_MASTER = re.compile(r'local(\[[^\]]*\]|-cluster\[[^\]]*\])?')

# What the workers need, in the order a worker imports them. Only located, not
# imported: importing Beam takes seconds, locating it a few milliseconds, and a
# package that is found but fails to import still gets the short error, from
# Spark's failure. The version comes first, in syntax Python 2 runs too, so that an
# old interpreter is reported as such.
_PROBE = '''
import sys
print('version %d.%d' % sys.version_info[:2])
import importlib.util
for name in ('apache_beam', 'beam_streams_runner'):
    if importlib.util.find_spec(name) is None:
        print('missing ' + name)
        break
'''


def is_local_master(master: str) -> bool:
    """Whether `master` runs Spark's executors on this machine (local, local-cluster)."""
    return _LOCAL_MASTER.fullmatch(master.strip()) is not None


def worker_python(master: str, conf: Mapping[str, str],
                  environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """The workers' interpreter for a session the runner starts, and who chose it.

    None leaves the choice to PySpark (a non-local master, nothing configured).
    """
    if conf.get(PYTHON_CONF):
        return conf[PYTHON_CONF], f'--spark_conf {PYTHON_CONF}'
    if environ.get('PYSPARK_PYTHON'):
        return environ['PYSPARK_PYTHON'], 'PYSPARK_PYTHON'
    if is_local_master(master) and sys.executable:
        return sys.executable, "the driver's interpreter"
    return None


def check_worker_python(python: str, chosen_by: str = '',
                        timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Checks that `python` starts, is the driver's Python version and finds Beam and the runner.

    Raises WorkerPythonError otherwise. Meant for local masters: it runs `python` here.
    """
    if python == sys.executable:
        return  # The driver's own interpreter runs the runner already.
    named = f'{python} (set by {chosen_by})' if chosen_by else python
    try:
        probe = subprocess.run([python, '-c', _PROBE], capture_output=True, text=True,
                               errors='replace', timeout=timeout_s, stdin=subprocess.DEVNULL,
                               check=False)
    except OSError as exc:
        raise WorkerPythonError.cannot_start(named, exc.strerror or str(exc)) from None
    except subprocess.TimeoutExpired:
        # A slow machine is no reason to refuse the run; Spark's error stays the backstop.
        _LOGGER.warning('%s did not answer within %g s; starting Spark without checking it',
                        named, timeout_s)
        return
    found = dict(line.split(' ', 1) for line in probe.stdout.splitlines() if ' ' in line)
    driver_version = '%d.%d' % sys.version_info[:2]
    if found.get('version', driver_version) != driver_version:
        raise WorkerPythonError.cannot_start(
            named, f'it is Python {found["version"]}, the driver is Python {driver_version}, '
            'and PySpark needs the same minor version on both')
    if probe.returncode != 0 or 'version' not in found:
        last = (probe.stderr.strip().splitlines() or [f'exit code {probe.returncode}'])[-1]
        raise WorkerPythonError.cannot_start(named, last)
    if 'missing' in found:
        module = found['missing']
        raise WorkerPythonError.cannot_import(named, module, f'No module named {module!r}')
