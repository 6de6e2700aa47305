"""The bounded NEXMark source: splits cover every event once; runners read it equally."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_streams_runner import StreamsSparkRunner
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import events
from benchmarks.nexmark.sources import MIN_SPLITS, NexmarkSource, ReadNexmarkEvents


def _identity(event) -> tuple:
    return type(event).__name__, getattr(event, 'id', None), getattr(event, 'auction', None), \
        getattr(event, 'price', None), event.date_time.micros


def test_splits_cover_every_position_once():
    config = NexmarkConfig(num_events=1003)
    source = NexmarkSource(config)
    for desired in (1, 10_000, 10**9):
        bundles = list(source.split(desired))
        assert len(bundles) >= min(MIN_SPLITS, 1003) or desired < 100
        positions = [p for b in bundles for p in range(b.start_position, b.stop_position)]
        assert positions == list(range(1003))


def test_read_yields_the_generated_events_with_their_timestamps():
    config = NexmarkConfig(num_events=300)
    source = NexmarkSource(config)
    read = [tv for b in source.split(10**9)
            for tv in source.read(source.get_range_tracker(b.start_position, b.stop_position))]
    expected = list(events(config, 0, 300))
    assert [_identity(tv.value) for tv in read] == [_identity(e.event) for e in expected]
    assert [tv.timestamp for tv in read] == [e.timestamp for e in expected]


def test_spark_reads_every_event_in_bundles_of_bundle_size(spark_session, spark_args):
    config = NexmarkConfig(num_events=2000)
    expected = [repr(_identity(e.event)) for e in events(config, 0, 2000)]
    with beam.Pipeline(runner=StreamsSparkRunner(),
                       options=PipelineOptions([*spark_args, '--bundle_size=50'])) as p:
        read = p | ReadNexmarkEvents(config)
        assert_that(read | beam.Map(lambda e: repr(_identity(e))), equal_to(expected))
        assert_that(read | beam.Map(lambda e, ts=beam.DoFn.TimestampParam: ts == e.date_time)
                    | beam.Distinct(), equal_to([True]), label='timestamps')
