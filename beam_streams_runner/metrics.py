"""User metrics gathered from Spark tasks and queried from the pipeline result.

A task folds the metric cells of every harness bundle it runs (`MetricCells`),
turns them into Fn API MonitoringInfos once, merges those (`MetricTotals`) and
sends the totals to the driver through a Spark accumulator, where the totals of
all tasks are merged again. Merging follows each metric kind's own rule
(counters add up, distributions and gauges and string sets and bounded tries
`combine`), so a string set seen in two tasks is the union, not the last one.
The streaming driver adds gauges of its own (`RUNNER_NAMESPACE`): per stateful
step, the live keyed states, timers and pushed-back side-input elements summed
over its partitions after each epoch. `StreamsSparkMetrics` answers Beam's
`MetricResults.query` over the merged totals (Beam's `FnApiMetrics` query).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from apache_beam.metrics.cells import GaugeData, GaugeResult, HistogramCell
from apache_beam.metrics.execution import MetricKey
from apache_beam.metrics.metricbase import MetricName
from apache_beam.runners.portability import portable_metrics
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiMetrics
from pyspark import AccumulatorParam

RUNNER_NAMESPACE = 'StreamsSparkRunner'


def _combine(a, b):
    if isinstance(a, int):
        return a + b
    if isinstance(a, (set, frozenset)):
        return a | b
    data = getattr(a, 'data', None)
    if data is not None and hasattr(data, 'combine'):
        return type(a)(data.combine(b.data))
    return a.combine(b)


class MetricTotals:
    """Merged user metrics: counters, distributions, gauges, string sets, tries."""

    def __init__(self) -> None:
        self.parts: tuple[dict, dict, dict, dict, dict] = ({}, {}, {}, {}, {})

    def add_monitoring_infos(self, infos: Iterable) -> None:
        self._merge(portable_metrics.from_monitoring_infos(infos, user_metrics_only=True))

    def set_gauge(self, step: str, namespace: str, name: str, value: int) -> None:
        """Sets a gauge measured by the runner itself (e.g. live keyed states)."""
        key = MetricKey(step, MetricName(namespace, name))
        self._merge(({}, {}, {key: GaugeResult(GaugeData(value, time.time()))}, {}, {}))

    def merge(self, other: MetricTotals) -> MetricTotals:
        self._merge(other.parts)
        return self

    def __bool__(self) -> bool:
        return any(self.parts)

    def _merge(self, parts) -> None:
        for store, part in zip(self.parts, parts, strict=True):
            for key, value in part.items():
                store[key] = value if key not in store else _combine(store[key], value)


class MetricCells:
    """The user metric cells of the harness bundles a task ran, folded per step.

    Building and parsing the MonitoringInfo protos of every bundle was 6% of the
    worker time of a ParDo at bundle size 10; a fold is one `combine` per cell, and
    the protos are built once per task (`take`), as Beam's own containers build them.
    """

    def __init__(self) -> None:
        self._cells: dict[tuple[str, object], object] = {}

    def fold(self, transform_id: str, cells: dict) -> None:
        """Adds one bundle's cells (a harness operation's `metrics_container.metrics`)."""
        for key, cell in cells.items():
            if isinstance(cell, HistogramCell):
                continue  # worker-local in Beam: it has no MonitoringInfo
            held = self._cells.get((transform_id, key))
            # combine() returns a new cell, so the bundle's own (reset when its
            # processor is released) is never held.
            self._cells[(transform_id, key)] = cell.combine(
                type(cell)() if held is None else held)

    def take(self) -> MetricTotals | None:
        """The totals of the cells folded since the last call, or None if none were."""
        if not self._cells:
            return None
        totals = MetricTotals()
        totals.add_monitoring_infos(
            cell.to_runner_api_monitoring_info(key.metric_name, transform_id)
            for (transform_id, key), cell in self._cells.items())
        self._cells = {}
        return totals


class MetricTotalsAccumulator(AccumulatorParam):
    """Spark accumulator merging the `MetricTotals` of tasks."""

    def zero(self, value: MetricTotals) -> MetricTotals:
        return MetricTotals()

    def addInPlace(self, value1: MetricTotals, value2: MetricTotals) -> MetricTotals:
        return value1.merge(value2)


class StreamsSparkMetrics(FnApiMetrics):
    """Beam `MetricResults` over merged totals (committed == attempted)."""

    def __init__(self, totals: MetricTotals) -> None:
        # FnApiMetrics.query reads these five maps; they are filled from the
        # merged totals instead of from per-stage MonitoringInfos.
        (self._counters, self._distributions, self._gauges, self._string_sets,
         self._bounded_tries) = (dict(part) for part in totals.parts)
        self._user_metrics_only = True
        self._monitoring_infos = {}
