"""The `PipelineResult` of a run: state, waiting, cancelling, draining, metrics, progress.

A run executes on a driver thread of its own (not a daemon: the interpreter
waits for it, so `p.run()` without `wait_until_finish()` still completes).
`metrics()` answers over the metric totals the tasks sent back through a Spark
accumulator (see `metrics`), so it reflects every finished task while the
pipeline runs and the whole run once it is done.

`drain()` stops a streaming run after its running epoch with a last checkpoint
of every consistent region (the state is DRAINING, then DRAINED), so that the
same `--job_name` resumes it; a batch run cannot be drained (as on Dataflow).

Ctrl-C while a run is waited for (in `wait_until_finish`, or by the interpreter
at exit when the program never waited) cancels it: its Spark jobs are
cancelled, the state becomes CANCELLED and one line, `Pipeline cancelled`, goes
to stderr. A program (`python my_pipeline.py`) then exits with status 130,
without a traceback: `wait_until_finish` raises `PipelineInterrupted`, a
`SystemExit` that `except KeyboardInterrupt` catches too. In an interactive
session (a REPL, IPython, Jupyter) Ctrl-C raises a plain `KeyboardInterrupt`
instead, so the session goes on. SIGTERM cancels a batch run the same way, but
drains a streaming one: `Pipeline drained` goes to stderr and the program exits
with status 0 (`PipelineDrained`); a SIGTERM (or Ctrl-C) during the drain
cancels at once. No SIGINT handler is installed (PySpark's own turns Ctrl-C into
a KeyboardInterrupt after cancelling the context's jobs); a SIGTERM handler is,
only while a run is waited for in the main thread, only in place of SIGTERM's
default action, and the previous disposition comes back after (see
docs/decisions.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

from apache_beam.runners.runner import PipelineResult, PipelineState

from beam_streams_runner.errors import UnsupportedFeatureError
from beam_streams_runner.metrics import MetricTotals, StreamsSparkMetrics

_LOGGER = logging.getLogger(__name__)

EXIT_STATUS_CANCELLED = 130  # a shell's status for a program ended by SIGINT (128 + 2)
EXIT_STATUS_DRAINED = 0  # a drained streaming run is a clean stop (docs/decisions.md)
_CANCEL_AGAIN_S = 2.0
# How Spark words a job it cancelled: by job group, all jobs (PySpark's Ctrl-C), the UI.
_SPARK_JOB_CANCELLED = re.compile(r'SPARK_JOB_CANCELLED|Job \d+ cancelled')


class PipelineInterrupted(SystemExit, KeyboardInterrupt):
    """Ctrl-C or SIGTERM cancelled the run `wait_until_finish` waited for. Uncaught,
    the program exits with status 130 and no traceback (a `SystemExit`); code that
    handles Ctrl-C with `except KeyboardInterrupt` still catches it."""


class PipelineDrained(SystemExit):
    """SIGTERM drained the streaming run `wait_until_finish` waited for: it stopped
    after an epoch with a last checkpoint, which the same `--job_name` resumes from.
    Uncaught, the program exits with status 0 and no traceback."""


class _TerminationRequested(BaseException):
    """SIGTERM arrived while a run was waited for in the main thread."""


# Runs whose driver thread is alive, for the interpreter's wait at exit.
_RUNNING: set[StreamsSparkPipelineResult] = set()
_exit_wait = threading.Lock()
_exit_wait_registered = False


class StreamsSparkPipelineResult(PipelineResult):
    def __init__(self, run: Callable[[], None], cancel: Callable[[], None],
                 metric_totals: Callable[[], MetricTotals], on_done: Callable[[], None],
                 progress: Callable[[], list[dict]] = list,
                 drain: Callable[[], None] | None = None,
                 drained: Callable[[], bool] | None = None) -> None:
        """`drain`: asks a streaming run to stop after its running epoch (None: a batch
        run, which cannot be drained); `drained`: whether the run stopped for it (not by
        finishing first; None: it did whenever a drain was asked)."""
        super().__init__(PipelineState.STARTING)
        self._run = run
        self._cancel = cancel
        self._drain = drain
        self._drained = drained or (lambda: True)
        self._metric_totals = metric_totals
        self._on_done = on_done
        self._progress = progress
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._announced = False
        # Set when the run ended. Not `Thread.is_alive()`: on Python 3.11 a join that a
        # signal handler interrupted marks the thread stopped while it still runs.
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._execute, name='StreamsSparkRunner-driver', daemon=False)

    def start(self) -> StreamsSparkPipelineResult:
        self._state = PipelineState.RUNNING
        _RUNNING.add(self)
        _register_exit_wait()
        self._thread.start()
        return self

    def _execute(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - handed to wait_until_finish
            with self._lock:
                # A run cancelled while in a Spark job ends in that job's cancellation,
                # also when Spark cancelled it first (PySpark's Ctrl-C handler, the UI).
                if self._state in (PipelineState.CANCELLING, PipelineState.CANCELLED):
                    pass
                elif _spark_job_cancelled(exc):
                    self._state = PipelineState.CANCELLED
                else:
                    self._state = PipelineState.FAILED
                    self._error = exc
                    _LOGGER.error('Pipeline failed: %s', exc)
        else:
            with self._lock:
                if self._state == PipelineState.DRAINING:
                    # A run that finished before the drain got there is DONE: its
                    # checkpoints are gone, there is nothing to resume.
                    self._state = (PipelineState.DRAINED if self._drained()
                                   else PipelineState.DONE)
                elif self._state not in (PipelineState.CANCELLING, PipelineState.CANCELLED):
                    self._state = PipelineState.DONE
        finally:
            with self._lock:
                if self._state == PipelineState.CANCELLING:  # nobody waits for it any more
                    self._state = PipelineState.CANCELLED
            self._on_done()
            _RUNNING.discard(self)
            self._done.set()

    @property
    def state(self) -> str:
        return self._state

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Waits for the end of the run (at most `duration` milliseconds).

        Ctrl-C meanwhile cancels the run and raises `PipelineInterrupted` (exit status
        130), or `KeyboardInterrupt` in an interactive session; so does SIGTERM for a
        batch run. SIGTERM drains a streaming run and raises `PipelineDrained` (exit
        status 0) once it is DRAINED; a SIGTERM or Ctrl-C during a drain cancels.
        """
        try:
            with _sigterm_interrupts():
                try:
                    self._thread.join(None if duration is None else duration / 1000.0)
                except _TerminationRequested:
                    if self._drain is None or self._state == PipelineState.DRAINING:
                        raise  # a batch run, or a drain already under way: cancel
                    self._drain_on_sigterm()
        except (KeyboardInterrupt, _TerminationRequested) as interrupt:
            self._cancel_on_interrupt(interrupt)
        if not self._done.is_set():
            return self._state
        if self._error is not None:
            raise self._error
        return self._state

    def cancel(self) -> str:
        with self._lock:
            if PipelineState.is_terminal(self._state):
                return self._state
            self._state = PipelineState.CANCELLING
        self._cancel()
        while not self._done.wait(_CANCEL_AGAIN_S):
            # A job submitted just as the run's jobs were cancelled escaped it.
            self._cancel()
        with self._lock:
            self._state = PipelineState.CANCELLED
            self._error = None
        return self._state

    def drain(self) -> str:
        """Drains a streaming run and waits for it: the run stops after its running
        epoch (an epoch a drain waits for longer than --drain_timeout_s is cancelled
        and, with consistent regions on, replayed from the last checkpoint first), takes
        a last checkpoint of every consistent region, waited for until it is durable,
        and ends DRAINED; the same command with the same --job_name resumes it. The
        state is DRAINING meanwhile. With consistent regions off it stops after the
        running epoch all the same, with a warning that nothing was checkpointed.

        Unlike Dataflow's drain, the watermarks do not advance to the end: windows still
        open stay open in the checkpoint and fire in the resumed run.

        Returns the state (that of the end if the run ended before, DONE if it finished
        before the drain got there), raises the run's error if the drain failed. Ctrl-C
        (or SIGTERM) while it waits cancels the run. A batch run cannot be drained, as on
        Dataflow: raises `UnsupportedFeatureError` (use `cancel()`).
        """
        if self._drain is None:
            raise UnsupportedFeatureError(
                'drain() stops a streaming pipeline after its running epoch, with a last '
                'checkpoint to resume from; a batch pipeline has neither epochs nor '
                'checkpoints, so it cannot be drained (as on Dataflow). Use cancel() to '
                'stop it, or let it finish.')
        self._request_drain()
        return self.wait_until_finish()

    def _request_drain(self) -> None:
        with self._lock:
            if (PipelineState.is_terminal(self._state)
                    or self._state in (PipelineState.CANCELLING, PipelineState.DRAINING)):
                return
            self._state = PipelineState.DRAINING
        self._drain()

    def _drain_on_sigterm(self) -> None:
        """SIGTERM while a streaming run was waited for: drains it, says so once and ends
        the program (status 0). A SIGTERM or Ctrl-C meanwhile is raised to the caller,
        which cancels; a failed drain leaves its error to `wait_until_finish`."""
        self._request_drain()
        self._done.wait()
        if self._state != PipelineState.DRAINED:
            return
        with self._lock:
            announce, self._announced = not self._announced, True
        if announce:
            sys.stderr.write('Pipeline drained\n')
            sys.stderr.flush()
        raise PipelineDrained(EXIT_STATUS_DRAINED) from None

    def _cancel_on_interrupt(self, interrupt: BaseException) -> NoReturn:
        """Ctrl-C or SIGTERM while the run was waited for: cancels it, says so once,
        and ends the program (or, in an interactive session, raises KeyboardInterrupt)."""
        try:
            state = self.cancel()
        except (KeyboardInterrupt, _TerminationRequested):
            state = PipelineState.CANCELLING  # pressed again: stop waiting for Spark
        except Exception as exc:  # noqa: BLE001 - e.g. the SparkContext is gone already
            _LOGGER.warning('Cancelling the pipeline failed: %s', exc)
            state = PipelineState.CANCELLING
        if state in (PipelineState.CANCELLING, PipelineState.CANCELLED):
            with self._lock:
                announce, self._announced = not self._announced, True
            if announce:
                sys.stderr.write('Pipeline cancelled\n')
                sys.stderr.flush()
        if isinstance(interrupt, KeyboardInterrupt) and _interactive():
            raise KeyboardInterrupt from None
        if state == PipelineState.CANCELLING:
            _exit_now()  # the driver thread still runs: the interpreter would wait for it
        raise PipelineInterrupted(EXIT_STATUS_CANCELLED) from None

    def metrics(self) -> StreamsSparkMetrics:
        """User metrics (counters, distributions, gauges, string sets, bounded tries)."""
        return StreamsSparkMetrics(self._metric_totals())

    def progress(self) -> list[dict]:
        """The progress of a streaming run: one record per epoch, the last 100, oldest
        first (what Spark's `StreamingQuery.recentProgress` gives). Each is a dict:

        * `epoch`: the epoch's number (0, 1, ...); `timestamp`: when it started (RFC 3339,
          UTC); `duration_ms`: its wall time (its Spark jobs); `read_ms`: the longest a
          source task read in it; `read_budget_ms`: how long source tasks could read.
        * `sources`: per source, `{'elements', 'input_rate_per_s', 'processed_rate_per_s'}`:
          the elements it emitted in the epoch, per second since the previous epoch
          started (Spark's inputRowsPerSecond) and per second of the epoch's duration
          (processedRowsPerSecond). A source is an outermost transform that reads no
          PCollection and whose output another transform reads: `Create`, `Read`,
          `PeriodicImpulse`, `TestStream`.
        * `sinks`: per sink, `{'elements'}`: the elements it received in the epoch. A sink
          is an outermost transform that reads a PCollection and whose outputs no other
          transform reads: a write, a `Map(print)`, a DoFn writing to an external system.
          (Transforms inside a composite count when the composite itself is neither.)
        * `watermark`: `{'stage', 'input_watermark', 'lag_ms'}`: the stage with the lowest
          input watermark (a source's own watermark for a stage reading one), that
          watermark (RFC 3339; None before any data or once all input ended) and how far
          it is behind the wall clock at the epoch's end.
        * `keyed_states`, `timers`: the keyed states and timers alive after the epoch,
          over all stateful steps; `state_bytes_written`: the bytes of the state changes
          (keys and values) the epoch committed.

        A batch run returns []: a bounded pipeline is one Spark job, followed by Spark's
        console progress bar and UI.
        """
        return self._progress()


def _spark_job_cancelled(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it came from) is Spark's cancellation of a job."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _SPARK_JOB_CANCELLED.search(str(exc)):
            return True
        # `raise ... from None` says the exception before is not the cause (the drain
        # timeout: the runner cancelled the epoch, the run failed).
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return False


def _interactive() -> bool:
    """A REPL, `python -i`, IPython or Jupyter: Ctrl-C must not end the session there."""
    if hasattr(sys, 'ps1') or sys.flags.interactive:
        return True
    ipython = sys.modules.get('IPython')
    return ipython is not None and getattr(ipython, 'get_ipython', lambda: None)() is not None


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """In the main thread, SIGTERM interrupts the wait as Ctrl-C does. Only in place
    of SIGTERM's default action: a handler the program installed (or an ignored
    SIGTERM) is left alone; the default comes back after."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def terminate(signum, frame) -> NoReturn:
        raise _TerminationRequested()

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _register_exit_wait() -> None:
    """Makes the interpreter wait for the runs at exit through `wait_until_finish`,
    before it joins their driver threads itself (where Ctrl-C would only print a
    traceback from inside `threading`)."""
    global _exit_wait_registered
    with _exit_wait:
        if _exit_wait_registered:
            return
        register = getattr(threading, '_register_atexit', None)  # what concurrent.futures uses
        if register is not None:
            with contextlib.suppress(RuntimeError):  # the interpreter is already exiting
                register(_wait_for_runs_at_exit)
        _exit_wait_registered = True


def _wait_for_runs_at_exit() -> None:
    for result in list(_RUNNING):
        try:
            result.wait_until_finish()
        except PipelineDrained:
            # Only os._exit sets the exit status once the program has ended.
            _exit_now(EXIT_STATUS_DRAINED)
        except (KeyboardInterrupt, SystemExit):
            _exit_now()
        except Exception:  # noqa: BLE001 - a failed run was logged by its thread
            pass


def _exit_now(status: int = EXIT_STATUS_CANCELLED) -> NoReturn:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
