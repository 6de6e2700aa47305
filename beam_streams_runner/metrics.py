"""User metrics gathered from Spark tasks and queried from the pipeline result.

Every harness bundle reports its metrics as Fn API MonitoringInfos; a task
merges them (`MetricTotals`) and sends the totals to the driver through a Spark
accumulator, where the totals of all tasks are merged again. Merging follows
each metric kind's own rule (counters add up, distributions and gauges and
string sets and bounded tries `combine`), so a string set seen in two tasks is
the union, not the last one. The streaming driver adds gauges of its own
(`RUNNER_NAMESPACE`): per stateful step, the live keyed states, timers and
pushed-back side-input elements summed over its partitions after each epoch.
`StreamsSparkMetrics` answers Beam's
`MetricResults.query` over the merged totals (Beam's `FnApiMetrics` query).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from apache_beam.metrics.cells import GaugeData, GaugeResult
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
