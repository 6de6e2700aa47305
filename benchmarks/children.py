"""How a benchmark starts a run in a child process: from the repository, with the
repository on the import path (the driver and PySpark's Python workers import the
benchmarks' own modules), and with whatever environment the run asks for."""

from __future__ import annotations

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment, the repository first on PYTHONPATH, plus `extra`."""
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO_ROOT, env.get('PYTHONPATH')]))
    env.update(extra)
    return env
