"""GroupByKey and Combine on StreamsSparkRunner, checked against the DirectRunner.

Global, fixed, sliding and session windows, a custom merging WindowFn, timestamp
combiners, accumulation modes, lifted and unlifted combines, empty inputs.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.transforms import combiners, trigger, window
from apache_beam.transforms.window import TimestampCombiner

pytestmark = pytest.mark.timeout(180)

EVENTS = [('a', 1, 1), ('b', 2, 3), ('a', 3, 4), ('a', 4, 12), ('c', 5, 13),
          ('b', 6, 14), ('a', 7, 31), ('b', 8, 33), ('a', 9, 35), ('c', 10, 60)]


def _timestamped(p, label='Events'):
    return (p
            | label >> beam.Create(EVENTS)
            | f'{label}Ts' >> beam.MapTuple(lambda k, v, t: window.TimestampedValue((k, v), t)))


class _WithWindow(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam,
                pane=beam.DoFn.PaneInfoParam):
        yield kv, repr(w), float(ts), pane.timing, pane.is_first, pane.is_last


def test_group_by_key_global_window(assert_same_as_direct):
    def build(p):
        return (p
                | beam.Create([(i % 13, i) for i in range(500)])
                | beam.GroupByKey()
                | beam.MapTuple(lambda k, vs: (k, sorted(vs))))

    out = assert_same_as_direct(build, args=['--bundle_size=37'])
    assert len(out['out']) == 13


def test_group_by_key_various_key_types(assert_same_as_direct):
    def build(p):
        return (p
                | beam.Create([(('t', 1), 1), (('t', 1), 2), (b'bytes', 3), (None, 4), (None, 5),
                               (2.5, 6), ('str', 7), (-3, 8), (True, 9)])
                | beam.GroupByKey()
                | beam.MapTuple(lambda k, vs: (repr(k), sorted(vs))))

    assert_same_as_direct(build)


def test_group_by_key_after_group_by_key(assert_same_as_direct):
    def build(p):
        return (p
                | beam.Create([(i % 5, i) for i in range(40)])
                | 'First' >> beam.GroupByKey()
                | beam.MapTuple(lambda k, vs: (sum(vs) % 3, k))
                | 'Second' >> beam.GroupByKey())

    assert_same_as_direct(build)


def test_combine_per_key_and_globally(assert_same_as_direct):
    def build(p):
        nums = p | beam.Create([(f'k{i % 4}', i) for i in range(200)])
        return {
            'sum': nums | beam.CombinePerKey(sum),
            'mean': nums | 'Mean' >> combiners.Mean.PerKey(),
            'top': nums | 'Top' >> combiners.Top.LargestPerKey(3),
            'count': nums | 'Count' >> combiners.Count.PerKey(),
            'global': nums | beam.Values() | beam.CombineGlobally(sum),
            'tolist': nums | 'Keys' >> beam.Keys() | combiners.ToList(),
        }

    assert_same_as_direct(build, args=['--bundle_size=16'])


class _AverageFn(beam.CombineFn):
    """A CombineFn with a non-trivial accumulator and merge."""

    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, value):
        return acc[0] + value, acc[1] + 1

    def merge_accumulators(self, accs):
        return sum(a[0] for a in accs), sum(a[1] for a in accs)

    def extract_output(self, acc):
        return (acc[0] / acc[1]) if acc[1] else float('nan')


def test_custom_combine_fn_and_combine_values(assert_same_as_direct):
    def build(p):
        nums = p | beam.Create([(i % 3, i * 1.5) for i in range(100)])
        return {
            'per_key': nums | beam.CombinePerKey(_AverageFn()),
            'values': (nums
                       | beam.GroupByKey()
                       | beam.CombineValues(_AverageFn())),
            'globally': nums | beam.Values() | beam.CombineGlobally(_AverageFn()),
        }

    assert_same_as_direct(build, args=['--bundle_size=10'])


def test_fixed_windows(assert_same_as_direct):
    def build(p):
        events = _timestamped(p) | beam.WindowInto(window.FixedWindows(10))
        return {
            'gbk': events | beam.GroupByKey() | beam.ParDo(_WithWindow()),
            'sum': events | beam.CombinePerKey(sum) | 'SumWindow' >> beam.ParDo(_WithWindow()),
            'global': (events
                       | beam.Values()
                       | beam.CombineGlobally(sum).without_defaults()
                       | 'GlobalWindow' >> beam.ParDo(_WithWindow())),
        }

    assert_same_as_direct(build)


def test_sliding_windows(assert_same_as_direct):
    def build(p):
        return (_timestamped(p)
                | beam.WindowInto(window.SlidingWindows(20, 5))
                | beam.GroupByKey()
                | beam.ParDo(_WithWindow()))

    assert_same_as_direct(build)


def test_session_windows(assert_same_as_direct):
    def build(p):
        events = _timestamped(p) | beam.WindowInto(window.Sessions(5))
        return {
            'gbk': events | beam.GroupByKey() | beam.ParDo(_WithWindow()),
            'count': (events
                      | combiners.Count.PerKey()
                      | 'CountWindow' >> beam.ParDo(_WithWindow())),
        }

    assert_same_as_direct(build)


class _MergeWithinTenWindows(window.WindowFn):
    """A custom merging WindowFn: [t, t+3) windows merge when they start within 10 s."""

    def assign(self, context):
        return [window.IntervalWindow(context.timestamp, context.timestamp + 3)]

    def merge(self, merge_context):
        windows = sorted(merge_context.windows, key=lambda w: w.start)
        group = []
        for w in [*windows, None]:
            if group and (w is None or w.start - group[0].start >= 10):
                if len(group) > 1:
                    merged = window.IntervalWindow(
                        group[0].start, max(g.end for g in group))
                    merge_context.merge(group, merged)
                group = []
            if w is not None:
                group.append(w)

    def get_window_coder(self):
        return coders.IntervalWindowCoder()


def test_custom_merging_window_fn(assert_same_as_direct):
    def build(p):
        events = _timestamped(p) | beam.WindowInto(_MergeWithinTenWindows())
        return {
            'gbk': events | beam.GroupByKey() | beam.ParDo(_WithWindow()),
            'sum': events | beam.CombinePerKey(sum) | 'SumWindow' >> beam.ParDo(_WithWindow()),
        }

    assert_same_as_direct(build)


def test_timestamp_combiners(assert_same_as_direct):
    combiners_to_check = {
        'eow': TimestampCombiner.OUTPUT_AT_EOW,
        'earliest': TimestampCombiner.OUTPUT_AT_EARLIEST,
        'latest': TimestampCombiner.OUTPUT_AT_LATEST,
    }

    def build(p):
        events = _timestamped(p)
        outputs = {}
        for name, combiner in combiners_to_check.items():
            outputs[f'fixed_{name}'] = (
                events
                | f'Fixed {name}' >> beam.WindowInto(
                    window.FixedWindows(10), timestamp_combiner=combiner)
                | f'Group {name}' >> beam.GroupByKey()
                | f'Stamp fixed {name}' >> beam.ParDo(_WithWindow()))
            outputs[f'sessions_{name}'] = (
                events
                | f'Sessions {name}' >> beam.WindowInto(
                    window.Sessions(5), timestamp_combiner=combiner)
                | f'Sum {name}' >> beam.CombinePerKey(sum)
                | f'Stamp sessions {name}' >> beam.ParDo(_WithWindow()))
        return outputs

    out = assert_same_as_direct(build)
    # The combiners do make a difference.
    assert out['fixed_eow'] != out['fixed_earliest'] != out['fixed_latest']


def test_triggers_and_accumulation_modes(assert_same_as_direct):
    modes = {
        'discarding': trigger.AccumulationMode.DISCARDING,
        'accumulating': trigger.AccumulationMode.ACCUMULATING,
    }

    def build(p):
        events = _timestamped(p)
        outputs = {}
        for name, mode in modes.items():
            outputs[f'count_{name}'] = (
                events
                | f'Count window {name}' >> beam.WindowInto(
                    window.FixedWindows(100),
                    trigger=trigger.Repeatedly(trigger.AfterCount(3)),
                    accumulation_mode=mode)
                | f'Group {name}' >> beam.GroupByKey()
                | f'Keys {name}' >> beam.Keys()
                | f'Distinct {name}' >> beam.Distinct())
            outputs[f'eow_{name}'] = (
                events
                | f'Eow window {name}' >> beam.WindowInto(
                    window.FixedWindows(10),
                    trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                    allowed_lateness=30, accumulation_mode=mode)
                | f'Sum {name}' >> beam.CombinePerKey(sum)
                | f'Stamp {name}' >> beam.ParDo(_WithWindow()))
        return outputs

    assert_same_as_direct(build)


def test_empty_input(assert_same_as_direct):
    def build(p):
        empty = p | beam.Create([]).with_output_types(tuple[str, int])
        return {
            'gbk': empty | beam.GroupByKey(),
            'per_key': empty | beam.CombinePerKey(sum),
            'global': empty | beam.Values() | beam.CombineGlobally(sum),
            'count': empty | 'Count' >> combiners.Count.Globally(),
            'windowed_global': (empty
                                | beam.WindowInto(window.FixedWindows(10))
                                | 'WindowedValues' >> beam.Values()
                                | 'WindowedSum' >> beam.CombineGlobally(sum).without_defaults()),
        }

    out = assert_same_as_direct(build)
    assert out['global'] == ['0'] and out['count'] == ['0'] and out['gbk'] == []


def test_processing_time_trigger_fires_at_end_of_input(spark_session, spark_args):
    """Beam 2.77's batch trigger driver fails on processing-time triggers (the
    DirectRunner raises a TypeError), so the expected panes are written out: at
    the end of a bounded input processing time reaches +inf and every key's
    pending pane fires once, early, with all its values."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from beam_streams_runner import StreamsSparkRunner

    with beam.Pipeline(runner=StreamsSparkRunner(),
                       options=PipelineOptions(spark_args)) as p:
        panes = (p
                 | beam.Create([('a', 1), ('b', 2), ('a', 3)])
                 | beam.WindowInto(
                     window.GlobalWindows(),
                     trigger=trigger.Repeatedly(trigger.AfterProcessingTime(10)),
                     accumulation_mode=trigger.AccumulationMode.DISCARDING)
                 | beam.GroupByKey()
                 | beam.ParDo(_WithWindow()))
        assert_that(panes | beam.Map(lambda row: (row[0][0], sorted(row[0][1]), row[4])),
                    equal_to([('a', [1, 3], True), ('b', [2], True)]))
