"""ParDo on StreamsSparkRunner, checked against the DirectRunner.

Map/FlatMap/ParDo, multiple tagged outputs, bundle methods that output,
timestamp/window/pane parameters, and side inputs of every view kind (also
windowed side inputs, mapped to the main input's windows).
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam import pvalue
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

pytestmark = pytest.mark.timeout(180)


def _split_words(line):
    return line.split()


def test_map_flatmap_filter(assert_same_as_direct):
    def build(p):
        return (p
                | beam.Create(['a b', 'c d e', '', 'f'])
                | beam.FlatMap(_split_words)
                | beam.Map(str.upper)
                | beam.Filter(lambda w: w != 'C')
                | beam.Map(lambda w: (w, len(w))))

    out = assert_same_as_direct(build)
    assert len(out['out']) == 5


def test_map_tuple_and_chain_over_many_bundles(assert_same_as_direct):
    def build(p):
        return (p
                | beam.Create([(i, i * i) for i in range(2500)])
                | beam.MapTuple(lambda k, v: (k % 7, v + 1))
                | beam.Map(lambda kv: kv[0] * 1000003 + kv[1]))

    assert_same_as_direct(build, args=['--bundle_size=100'])


class _SplitByParity(beam.DoFn):
    def process(self, element):
        if element % 2:
            yield pvalue.TaggedOutput('odd', element)
        else:
            yield element
        if element % 3 == 0:
            yield pvalue.TaggedOutput('threes', ('three', element))


def test_multiple_tagged_outputs(assert_same_as_direct):
    def build(p):
        results = (p
                   | beam.Create(range(20))
                   | beam.ParDo(_SplitByParity()).with_outputs('odd', 'threes', main='even'))
        return {
            'even': results.even | 'Even' >> beam.Map(lambda x: ('even', x)),
            'odd': results['odd'] | 'Odd' >> beam.Map(lambda x: ('odd', x)),
            'threes': results.threes,
        }

    out = assert_same_as_direct(build)
    assert len(out['even']) == 10 and len(out['odd']) == 10 and len(out['threes']) == 7


def test_tagged_output_unused_tag_and_consumed_twice(assert_same_as_direct):
    def build(p):
        results = (p
                   | beam.Create(range(10))
                   | beam.ParDo(_SplitByParity()).with_outputs('odd', 'threes', main='even'))
        odd = results.odd
        return {
            'a': odd | 'Square' >> beam.Map(lambda x: x * x),
            'b': odd | 'Neg' >> beam.Map(lambda x: -x),
        }

    assert_same_as_direct(build)


class _BundleCounting(beam.DoFn):
    """start_bundle resets per-bundle state; finish_bundle outputs a WindowedValue."""

    def start_bundle(self):
        self._total = 0

    def process(self, element):
        self._total += element
        yield element

    def finish_bundle(self):
        # Bundle boundaries differ between runners; the sum of the bundle totals
        # does not. Totals are output negated to tell them apart.
        yield WindowedValue(-self._total, Timestamp(0), [window.GlobalWindow()])


def test_finish_bundle_outputs(assert_same_as_direct):
    def build(p):
        out = (p
               | beam.Create(range(1, 301))
               | beam.ParDo(_BundleCounting()))
        totals = (out
                  | beam.Filter(lambda x: x <= 0)
                  | beam.Map(lambda x: -x)
                  | beam.CombineGlobally(sum))
        elements = out | 'Elements' >> beam.Filter(lambda x: x > 0)
        return {'totals': totals, 'elements': elements}

    out = assert_same_as_direct(build, args=['--bundle_size=50'])
    assert out['totals'] == [repr(sum(range(1, 301)))]


class _SetupTeardown(beam.DoFn):
    def setup(self):
        self._prefix = 'set-up'

    def process(self, element):
        yield f'{self._prefix}:{element}'

    def teardown(self):
        self._prefix = None


def test_setup_and_teardown(assert_same_as_direct):
    def build(p):
        return p | beam.Create(['x', 'y']) | beam.ParDo(_SetupTeardown())

    assert_same_as_direct(build)


class _TimestampWindowPane(beam.DoFn):
    def process(self, element, ts=beam.DoFn.TimestampParam, win=beam.DoFn.WindowParam,
                pane=beam.DoFn.PaneInfoParam):
        yield (element, float(ts), repr(win), pane.is_first, pane.is_last)


def test_timestamp_window_and_pane_params(assert_same_as_direct):
    def build(p):
        return (p
                | beam.Create([('a', 1), ('b', 7), ('c', 12), ('d', 25)])
                | beam.MapTuple(lambda k, t: window.TimestampedValue(k, t))
                | beam.WindowInto(window.FixedWindows(10))
                | beam.ParDo(_TimestampWindowPane()))

    assert_same_as_direct(build)


def test_timestamp_and_window_after_group_by_key(assert_same_as_direct):
    def build(p):
        return (p
                | beam.Create([('a', 1), ('b', 7), ('a', 12), ('a', 3)])
                | beam.Map(lambda kv: window.TimestampedValue(kv, kv[1]))
                | beam.WindowInto(window.SlidingWindows(10, 5))
                | beam.GroupByKey()
                | beam.ParDo(_TimestampWindowPane()))

    assert_same_as_direct(build)


def _with_sides(element, single, iterable, as_list, as_dict, multimap):
    # A multimap side input is looked up by key (the harness's view has no keys()).
    return (element, single, sorted(iterable), sorted(as_list), sorted(as_dict.items()),
            sorted(multimap[element]), sorted(multimap['c']), as_dict.get(element))


def test_side_inputs_all_view_kinds(assert_same_as_direct):
    def build(p):
        main = p | 'Main' >> beam.Create(['a', 'b', 'z'])
        single = p | 'Single' >> beam.Create([42])
        numbers = p | 'Numbers' >> beam.Create([3, 1, 2])
        pairs = p | 'Pairs' >> beam.Create([('a', 1), ('b', 2)])
        multi = p | 'Multi' >> beam.Create([('a', 1), ('a', 2), ('c', 3)])
        return main | beam.Map(
            _with_sides,
            single=pvalue.AsSingleton(single),
            iterable=pvalue.AsIter(numbers),
            as_list=pvalue.AsList(numbers),
            as_dict=pvalue.AsDict(pairs),
            multimap=pvalue.AsMultiMap(multi))

    out = assert_same_as_direct(build)
    assert len(out['out']) == 3


def test_side_input_empty_and_default(assert_same_as_direct):
    def build(p):
        main = p | 'Main' >> beam.Create([1, 2])
        empty = p | 'Empty' >> beam.Create([]) | beam.Map(lambda x: x)
        return main | beam.Map(
            lambda x, s, it, d: (x, s, list(it), dict(d)),
            s=pvalue.AsSingleton(empty, default_value='none'),
            it=pvalue.AsIter(empty),
            d=pvalue.AsDict(empty | 'Pairs' >> beam.Map(lambda x: (x, x))))

    assert_same_as_direct(build)


def test_side_input_computed_by_the_pipeline(assert_same_as_direct):
    def build(p):
        words = p | 'Words' >> beam.Create(['x', 'yy', 'zzz', 'yy'])
        total = (words
                 | beam.Map(len)
                 | beam.CombineGlobally(sum))
        counts = words | beam.combiners.Count.PerElement()
        return (words
                | 'Dedupe' >> beam.Distinct()
                | beam.Map(lambda w, t, c: (w, len(w) / t, c[w]),
                           t=pvalue.AsSingleton(total), c=pvalue.AsDict(counts)))

    assert_same_as_direct(build)


def test_same_side_input_read_by_two_steps(assert_same_as_direct):
    def build(p):
        side = p | 'Side' >> beam.Create([10, 20])
        main = p | 'Main' >> beam.Create([1, 2, 3])
        first = main | 'First' >> beam.Map(lambda x, s: x + sum(s), s=pvalue.AsList(side))
        second = first | 'Second' >> beam.Map(lambda x, s: x * max(s), s=pvalue.AsIter(side))
        return {'first': first, 'second': second}

    assert_same_as_direct(build)


class _WindowedSides(beam.DoFn):
    def process(self, x, it, lst, d, single, w=beam.DoFn.WindowParam):
        yield x, repr(w), sorted(it), sorted(lst), sorted(d.items()), single


class _GlobalSide(beam.DoFn):
    def process(self, x, d, w=beam.DoFn.WindowParam):
        yield x, repr(w), sorted(d.items())


def test_windowed_side_inputs(assert_same_as_direct):
    def build(p):
        side = (p
                | 'Side' >> beam.Create([('s', 1), ('t', 3), ('u', 11), ('v', 25)])
                | 'SideTs' >> beam.MapTuple(lambda v, t: window.TimestampedValue(v, t))
                | 'SideWindows' >> beam.WindowInto(window.FixedWindows(10)))
        side_kv = side | 'SideKV' >> beam.Map(lambda v: (v, v.upper()))
        main = (p
                | 'Main' >> beam.Create([('a', 2), ('b', 14), ('c', 15), ('d', 21), ('e', 38)])
                | 'MainTs' >> beam.MapTuple(lambda v, t: window.TimestampedValue(v, t))
                | 'MainWindows' >> beam.WindowInto(window.FixedWindows(10)))
        # Side inputs go positionally: Beam cannot mix keyword side inputs with
        # a DoFn parameter (WindowParam) declared after them.
        return main | beam.ParDo(
            _WindowedSides(),
            pvalue.AsIter(side),
            pvalue.AsList(side),
            pvalue.AsDict(side_kv),
            pvalue.AsSingleton(
                side | 'Count' >> beam.combiners.Count.Globally().without_defaults(),
                default_value=0))

    out = assert_same_as_direct(build)
    assert len(out['out']) == 5


def test_global_side_input_for_windowed_main_input(assert_same_as_direct):
    def build(p):
        side = p | 'Side' >> beam.Create([('k', 'v'), ('j', 'w')])
        main = (p
                | 'Main' >> beam.Create([1, 15, 27])
                | beam.Map(lambda t: window.TimestampedValue(t, t))
                | beam.WindowInto(window.SlidingWindows(20, 10)))
        return main | beam.ParDo(_GlobalSide(), pvalue.AsDict(side))

    assert_same_as_direct(build)


def test_side_input_with_tagged_outputs(assert_same_as_direct):
    class Route(beam.DoFn):
        def process(self, element, limit):
            if element > limit:
                yield pvalue.TaggedOutput('big', element)
            else:
                yield element

    def build(p):
        limit = p | 'Limit' >> beam.Create([5])
        results = (p
                   | beam.Create(range(10))
                   | beam.ParDo(Route(), limit=pvalue.AsSingleton(limit)).with_outputs(
                       'big', main='small'))
        return {'small': results.small, 'big': results.big}

    assert_same_as_direct(build)
