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
        return 7
    print('returned', fault_points.late_write(int(sys.argv[2]), int(sys.argv[3]),
                                              sys.argv[4], write), flush=True)
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


def test_a_late_write_comes_from_a_zombie_after_the_next_attempt_wrote(tmp_path):
    written, marker = tmp_path / 'written', tmp_path / 'zombie'
    late = {fault_points.LATE_WRITE_ENV: f'5:30:{marker}', 'WRITTEN': str(written)}
    died = run('late', '5', '0', 'task-a', **late)
    assert died.returncode == -signal.SIGKILL and 'returned' not in died.stdout
    time.sleep(0.5)
    assert not written.exists(), 'the zombie wrote before the next attempt'
    # Another task's next attempt does not wake this task's zombie.
    assert run('late', '5', '1', 'task-b', **late).stdout.strip() == 'returned 7'
    time.sleep(0.5)
    assert not list(tmp_path.glob('zombie.*'))
    assert run('late', '5', '1', 'task-a', **late).stdout.strip() == 'returned 7'
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob('zombie.*')) and time.monotonic() < deadline:
        time.sleep(0.05)
    [mark] = list(tmp_path.glob('zombie.*'))
    assert 'epoch 5 attempt 0 wrote at' in mark.read_text()
    writes = [line.split() for line in written.read_text().splitlines()]
    assert [emptied for _, emptied in writes] == ['emptied=False'] * 2 + ['emptied=True']
    assert mark.name == f'zombie.{writes[-1][0]}'
    # Another epoch, or no test asking: the write goes on as usual.
    assert run('late', '4', '0', 'task-a', **late).stdout.strip() == 'returned 7'
    assert run('late', '5', '0', 'task-a', WRITTEN=str(written)).stdout.strip() == 'returned 7'
    assert len(written.read_text().splitlines()) == 5


def test_a_zombie_without_a_next_attempt_writes_when_its_wait_is_over(tmp_path):
    written, marker = tmp_path / 'written', tmp_path / 'zombie'
    late = {fault_points.LATE_WRITE_ENV: f'2:0.3:{marker}', 'WRITTEN': str(written)}
    assert run('late', '2', '0', 'task', **late).returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob('zombie.*')) and time.monotonic() < deadline:
        time.sleep(0.05)
    [mark] = list(tmp_path.glob('zombie.*'))
    assert 'wrote, no later attempt having written' in mark.read_text()
    assert written.read_text().split()[1] == 'emptied=True'
