"""GroupByKey and Combine on StreamsSparkRunner, checked against the DirectRunner.

Global, fixed, sliding and session windows, a custom merging WindowFn, timestamp
combiners, accumulation modes, lifted and unlifted combines, empty inputs. First,
without Spark: the batch reduce side's fast path for non-merging windows and the
default trigger (`_one_pane_per_window`) against Beam's general trigger driver.
"""

from __future__ import annotations

import functools

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.transforms import combiners, trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.window import TimestampCombiner
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.translators.group_by_key import (
    GroupByKeyOperator,
    GroupingCoders,
    _one_pane_per_window,
    _process_entire_key,
    batch_panes,
)

pytestmark = pytest.mark.timeout(180)

EVENTS = [('a', 1, 1), ('b', 2, 3), ('a', 3, 4), ('a', 4, 12), ('c', 5, 13),
          ('b', 6, 14), ('a', 7, 31), ('b', 8, 33), ('a', 9, 35), ('c', 10, 60)]


# The batch fast path, without Spark ------------------------------------------------

def _windowed(windowfn, value, timestamp):
    """`value` at `timestamp` in the windows `windowfn` assigns, as WindowInto gives it."""
    timestamp = Timestamp.of(timestamp)
    return WindowedValue(
        value, timestamp, tuple(windowfn.assign(window.WindowFn.AssignContext(timestamp, value))))


def _general_panes(windowing, key, windowed_values):
    driver = trigger.create_trigger_driver(windowing, is_batch=True)
    assert isinstance(driver, trigger.GeneralTriggerDriver)
    return list(_process_entire_key(driver, key, windowed_values))


def _as_tuples(panes):
    return [(pane.value, pane.timestamp, pane.windows, pane.pane_info) for pane in panes]


def _is_fast_path(panes) -> bool:
    return isinstance(panes, functools.partial) and panes.func is _one_pane_per_window


class _TwoWindowsTransformed(window.NonMergingWindowFn):
    """A custom non-merging WindowFn: [t - 5, t + 5) and the fixed 10 s window of t
    (in that order, maybe the same), output times moved to the window's start."""

    def assign(self, context):
        start = context.timestamp - context.timestamp.micros % 10_000_000 / 1e6
        return [window.IntervalWindow(context.timestamp - 5, context.timestamp + 5),
                window.IntervalWindow(start, start + 10)]

    def get_transformed_output_time(self, window, input_timestamp):
        return max(window.start, input_timestamp - 3)

    def get_window_coder(self):
        return coders.IntervalWindowCoder()


_WINDOW_FNS = st.one_of(
    st.builds(window.FixedWindows, st.integers(1, 30), st.integers(0, 29)),
    st.integers(1, 30).flatmap(lambda size: st.builds(
        window.SlidingWindows, st.just(size), st.integers(1, size), st.integers(0, 40))),
    st.just(window.GlobalWindows()),
    st.just(_TwoWindowsTransformed()))
_COMBINERS = st.sampled_from([
    TimestampCombiner.OUTPUT_AT_EOW, TimestampCombiner.OUTPUT_AT_EARLIEST,
    TimestampCombiner.OUTPUT_AT_LATEST, TimestampCombiner.OUTPUT_AT_EARLIEST_TRANSFORMED])
# Mostly seconds near 0 (shared windows); sometimes at the ends of time, where a
# window may end past +inf (the general driver never fires it).
_TIMESTAMPS = st.one_of(
    st.integers(-60, 60).map(Timestamp.of),
    st.integers(-600_000_000, 600_000_000).map(lambda micros: Timestamp(micros=micros)),
    st.integers(0, 100_000_000).map(lambda micros: MAX_TIMESTAMP - Duration(micros=micros)),
    st.integers(0, 100_000_000).map(lambda micros: MIN_TIMESTAMP + Duration(micros=micros)))


@settings(max_examples=300, deadline=None)
@given(windowfn=_WINDOW_FNS, combiner=_COMBINERS,
       lateness=st.one_of(st.just(0), st.integers(1, 100), st.just(10**9)),
       mode=st.sampled_from([trigger.AccumulationMode.DISCARDING,
                             trigger.AccumulationMode.ACCUMULATING]),
       events=st.lists(st.tuples(st.sampled_from('abc'), st.integers(0, 9), _TIMESTAMPS),
                       max_size=40))
def test_fast_path_gives_the_general_drivers_panes(windowfn, combiner, lateness, mode, events):
    windowing = Windowing(windowfn, timestamp_combiner=combiner, allowed_lateness=lateness,
                          accumulation_mode=mode)
    assume(not windowing.is_default())  # that one has its own path (one pane, is_last)
    panes = batch_panes(windowing)
    assert _is_fast_path(panes)
    by_key: dict = {}
    for key, value, timestamp in events:
        by_key.setdefault(key, []).append(_windowed(windowfn, value, timestamp))
    for key, windowed_values in by_key.items():
        expected = _as_tuples(_general_panes(windowing, key, windowed_values))
        assert _as_tuples(panes(key, windowed_values)) == expected


def test_fast_path_panes_are_what_the_general_driver_gives_in_batch():
    """One on-time pane per (key, window), first but not last (DefaultTrigger never
    finishes a window), in the order the windows were first seen, the values in
    arrival order, stamped per the timestamp combiner; allowed lateness drops nothing."""
    windowfn = window.SlidingWindows(10, 5)
    values = [_windowed(windowfn, value, ts) for value, ts in
              [(0, 3), (1, 1), (2, 12), (3, 7), (4, 2), (5, -20)]]
    pane = PaneInfo(is_first=True, is_last=False, timing=PaneInfoTiming.ON_TIME, index=0,
                    nonspeculative_index=0)
    windows = [window.IntervalWindow(*bounds) for bounds in
               [(0, 10), (-5, 5), (10, 20), (5, 15), (-20, -10), (-25, -15)]]
    grouped = [[0, 1, 3, 4], [0, 1, 4], [2], [2, 3], [5], [5]]
    stamps = {
        TimestampCombiner.OUTPUT_AT_EOW: [w.max_timestamp() for w in windows],
        TimestampCombiner.OUTPUT_AT_EARLIEST: [1, 1, 12, 7, -20, -20],
        TimestampCombiner.OUTPUT_AT_LATEST: [7, 3, 12, 12, -20, -20],
    }
    for combiner, timestamps in stamps.items():
        for lateness in (0, 30):
            windowing = Windowing(windowfn, timestamp_combiner=combiner,
                                  allowed_lateness=lateness)
            expected = [(('k', vs), Timestamp.of(ts), (w,), pane)
                        for vs, ts, w in zip(grouped, timestamps, windows, strict=True)]
            assert _as_tuples(_general_panes(windowing, 'k', values)) == expected
            assert _as_tuples(batch_panes(windowing)('k', values)) == expected


def test_fast_path_leaves_a_window_past_the_end_of_time_to_the_general_driver():
    windowing = Windowing(window.FixedWindows(10))
    values = [_windowed(windowing.windowfn, 1, 5),
              _windowed(windowing.windowfn, 2, MAX_TIMESTAMP - Duration(micros=1))]
    assert values[1].windows[0].end > MAX_TIMESTAMP
    panes = _as_tuples(batch_panes(windowing)('k', values))
    assert panes == _as_tuples(_general_panes(windowing, 'k', values))
    assert [value for value, *_ in panes] == [('k', [1])]  # its timer never fires


def test_fast_path_holds_no_output_time_before_the_start_of_time():
    """The general driver holds only output times at or after its output watermark
    (-inf): a window whose transformed output times are all before it is stamped at
    its end."""
    windowing = Windowing(_TwoWindowsTransformed(),
                          timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST_TRANSFORMED)
    values = [_windowed(windowing.windowfn, 0, MIN_TIMESTAMP)]
    panes = _as_tuples(batch_panes(windowing)('k', values))
    assert panes == _as_tuples(_general_panes(windowing, 'k', values))
    assert [timestamp for _, timestamp, (w,), _ in panes] == [
        w.max_timestamp() for w in values[0].windows]


class _DefaultTriggerSubclass(trigger.DefaultTrigger):
    pass


@pytest.mark.parametrize('windowing', [
    Windowing(window.Sessions(5)),
    Windowing(window.Sessions(5), timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST),
    Windowing(window.FixedWindows(10), triggerfn=trigger.AfterWatermark(),
              accumulation_mode=trigger.AccumulationMode.DISCARDING),
    Windowing(window.FixedWindows(10), triggerfn=trigger.Repeatedly(trigger.AfterCount(2)),
              accumulation_mode=trigger.AccumulationMode.ACCUMULATING),
    Windowing(window.SlidingWindows(10, 5),
              triggerfn=trigger.AfterWatermark(early=trigger.AfterCount(1)),
              accumulation_mode=trigger.AccumulationMode.DISCARDING),
    Windowing(window.FixedWindows(10), triggerfn=_DefaultTriggerSubclass(),
              accumulation_mode=trigger.AccumulationMode.DISCARDING),
], ids=['sessions', 'sessions-earliest', 'after-watermark', 'after-count', 'early-firings',
        'default-trigger-subclass'])
def test_merging_windows_and_other_triggers_use_the_general_driver(windowing):
    panes = batch_panes(windowing)
    assert isinstance(panes, functools.partial) and panes.func is _process_entire_key
    assert isinstance(panes.args[0], trigger.GeneralTriggerDriver)


def test_custom_merging_window_fn_uses_the_general_driver():
    panes = batch_panes(Windowing(_MergeWithinTenWindows()))
    assert not _is_fast_path(panes) and panes.func is _process_entire_key


def test_default_windowing_keeps_its_own_path():
    assert not _is_fast_path(batch_panes(Windowing(window.GlobalWindows())))
    assert _is_fast_path(batch_panes(Windowing(window.GlobalWindows(), allowed_lateness=5)))


def test_operator_emits_the_fast_path_panes():
    """GroupByKeyOperator end to end (encoded in, encoded out) at the end of input."""
    windowing = Windowing(window.SlidingWindows(10, 5),
                          timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST)
    window_coder = windowing.windowfn.get_window_coder()
    key_value = coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()])
    in_coder = coders.WindowedValueCoder(key_value, window_coder).get_impl()
    out_coder = coders.WindowedValueCoder(coders.TupleCoder(
        [coders.StrUtf8Coder(), coders.IterableCoder(coders.VarIntCoder())]),
        window_coder).get_impl()
    operator = GroupByKeyOperator(
        GroupingCoders(in_coder, out_coder, coders.StrUtf8Coder().get_impl(),
                       coders.VarIntCoder().get_impl()),
        windowing, 'out', 4)
    events = [(f'k{i % 3}', i, (i * 7) % 23) for i in range(30)]
    windowed = [_windowed(windowing.windowfn, (k, v), ts) for k, v, ts in events]
    chunk = b''.join(in_coder.encode_nested(wv) for wv in windowed)
    assert operator.process_bundle([('input', chunk)]) == []
    assert operator.advance(MAX_WATERMARK - 1) == []
    records = operator.advance(MAX_WATERMARK)
    assert {tag for tag, _ in records} == {'out'}
    got = [wv for _, chunk in records for wv in out_coder.decode_all(chunk)]
    expected = []
    for key in ('k0', 'k1', 'k2'):
        values = [wv.with_value(wv.value[1]) for wv in windowed if wv.value[0] == key]
        expected += _general_panes(windowing, key, values)
    assert [(wv.value[0], list(wv.value[1]), wv.timestamp, wv.windows, wv.pane_info)
            for wv in got] == [(k, vs, ts, ws, pane) for (k, vs), ts, ws, pane in
                               _as_tuples(expected)]


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
