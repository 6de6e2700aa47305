"""The PipelineResult: waiting with a duration, cancelling, state."""

from __future__ import annotations

import threading
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import userstate

from beam_streams_runner import StreamsSparkRunner


def _held(x, gate: str):
    """Holds every element until the test creates `gate`."""
    import os
    import time as _time
    while not os.path.exists(gate):
        _time.sleep(0.05)
    return x


def test_wait_with_duration_then_cancel(caplog, tmp_path):
    # The job cannot end while the gate is closed, so a wait that returns proves it
    # stopped after its duration, and a run that ends proves cancel() stopped it:
    # neither depends on how fast the machine is.
    gate = tmp_path / 'gate'
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]', '--bundle_size=1']))
    _ = p | beam.Create(list(range(400))) | beam.Map(_held, str(gate))
    result = p.run()
    # A hang guard, not a bound: a wait that ignores its duration then sees the job
    # end and returns DONE instead of hanging the suite.
    opener = threading.Timer(120, gate.touch)
    opener.start()
    try:
        assert result.wait_until_finish(duration=1000) == PipelineState.RUNNING
        opener.cancel()
        assert not gate.exists()
        # Were cancel() not to stop the Spark job, it would wait for the gate for good
        # (pytest-timeout ends it); the finally then lets the run end.
        assert result.cancel() == PipelineState.CANCELLED
        assert result.state == PipelineState.CANCELLED
        assert result.wait_until_finish() == PipelineState.CANCELLED
    finally:
        opener.cancel()
        gate.touch()
    assert not [r for r in caplog.records if 'Pipeline failed' in r.getMessage()]


def test_done_state_and_waiting_twice():
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]']))
    _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.state == PipelineState.DONE
    assert result.cancel() == PipelineState.DONE


class _CountPerKey(beam.DoFn):
    """Keeps one keyed state per key in the global window: it never expires."""

    SEEN = userstate.CombiningValueStateSpec('seen', sum)

    def __init__(self) -> None:
        self.ticks = beam.metrics.Metrics.counter('test', 'ticks')

    def process(self, element, seen=beam.DoFn.StateParam(SEEN)):
        self.ticks.inc()
        seen.add(1)
        yield element


def test_streaming_metrics_are_live_and_cancel_stops_an_endless_run():
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]', '--streaming']))
    _ = (p | PeriodicImpulse(fire_interval=0.1)  # never ends
         | beam.Map(lambda t: (int(t * 10) % 3, 1))
         | 'Count' >> beam.ParDo(_CountPerKey()))
    result = p.run()
    ticks, keyed_states = 0, None
    deadline = time.monotonic() + 120
    while (ticks < 3 or keyed_states != 3) and time.monotonic() < deadline:
        assert result.wait_until_finish(duration=500) == PipelineState.RUNNING
        metrics = result.metrics().query(MetricsFilter().with_step('Count'))
        ticks = sum(c.committed for c in metrics['counters'])
        keyed_states = next((g.committed.value for g in metrics['gauges']
                             if g.key.metric.name == 'keyed_states'), None)
    assert ticks >= 3, 'no user metric reported while the pipeline runs'
    assert keyed_states == 3, 'the runner gauge of live keyed states is missing or wrong'
    assert result.cancel() == PipelineState.CANCELLED
    assert result.wait_until_finish() == PipelineState.CANCELLED
