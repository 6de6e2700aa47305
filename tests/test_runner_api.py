"""StreamsSparkRunner as Beam users reach it: runner names, the result, metrics."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.util import assert_that, equal_to

import beam_streams_runner
from beam_streams_runner import StreamsSparkRunner

pytestmark = pytest.mark.timeout(120)


class _CountingDoFn(beam.DoFn):
    def __init__(self):
        self.elements = Metrics.counter('runner_api_test', 'elements')
        self.sizes = Metrics.distribution('runner_api_test', 'sizes')

    def process(self, element):
        self.elements.inc()
        self.sizes.update(element)
        yield element * 2


def _tiny_pipeline(p):
    doubled = p | beam.Create(range(1, 11)) | beam.ParDo(_CountingDoFn())
    assert_that(doubled, equal_to([2 * i for i in range(1, 11)]))


@pytest.mark.parametrize('runner_name', [
    'StreamsSparkRunner',
    'beam_streams_runner.StreamsSparkRunner',
])
def test_runner_by_name(spark_session, spark_args, runner_name):
    assert beam_streams_runner.StreamsSparkRunner is StreamsSparkRunner
    p = beam.Pipeline(options=PipelineOptions([f'--runner={runner_name}', *spark_args]))
    assert isinstance(p.runner, StreamsSparkRunner)
    _tiny_pipeline(p)
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.state == PipelineState.DONE == 'DONE'


def test_runner_instance_and_metrics(spark_session, spark_args):
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(spark_args))
    _tiny_pipeline(p)
    result = p.run()
    assert result.wait_until_finish() == 'DONE'
    assert result.state == 'DONE'

    counters = result.metrics().query(MetricsFilter().with_name('elements'))['counters']
    assert len(counters) == 1
    assert counters[0].key.metric.namespace == 'runner_api_test'
    assert counters[0].committed == 10
    assert counters[0].attempted == 10

    distributions = result.metrics().query(
        MetricsFilter().with_namespace('runner_api_test').with_name('sizes'))['distributions']
    assert len(distributions) == 1
    dist = distributions[0].committed
    assert (dist.count, dist.sum, dist.min, dist.max) == (10, 55, 1, 10)


def test_with_statement_and_wait_with_duration(spark_session, spark_args):
    with beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(spark_args)) as p:
        _tiny_pipeline(p)
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(spark_args))
    _tiny_pipeline(p)
    result = p.run()
    state = result.wait_until_finish(duration=120_000)
    assert state == 'DONE'
    assert result.wait_until_finish() == 'DONE'


def test_test_pipeline_with_test_pipeline_options(spark_session):
    from apache_beam.testing.test_pipeline import TestPipeline

    p = TestPipeline(argv=[
        '--test-pipeline-options=--runner=StreamsSparkRunner --spark_master=local[2]'])
    assert p.options.view_as(beam.options.pipeline_options.StandardOptions).runner == (
        'StreamsSparkRunner')
    assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2), equal_to([2, 4, 6]))
    result = p.run()
    assert isinstance(p.runner, StreamsSparkRunner)
    assert result.state == PipelineState.DONE
