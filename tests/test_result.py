"""The PipelineResult: waiting with a duration, cancelling, state."""

from __future__ import annotations

import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from beam_streams_runner import StreamsSparkRunner


def _slow(x):
    import time as _time
    _time.sleep(0.5)
    return x


def test_wait_with_duration_then_cancel():
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]', '--bundle_size=1']))
    _ = p | beam.Create(list(range(400))) | beam.Map(_slow)
    result = p.run()
    started = time.monotonic()
    assert result.wait_until_finish(duration=1000) == PipelineState.RUNNING
    assert time.monotonic() - started < 30
    assert result.cancel() == PipelineState.CANCELLED
    assert result.state == PipelineState.CANCELLED
    assert result.wait_until_finish() == PipelineState.CANCELLED


def test_done_state_and_waiting_twice():
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]']))
    _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.state == PipelineState.DONE
    assert result.cancel() == PipelineState.DONE
