"""The `PipelineResult` of a run: state, waiting, cancelling and metrics.

A run executes on a driver thread of its own (not a daemon: the interpreter
waits for it, so `p.run()` without `wait_until_finish()` still completes).
`metrics()` answers over the metric totals the tasks sent back through a Spark
accumulator (see `metrics`), so it reflects every finished task while the
pipeline runs and the whole run once it is done.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from apache_beam.runners.runner import PipelineResult, PipelineState

from beam_streams_runner.metrics import MetricTotals, StreamsSparkMetrics

_LOGGER = logging.getLogger(__name__)


class StreamsSparkPipelineResult(PipelineResult):
    def __init__(self, run: Callable[[], None], cancel: Callable[[], None],
                 metric_totals: Callable[[], MetricTotals], on_done: Callable[[], None]) -> None:
        super().__init__(PipelineState.STARTING)
        self._run = run
        self._cancel = cancel
        self._metric_totals = metric_totals
        self._on_done = on_done
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._execute, name='StreamsSparkRunner-driver', daemon=False)

    def start(self) -> StreamsSparkPipelineResult:
        self._state = PipelineState.RUNNING
        self._thread.start()
        return self

    def _execute(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - handed to wait_until_finish
            with self._lock:
                # A run cancelled while in a Spark job ends in that job's cancellation.
                if self._state not in (PipelineState.CANCELLING, PipelineState.CANCELLED):
                    self._state = PipelineState.FAILED
                    self._error = exc
                    _LOGGER.error('Pipeline failed: %s', exc)
        else:
            with self._lock:
                if self._state not in (PipelineState.CANCELLING, PipelineState.CANCELLED):
                    self._state = PipelineState.DONE
        finally:
            self._on_done()

    @property
    def state(self) -> str:
        return self._state

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Waits for the end of the run (at most `duration` milliseconds)."""
        self._thread.join(None if duration is None else duration / 1000.0)
        if self._thread.is_alive():
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
        self._thread.join()
        with self._lock:
            self._state = PipelineState.CANCELLED
            self._error = None
        return self._state

    def metrics(self) -> StreamsSparkMetrics:
        """User metrics (counters, distributions, gauges, string sets, bounded tries)."""
        return StreamsSparkMetrics(self._metric_totals())
