"""A streaming run whose driver is SIGKILLed resumes when the same command runs again.

The pipeline (`counting_pipeline.py`, a program of its own) kills its own driver
with SIGKILL at one element, after some consistent cuts; the same command, run
again, resumes from the newest cut in the checkpoint store (state, source
positions), and the counts written when the stream ends are exact.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from tests.faults import counting_pipeline

PIPELINE = counting_pipeline.__file__


def run(out, marker, kill_at, *flags, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, PIPELINE, str(out), str(marker), str(kill_at),
         '--runner=StreamsSparkRunner', '--spark_master=local[2]', '--bundle_size=50',
         '--target_latency_ms=300', *flags],
        capture_output=True, text=True, timeout=600, env=env)


def counts(out) -> list[str]:
    return sorted(line for name in os.listdir(out)
                  for line in open(os.path.join(out, name)).read().splitlines())


@pytest.mark.parametrize('store', ['file', 'redis'])
def test_a_driver_killed_mid_stream_resumes_and_the_counts_are_exact(
        tmp_path, store, request):
    out = tmp_path / 'out'
    out.mkdir()
    marker = tmp_path / 'killed'
    job = f'restart-{uuid.uuid4().hex[:8]}'
    flags = [f'--job_name={job}', '--checkpoint_period_s=0.2']
    if store == 'redis':
        flags.append(f'--checkpoint_store={request.getfixturevalue("redis_server").url}')
    else:
        flags.append(f'--checkpoint_store={tmp_path / "store"}')
    first = run(out, marker, 2000, *flags)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert marker.exists() and not os.listdir(out)
    second = run(out, marker, 2000, *flags)
    assert second.returncode == 0, second.stderr[-3000:]
    assert 'resumes from its checkpoints' in second.stderr
    expected = sorted(str((k, counting_pipeline.ELEMENTS // counting_pipeline.KEYS))
                      for k in range(counting_pipeline.KEYS))
    assert counts(out) == expected
