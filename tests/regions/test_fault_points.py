"""The fault points the fault tests kill the driver at, and the zombie task attempt.

Each case runs a small program of its own: a point that fires SIGKILLs its process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from beam_streams_runner.regions import fault_points

PROGRAM = '''
import os, sys
from beam_streams_runner.regions import fault_points
what = sys.argv[1]
if what == 'point':
    for _ in range(3):
        fault_points.reached('during_reset')
        print('passed', flush=True)
else:
    def write(emptied):
        with open(os.environ['WRITTEN'], 'a') as f:
            f.write(f'{os.getpid()} emptied={emptied}\\n')
    fault_points.late_write(int(sys.argv[2]), int(sys.argv[3]), write)
    print('returned', flush=True)
'''


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The program's exit and output; its output goes through files, not pipes: a zombie
    holding a pipe would keep `subprocess.run` waiting for it."""
    environment = {k: v for k, v in os.environ.items()
                   if k not in (fault_points.KILL_AT_ENV, fault_points.LATE_WRITE_ENV)}
    with tempfile.TemporaryFile('w+') as out, tempfile.TemporaryFile('w+') as err:
        done = subprocess.run([sys.executable, '-c', PROGRAM, *args], stdout=out,
                              stderr=err, timeout=60, env={**environment, **env})
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(done.args, done.returncode, out.read(), err.read())


def test_a_point_kills_the_process_the_nth_time_it_is_reached():
    assert run('point').stdout.count('passed') == 3
    second = run('point', **{fault_points.KILL_AT_ENV: 'during_reset:2'})
    assert second.returncode == -signal.SIGKILL and second.stdout.count('passed') == 1
    assert 'killing the driver at during_reset (time 2)' in second.stderr
    other = run('point', **{fault_points.KILL_AT_ENV: 'after_commit_record'})
    assert other.returncode == 0


def test_a_late_write_comes_from_a_zombie_after_the_attempt_died(tmp_path):
    written, marker = tmp_path / 'written', tmp_path / 'zombie'
    late = {fault_points.LATE_WRITE_ENV: f'5:0.5:{marker}', 'WRITTEN': str(written)}
    died = run('late', '5', '0', **late)
    assert died.returncode == -signal.SIGKILL and 'returned' not in died.stdout
    assert not written.exists(), 'written before the attempt died'
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob('zombie.*')) and time.monotonic() < deadline:
        time.sleep(0.05)
    [mark] = list(tmp_path.glob('zombie.*'))
    assert 'epoch 5 attempt 0 wrote' in mark.read_text()
    pid, emptied = written.read_text().split()
    assert mark.name == f'zombie.{pid}' and emptied == 'emptied=True'
    # Another epoch, a later attempt, or no test asking: the write goes on as usual.
    for args in (('4', '0'), ('5', '1')):
        assert run('late', *args, **late).stdout.strip() == 'returned'
    assert run('late', '5', '0', WRITTEN=str(written)).stdout.strip() == 'returned'
    assert len(written.read_text().splitlines()) == 1
