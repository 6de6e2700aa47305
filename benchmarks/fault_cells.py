"""One cell of the fault matrix: its setup, its runs and its verdict.

Design section 12. `CellRunner.run(cell)` makes a fresh job for the cell (its
folder, spec, checkpoint store and runner flags), injects the cell's fault (in the
spec, in the driver's environment, or on a redis-server of the cell's own), runs
the spec's program once or, when the fault ends the driver, twice, and judges the
sinks' output against the golden output (`tests/faults/judging.py`). The families
and their places are `benchmarks/faults.py`'s.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import signal
import subprocess
import time
import traceback
import uuid
from types import SimpleNamespace

from tests.faults import harness, judging
from tests.faults.injection import Fault, StoreFault

MAX_RESETS = 5
DRAIN_TIMEOUT_S = 4  # F8, F12: an epoch longer than this is cancelled
PAUSE_S = DRAIN_TIMEOUT_S + 3
LATE_WRITE_WAIT_S = 30  # F10: a zombie's wait for the next attempt's write, at most
STORE_DB, SINK_DB = 2, 3
KILLED = -signal.SIGKILL
RUN_TIMEOUT_S = 300
# Families whose first run must end with the driver SIGKILLed, then run again (F9: to
# fail on the wiped store).
DRIVER_KILLS = ('F3', 'F4', 'F9')


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the matrix."""

    pipeline: str
    sink: str
    fault: str  # F1..F12
    place: str  # where the fault hits: source/keyed/published, a protocol point, k=...
    at: int  # the element (F1-F3, F5, F6, F11, F12), the point's occurrence (F4, F9) or
    # the epoch (F10)
    store: str  # 'file' | 'redis'
    mode: str  # 'blocking' | 'non_blocking'
    seed: int

    @property
    def name(self) -> str:
        return (f'{self.fault} {self.pipeline}/{self.sink} {self.place}@{self.at} '
                f'{self.store}/{self.mode} seed {self.seed}')


@dataclasses.dataclass
class Outcome:
    cell: Cell
    passed: bool
    outcome: str  # exact, failed as expected, or what went wrong
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    leftovers: int = 0
    wall_s: float = 0.0
    runs: int = 1
    log: str = ''


@dataclasses.dataclass
class Setup:
    """A cell's job: its spec file, flags, environment faults and own redis-server."""

    folder: str
    spec_file: str
    flags: list[str]
    store: str  # the store's URL or directory
    kill_at: str | None = None
    late_write: str | None = None
    server: object | None = None  # the cell's own RedisServer (F7-F9 with Redis)


class CellRunner:
    """Runs cells, each in a fresh job, against one redis-server (see the docstring)."""

    def __init__(self, work: str, redis_server) -> None:
        self.work = work
        self.redis = redis_server

    def run(self, cell: Cell) -> Outcome:
        """The cell's outcome; an error of the matrix itself fails the cell, not the
        matrix (its traceback is the cell's log)."""
        try:
            return self._run_cell(cell)
        except Exception:  # noqa: BLE001 - reported as the cell's outcome
            trace = traceback.format_exc()
            return Outcome(cell, False, f'the matrix failed: {trace.splitlines()[-1]}',
                           log=trace)

    def _run_cell(self, cell: Cell) -> Outcome:
        setup = self._setup(cell)
        server = setup.server or self.redis
        client = server.client(db=SINK_DB)
        started = time.monotonic()
        try:
            runs, extra = self._runs(cell, setup, client)
            wall = time.monotonic() - started
            spec = harness.read_spec(setup.spec_file)  # its start, set by the first run
            log = '\n'.join(f'--- run {n + 1}: exit {r.returncode}\n{r.stderr}'
                            for n, r in enumerate(runs))
            result = self._judge(cell, spec, runs, client, setup, extra)
        finally:
            client.close()
            if setup.server is not None:
                setup.server.close()
        result.wall_s, result.runs, result.log = round(wall, 1), len(runs), log
        return result

    # Setup -----------------------------------------------------------------------------
    def _setup(self, cell: Cell) -> Setup:
        run_id = uuid.uuid4().hex[:8]
        folder = os.path.join(self.work, run_id)
        os.makedirs(folder)
        server = None
        if cell.fault in ('F7', 'F8') or (cell.fault == 'F9' and cell.store == 'redis'):
            from beam_streams_runner.stores.redis_server import RedisServer
            server = RedisServer().start()
        redis = server or self.redis
        out = (redis.url_of(SINK_DB) if cell.sink == 'redis'
               else os.path.join(folder, 'out', 'out'))
        store = (redis.url_of(STORE_DB) if cell.store == 'redis'
                 else os.path.join(folder, 'store'))
        spec = harness.Spec(cell.pipeline, cell.sink, out, 0, key_prefix=f'{run_id}:',
                            fault=self._fault(cell, os.path.join(folder, 'fault')))
        extra = [f'--max_consecutive_reset_attempts={MAX_RESETS}']
        if cell.fault in ('F8', 'F12'):
            extra.append(f'--drain_timeout_s={DRAIN_TIMEOUT_S}')
        setup = Setup(folder, harness.write_spec(spec, os.path.join(folder, 'spec.json')),
                      harness.runner_flags(f'matrix-{run_id}', store, mode=cell.mode,
                                           extra=extra), store, server=server)
        if cell.fault in ('F4', 'F9'):
            setup.kill_at = (f'{cell.place}:{cell.at}' if cell.fault == 'F4'
                             else f'after_commit_record:{cell.at}')
        if cell.fault == 'F10':
            setup.late_write = f'{cell.at}:{LATE_WRITE_WAIT_S}:{os.path.join(folder, "zombie")}'
        return setup

    @staticmethod
    def _fault(cell: Cell, marker: str) -> Fault | None:
        """The fault the spec's DoFns inject (none for the driver's and the store's)."""
        family = cell.fault
        # A raise fails every attempt of one whole epoch (F6: k epochs): the region resets.
        if family == 'F4':
            return (Fault('raise', marker, 350, 'source', 1, whole_epochs=True)
                    if cell.place == 'during_reset' else None)
        if family in ('F2', 'F5'):
            return Fault('raise', marker, cell.at, cell.place, 1, whole_epochs=True)
        if family in ('F1', 'F3'):
            kind = 'kill_worker' if family == 'F1' else 'kill_driver'
            return Fault(kind, marker, cell.at, cell.place, 1)
        if family == 'F6':
            resets = int(cell.place.partition('=')[2])
            return Fault('raise', marker, cell.at, 'source', resets, whole_epochs=True)
        if family == 'F11':
            return Fault('kill_worker', marker, cell.at, 'publish', 1)
        if family == 'F12':
            return Fault('sleep', marker, cell.at, cell.place, 1)
        return None

    # Runs ------------------------------------------------------------------------------
    def _runs(self, cell: Cell, setup: Setup, client) -> tuple[list, dict]:
        """The cell's runs (a second one after a driver kill) and what the judge needs
        besides: the store fault's thread, the output before a wiped store's run."""
        extra: dict = {}
        store_fault = None
        if cell.fault in ('F7', 'F8'):
            spec = harness.read_spec(setup.spec_file)
            region = next((flag.split('=')[1] for flag in harness.pipeline_flags(spec)
                           if flag.startswith('--consistent_region=')), 'default')
            job = next(f.split('=', 1)[1] for f in setup.flags if f.startswith('--job_name='))
            action, down = (('kill', float(cell.place[5:-1])) if cell.fault == 'F7'
                            else ('pause', PAUSE_S))
            store_fault = extra['store_fault'] = StoreFault(
                setup.server, job, action, down, db=STORE_DB, region=region)
            store_fault.start()
        try:
            runs = [_run(setup, setup.kill_at, setup.late_write)]
        finally:
            if store_fault is not None:
                store_fault.stop.set()
                store_fault.join(60)
        if cell.fault in DRIVER_KILLS and runs[0].returncode == KILLED:
            if cell.fault == 'F9':
                spec = harness.read_spec(setup.spec_file)
                extra['before'] = _snapshot(spec, client)
                self._wipe(setup)
            runs.append(_run(setup))
        return runs, extra

    @staticmethod
    def _wipe(setup: Setup) -> None:
        if setup.server is not None:
            wiper = setup.server.client(db=STORE_DB)
            try:
                wiper.flushdb()
            finally:
                wiper.close()
        else:
            shutil.rmtree(setup.store)

    # Verdict ---------------------------------------------------------------------------
    def _judge(self, cell: Cell, spec, runs, client, setup: Setup, extra: dict) -> Outcome:
        expected_error = _expected_error(cell)
        # A run that must fail published part of the output: P3's last panes may be early.
        comparison = judging.compare(spec, client, partial=expected_error is not None)
        counts = dict(lost=comparison.lost, duplicated=comparison.duplicated,
                      wrong=comparison.wrong, leftovers=comparison.leftovers)

        def failed(why: str) -> Outcome:
            return Outcome(cell, False, why, **counts)

        if any(r.returncode == 'timeout' for r in runs):
            return failed(f'timed out after {RUN_TIMEOUT_S} s (killed)')
        last = runs[-1]
        if cell.fault in DRIVER_KILLS and runs[0].returncode != KILLED:
            return failed(f'the driver was not killed (exit {runs[0].returncode})')
        if expected_error is not None:
            if last.returncode == 0:
                return failed(f'ran to the end instead of failing with {expected_error[0]}')
            if not any(text in last.stderr for text in expected_error):
                return failed(f'failed without {expected_error[0]} (exit {last.returncode})')
            if comparison.duplicated or comparison.wrong:
                return failed('published twice or wrong before failing')
            if 'before' in extra and _snapshot(spec, client) != extra['before']:
                return failed('the run after the wipe changed the output')
            return Outcome(cell, True, 'failed as expected', **dict(counts, lost=0))
        if last.returncode != 0:
            return failed(f'run failed (exit {last.returncode})')
        missing = _fault_missing(cell, spec, setup, last.stderr, extra)
        if missing:
            return failed(missing)
        if not comparison.exact:
            return failed('; '.join(comparison.problems)[:300])
        return Outcome(cell, True, 'exact', **counts)


def _run(setup: Setup, kill_at: str | None = None, late_write: str | None = None):
    """One run of the cell's program; a run past `RUN_TIMEOUT_S` is killed and reported
    as `returncode='timeout'` (one stuck cell must not end the matrix)."""
    try:
        return harness.run_subprocess(setup.spec_file, setup.flags, kill_at=kill_at,
                                      late_write=late_write, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors='replace') if isinstance(exc.stderr, bytes) \
            else (exc.stderr or '')
        return SimpleNamespace(returncode='timeout', stderr=stderr)


def _expected_error(cell: Cell) -> tuple[str, ...] | None:
    """The error a cell's (last) run must end with, in the words it may use."""
    if cell.fault == 'F6' and cell.place == f'k={MAX_RESETS + 1}':
        return ('RegionResetError', f'failed {MAX_RESETS + 1} times')
    if cell.fault == 'F9':
        return ('the store was wiped',)
    return None


def _fault_missing(cell: Cell, spec, setup: Setup, stderr: str, extra: dict) -> str | None:
    """Why the cell's fault did not happen, if it did not (a pass would prove nothing)."""
    if spec.fault is not None and cell.fault != 'F4' and spec.fault.done() == 0:
        return 'the fault never fired'
    if cell.fault == 'F10':
        zombies = [open(path).read() for path in glob.glob(
            os.path.join(setup.folder, 'zombie.*'))]
        if not any(' wrote ' in text for text in zombies):
            return f'no late write landed: {zombies}'
    if cell.fault in ('F7', 'F8'):
        store_fault = extra['store_fault']
        if store_fault.error is not None or store_fault.faulted_at is None:
            return f'the store fault never happened ({store_fault.error})'
    if cell.fault == 'F12' and 'exceeded --drain_timeout_s' not in stderr:
        return 'no epoch went past the drain timeout'
    if cell.fault == 'F8' and ': reset ' not in stderr:
        return 'the store was paused past the drain timeout, yet no epoch failed'
    return None


def _snapshot(spec, client):
    """What the sinks hold now (to compare before and after a refused run)."""
    labels = sorted(harness.golden(spec))
    if spec.sink == 'redis':
        return [judging.read_redis(spec, client, label) for label in labels]
    return [judging.read_files(spec, label) for label in labels]
