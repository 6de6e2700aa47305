"""Streaming side inputs through the Pending States Graph, end to end on Spark.

Main-input elements wait until the side-input windows they map to are complete
(the side watermark passed them), then read the whole window: the outputs equal
the DirectRunner's, which computes each side window in full before its readers.
"""

from __future__ import annotations

import glob

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

from beam_streams_runner import StreamsSparkRunner
from tests.conftest import SPARK_ARGS, events_with_late_data


def test_windowed_side_inputs_filling_over_time(same_as_direct_streaming):
    """Two side inputs with other windows than the main input's; their windows
    fill over several epochs, so main elements are pushed back, then released."""
    def build(p):
        events = p | events_with_late_data()
        totals = (events | 'Fixed5' >> beam.WindowInto(window.FixedWindows(5))
                  | beam.Values() | beam.CombineGlobally(sum).without_defaults())
        by_key = events | 'Fixed10' >> beam.WindowInto(window.FixedWindows(10))
        return (events | 'Main' >> beam.WindowInto(window.FixedWindows(5))
                | beam.Map(lambda kv, total, seen: (kv, total, sorted(seen[kv[0]])),
                           total=beam.pvalue.AsSingleton(totals, default_value=-1),
                           seen=beam.pvalue.AsMultiMap(by_key)))

    lines = same_as_direct_streaming(build)
    # ('a', 1) arrived first, then waited for its side windows to be complete:
    # [0, 5) sums 1 + 2 + 3, and 'a' has 1, 3, 7 in [0, 10) (the late 2 comes after).
    assert any(line.startswith("(('a', 1), 6, [1, 3, 7])") for line in lines), lines


def test_global_side_input_from_a_bounded_source(same_as_direct_streaming):
    same_as_direct_streaming(lambda p: (
        p | events_with_late_data()
        | beam.Map(lambda kv, side: (kv, sorted(side)),
                   side=beam.pvalue.AsList(p | 'Side' >> beam.Create([3, 1, 2])))))


def test_write_to_text_with_streaming_flag(tmp_path, spark_session):
    """File sinks finalize through a global-window side input of the written shards."""
    prefix = str(tmp_path / 'out')
    options = PipelineOptions(['--streaming', *SPARK_ARGS])
    with beam.Pipeline(runner=StreamsSparkRunner(), options=options) as p:
        _ = p | beam.Create(['x', 'y', 'z']) | beam.io.WriteToText(prefix)
    lines = []
    for path in glob.glob(prefix + '*'):
        with open(path, encoding='utf-8') as f:
            lines.extend(f.read().splitlines())
    assert sorted(lines) == ['x', 'y', 'z']
