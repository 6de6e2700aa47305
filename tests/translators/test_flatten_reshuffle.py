"""Flatten and Reshuffle on StreamsSparkRunner, checked against the DirectRunner."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue

pytestmark = pytest.mark.timeout(180)


def test_flatten_of_several(assert_same_as_direct):
    def build(p):
        a = p | 'A' >> beam.Create(range(5))
        b = p | 'B' >> beam.Create(range(100, 103)) | 'B2' >> beam.Map(lambda x: x * 2)
        c = (p
             | 'C' >> beam.Create([('k', 1), ('k', 2), ('j', 3)])
             | beam.GroupByKey()
             | beam.MapTuple(lambda k, vs: sum(vs)))
        empty = p | 'Empty' >> beam.Create([]).with_output_types(int)
        merged = (a, b, c, empty) | beam.Flatten()
        return {
            'merged': merged,
            'summed': merged | beam.Map(lambda x: ('all', x)) | beam.CombinePerKey(sum),
        }

    out = assert_same_as_direct(build)
    assert len(out['merged']) == 10


def test_flatten_same_pcollection_twice(assert_same_as_direct):
    def build(p):
        a = p | 'A' >> beam.Create(['x', 'y'])
        b = p | 'B' >> beam.Create(['z'])
        return (a, a, b) | beam.Flatten() | beam.combiners.Count.PerElement()

    out = assert_same_as_direct(build)
    assert out['out'] == sorted([repr(('x', 2)), repr(('y', 2)), repr(('z', 1))])


def test_flatten_of_windowed_inputs_then_group(assert_same_as_direct):
    def build(p):
        def timestamped(label, items):
            return (p
                    | label >> beam.Create(items)
                    | f'{label}Ts' >> beam.Map(lambda kv: window.TimestampedValue(kv, kv[1]))
                    | f'{label}Win' >> beam.WindowInto(window.FixedWindows(10)))

        a = timestamped('A', [('k', 1), ('k', 12)])
        b = timestamped('B', [('k', 3), ('j', 25)])
        return ((a, b)
                | beam.Flatten()
                | beam.GroupByKey()
                | beam.MapTuple(lambda k, vs: (k, sorted(vs))))

    assert_same_as_direct(build)


def test_flatten_with_single_input_and_multi_output_parts(assert_same_as_direct):
    def build(p):
        parts = (p
                 | beam.Create(range(12))
                 | beam.Partition(lambda x, n: x % n, 3))
        return {
            'single': (parts[0],) | 'Single' >> beam.Flatten(),
            'pair': (parts[1], parts[2]) | 'Pair' >> beam.Flatten(),
            'self': (parts[1], parts[1], parts[2]) | 'Self' >> beam.Flatten(),
        }

    assert_same_as_direct(build)


class _Stamp(beam.DoFn):
    def process(self, element, ts=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam):
        yield element, float(ts), repr(w)


def test_reshuffle(assert_same_as_direct):
    def build(p):
        data = p | beam.Create(range(1000))
        return {
            'plain': data | beam.Reshuffle() | beam.Map(lambda x: x * 3),
            'windowed': (data
                         | 'Ts' >> beam.Map(lambda x: window.TimestampedValue(x, x % 50))
                         | beam.WindowInto(window.FixedWindows(10))
                         | 'Reshuffle windowed' >> beam.Reshuffle()
                         | beam.ParDo(_Stamp())),
            'keyed': (data
                      | 'Key' >> beam.Map(lambda x: (x % 4, x))
                      | 'Reshuffle keyed' >> beam.Reshuffle()
                      | beam.CombinePerKey(sum)),
        }

    out = assert_same_as_direct(build, args=['--bundle_size=64'])
    assert len(out['plain']) == 1000


def test_reshuffle_then_bundle_methods(assert_same_as_direct):
    """Every element reaches exactly one bundle after a Reshuffle (counted per bundle)."""

    class CountBundle(beam.DoFn):
        def start_bundle(self):
            self._n = 0

        def process(self, element):
            self._n += 1

        def finish_bundle(self):
            yield WindowedValue(
                self._n, 0, [window.GlobalWindow()])

    def build(p):
        return (p
                | beam.Create(range(400))
                | beam.Reshuffle()
                | beam.ParDo(CountBundle())
                | beam.CombineGlobally(sum))

    out = assert_same_as_direct(build, args=['--bundle_size=50'])
    assert out['out'] == ['400']
