"""The errors the runner raises, and how a task's failure reaches the driver.

A failure in user code inside a Spark task is raised there as
`StageExecutionError`, whose message names the Beam step (taken from the SDK
harness's "[while running 'step']" annotation) and carries the user's
traceback. Spark hands the driver a Java exception whose text contains that
message; `pipeline_error_from_spark` cuts it out again so that the launching
program sees the step and the user's traceback, not a Java stack trace.

Python workers that cannot start, or cannot import Beam or the runner (a
worker interpreter without them, on any master), become one short
`WorkerPythonError` naming the interpreter, what it could not import and how
to point Spark at another; the Spark failure behind a converted error goes to
the DEBUG log.
"""

from __future__ import annotations

import contextlib
import logging
import re
import traceback
from collections.abc import Iterator

from beam_streams_runner.failure_hints import failure_hint

_STEP_PATTERN = re.compile(r"while running '([^']*)'")
_ANNOTATION = re.compile(r" \[while running '[^']*'\]")
_MARKER = 'StageExecutionError: '
_NOT_SHARED = re.compile(r'StoreNotSharedError: ([^\n]*)')
# Spark names where a task failed: "Lost task 0.3 in stage 2.0 (TID 9) (host executor 1)".
_LOST_ON = re.compile(r'\(TID \d+\) \((\S+) executor (\w+)\)')
_END_OF_PYTHON_TRACE = re.compile(r'\n\s+at org\.apache\.|\n\tat |\nDriver stacktrace:')

_LOGGER = logging.getLogger(__name__)

# How Spark reports Python workers that could not start. The daemon's stderr, when
# it exits before sending its port, comes back between these two lines.
_WORKER_STDERR = re.compile(r'Error from python worker:\n(.*?)\nPYTHONPATH was:', re.DOTALL)
_DAEMON_EOF = re.compile(r"EOFException occurred while reading the port number from (\S+)'s")
_CANNOT_RUN = re.compile(r'Cannot run program "([^"]*)": error=\d+, ([^\n]*)')
# `python -m module` that does not find the module prints this one line.
_MODULE_SPEC = re.compile(
    r"(\S+): Error while finding module specification for '([^']+)' \((.*)\)")
# The packages every worker needs: a worker that lacks one cannot run any task.
_MISSING_MODULE = re.compile(
    r"(?:ModuleNotFoundError: )?No module named '((?:apache_beam|beam_streams_runner|pyspark)"
    r"(?:\.[\w.]+)?)'")
_WORKER_SETTINGS = ('PYSPARK_PYTHON=/path/to/python or '
                    '--spark_conf spark.pyspark.python=/path/to/python.')


class StreamsSparkRunnerError(RuntimeError):
    """Base class of the errors raised by StreamsSparkRunner."""


class UnsupportedFeatureError(StreamsSparkRunnerError, NotImplementedError):
    """The pipeline uses something this release of the runner cannot run."""


class NonDeterministicKeyCoderError(StreamsSparkRunnerError, ValueError):
    """A grouping step's key coder is not deterministic."""


class UnpicklableUserCodeError(StreamsSparkRunnerError, ValueError):
    """User code cannot be serialized to be shipped to Spark workers."""


class StageExecutionError(StreamsSparkRunnerError):
    """Raised inside a Spark task when a Beam step fails."""

    @classmethod
    def from_exception(cls, exc: BaseException, stage_display_name: str,
                       step: str | None = None) -> StageExecutionError:
        """`step`: the step that failed when the harness's annotation names another (a
        CombineFn runs inside the step feeding it); a hint on what to do follows the
        first line when `failure_hints` knows the failure."""
        text = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        summary = _ANNOTATION.sub('', str(exc)) if step else str(exc)
        steps = _STEP_PATTERN.findall(text)
        step = step or (steps[0] if steps else None)
        where = f"Beam step '{step}'" if step else stage_display_name
        return cls(f'{where} failed: {type(exc).__name__}: {summary}\n'
                   f'{failure_hint(exc, step)}{text}')


class PipelineExecutionError(StreamsSparkRunnerError):
    """The pipeline failed while running; the message names the Beam step."""


class WorkerPythonError(StreamsSparkRunnerError):
    """Spark's Python workers cannot start, or cannot import Beam or the runner."""

    @classmethod
    def cannot_import(cls, python: str, module: str, reason: str) -> WorkerPythonError:
        return cls(f"Spark's Python workers could not start: {python} cannot import {module} "
                   f'({reason}). Install the runner into that interpreter (pip install '
                   f'beam-streams-runner) or point the workers at one that has it: '
                   f'{_WORKER_SETTINGS}')

    @classmethod
    def cannot_start(cls, python: str, reason: str) -> WorkerPythonError:
        return cls(f"Spark's Python workers could not start with {python}: {reason}. "
                   "Point the workers at a Python of the driver's version that has the runner "
                   f'installed: {_WORKER_SETTINGS}')


@contextlib.contextmanager
def stage_failures_named(where: str) -> Iterator[None]:
    """Inside a Spark task: a failure outside the bundles the harness names (a DoFn's
    setup(), run as the harness builds the stage's processor) raised as a
    `StageExecutionError` naming `where`; one already named passes through."""
    try:
        yield
    except StageExecutionError:
        raise
    except Exception as exc:  # noqa: BLE001 - rewrapped with the stage's name
        raise StageExecutionError.from_exception(exc, where) from None


@contextlib.contextmanager
def spark_failures_as_pipeline_errors() -> Iterator[None]:
    """Re-raises a failed Spark action as the error the user should see (both drivers)."""
    try:
        yield
    except Exception as exc:
        error = pipeline_error_from_spark(exc)
        if error is exc:
            raise
        _LOGGER.debug('The Spark failure behind %s:', type(error).__name__, exc_info=exc)
        raise error from None


def pipeline_error_from_spark(exc: BaseException) -> BaseException:
    """Turns a failed Spark action into the error the user should see."""
    text = str(exc)
    not_shared = _NOT_SHARED.search(text)
    if not_shared:
        return StoreNotSharedError(not_shared.group(1))
    start = text.find(_MARKER)
    if start < 0:
        return worker_python_error(text) or exc
    message = text[start + len(_MARKER):]
    end = _END_OF_PYTHON_TRACE.search(message)
    if end:
        message = message[:end.start()]
    return PipelineExecutionError(message.rstrip())


def worker_python_error(text: str) -> WorkerPythonError | None:
    """The short error for a Spark failure whose Python workers could not start, else None."""
    cannot_run = _CANNOT_RUN.search(text)
    if cannot_run and 'PythonWorkerFactory' in text:
        return WorkerPythonError.cannot_start(cannot_run.group(1) + _executor_of(text),
                                              cannot_run.group(2))
    python = _configured_worker_python()
    daemon = _DAEMON_EOF.search(text)
    module = daemon.group(1) if daemon else 'beam_streams_runner.worker.daemon'
    stderr = _WORKER_STDERR.search(text)
    if stderr:
        # The daemon exited before it sent its port; this is its own error output.
        lines = [line.strip() for line in stderr.group(1).splitlines() if line.strip()]
        reason = lines[-1] if lines else 'no error output'
        spec = _MODULE_SPEC.fullmatch(lines[0]) if lines else None
        if spec:
            module, reason = spec.group(2), spec.group(3)
            if spec.group(1) != python:
                python = f'{python} ({spec.group(1)})'  # e.g. `python3`, and which one ran
    elif daemon:
        return WorkerPythonError.cannot_start(
            python + _executor_of(text),
            f"{module} exited before it started; its error output is in the executors' logs")
    elif 'Python worker' in text or 'PythonException' in text:
        # A worker that started (e.g. PySpark's own daemon) but cannot load the task.
        reason = ''
    else:
        return None
    python += _executor_of(text)
    missing = _MISSING_MODULE.search(reason or text)
    if missing:
        module, reason = missing.group(1), missing.group(0).removeprefix('ModuleNotFoundError: ')
    elif not reason:
        return None
    return WorkerPythonError.cannot_import(python, module, reason)


def _executor_of(text: str) -> str:
    """' on executor N of host H' for a task that failed on a cluster's executor."""
    lost = _LOST_ON.search(text)
    if lost is None or lost.group(2) == 'driver':
        return ''  # local mode: the driver's host runs the workers
    return f' on executor {lost.group(2)} of host {lost.group(1)}'


def _configured_worker_python() -> str:
    """The interpreter the driver told Spark to start workers with (PySpark's pythonExec)."""
    from pyspark import SparkContext

    return getattr(SparkContext._active_spark_context, 'pythonExec', None) or 'python3'


class InvalidPipelineError(StreamsSparkRunnerError, ValueError):
    """The pipeline breaks a rule of Beam's model; the message says what to change."""


class StoreNotSharedError(StreamsSparkRunnerError):
    """A task does not see the store the driver keeps the run's state in (a directory
    local to the driver's host, on a cluster)."""


class CheckpointStoreUnavailableError(StreamsSparkRunnerError):
    """The checkpoint store cannot be reached or refuses the runner: a fault, not a bug.

    `store` is the store's URL with any password masked, `problem` what failed
    (connection refused, timed out, authentication failed, ...), and the message
    says what to do. The runner may treat it as a transient fault and retry.
    """

    def __init__(self, store: str, problem: str, remedy: str) -> None:
        self.store = store
        self.problem = problem
        self.remedy = remedy
        super().__init__(f'Checkpoint store {store} is unavailable: {problem}. {remedy}')

    def __reduce__(self):
        return (type(self), (self.store, self.problem, self.remedy))
