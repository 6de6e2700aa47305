"""The errors the runner raises, and how a task's failure reaches the driver.

A failure in user code inside a Spark task is raised there as
`StageExecutionError`, whose message names the Beam step (taken from the SDK
harness's "[while running 'step']" annotation) and carries the user's
traceback. Spark hands the driver a Java exception whose text contains that
message; `pipeline_error_from_spark` cuts it out again so that the launching
program sees the step and the user's traceback, not a Java stack trace.
"""

from __future__ import annotations

import contextlib
import re
import traceback
from collections.abc import Iterator

_STEP_PATTERN = re.compile(r"while running '([^']*)'")
_MARKER = 'StageExecutionError: '
_END_OF_PYTHON_TRACE = re.compile(r'\n\s+at org\.apache\.|\n\tat |\nDriver stacktrace:')


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
    def from_exception(cls, exc: BaseException, stage_display_name: str) -> StageExecutionError:
        text = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        steps = _STEP_PATTERN.findall(text)
        where = f"Beam step '{steps[0]}'" if steps else stage_display_name
        return cls(f'{where} failed: {type(exc).__name__}: {exc}\n{text}')


class PipelineExecutionError(StreamsSparkRunnerError):
    """The pipeline failed while running; the message names the Beam step."""


@contextlib.contextmanager
def spark_failures_as_pipeline_errors() -> Iterator[None]:
    """Re-raises a failed Spark action as the error the user should see (both drivers)."""
    try:
        yield
    except Exception as exc:
        error = pipeline_error_from_spark(exc)
        if error is exc:
            raise
        raise error from None


def pipeline_error_from_spark(exc: BaseException) -> BaseException:
    """Turns a failed Spark action into the error the user should see."""
    text = str(exc)
    start = text.find(_MARKER)
    if start < 0:
        return exc
    message = text[start + len(_MARKER):]
    end = _END_OF_PYTHON_TRACE.search(message)
    if end:
        message = message[:end.start()]
    return PipelineExecutionError(message.rstrip())
