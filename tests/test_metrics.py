"""`MetricCells`: a task's fold of the harness bundles' metric cells."""

from apache_beam.metrics.cells import DistributionData, HistogramCell
from apache_beam.metrics.execution import MetricKey, MetricsContainer
from apache_beam.metrics.metricbase import MetricName
from apache_beam.utils.histogram import LinearBucket

from beam_streams_runner.metrics import MetricCells, StreamsSparkMetrics


def _bundle(container: MetricsContainer, count: int, values: list[int], word: str) -> None:
    container.get_counter(MetricName('ns', 'count')).inc(count)
    for value in values:
        container.get_distribution(MetricName('ns', 'dist')).update(value)
    container.get_gauge(MetricName('ns', 'gauge')).set(values[-1])
    container.get_string_set(MetricName('ns', 'words')).add(word)


def test_cells_of_bundles_fold_into_one_total_per_step():
    container = MetricsContainer('step')  # one harness operation, reused by bundles
    folded = MetricCells()
    _bundle(container, 3, [5, 1], 'a')
    folded.fold('step', container.metrics)
    container.reset()  # what releasing the bundle processor does
    _bundle(container, 4, [7], 'b')
    folded.fold('step', container.metrics)
    totals = folded.take()
    results = StreamsSparkMetrics(totals).query()
    key = MetricKey('step', MetricName('ns', 'count'))
    assert [(r.key, r.committed) for r in results['counters']] == [(key, 7)]
    (dist,) = results['distributions']
    assert dist.committed.data == DistributionData(13, 3, 1, 7)
    (gauge,) = results['gauges']
    assert gauge.committed.value == 7
    (words,) = results['string_sets']
    assert words.committed == {'a', 'b'}
    assert folded.take() is None  # taken: nothing left


def test_held_cells_do_not_follow_the_bundle_cells_after_their_reset():
    container = MetricsContainer('s')
    folded = MetricCells()
    counter = container.get_counter(MetricName('ns', 'n'))
    counter.inc(2)
    folded.fold('s', container.metrics)
    container.reset()
    counter.inc(100)  # the next bundle's, not folded
    (result,) = StreamsSparkMetrics(folded.take()).query()['counters']
    assert result.committed == 2


def test_histograms_have_no_monitoring_info_and_are_left_out():
    folded = MetricCells()
    folded.fold('s', {'h': HistogramCell(LinearBucket(0, 1, 10))})
    assert folded.take() is None
