"""Reading bounded sources on StreamsSparkRunner, checked against the DirectRunner.

ReadFromText over several files and over a file larger than one bundle, a
custom `BoundedSource` (OffsetRangeTracker-based, splittable) through
`beam.io.Read`, and a bounded splittable DoFn. Source-level bundling: the steps
after a source see bundles of `bundle_size` elements, while the source itself is
checkpointed once per read slice (batch and streaming). A splittable DoFn's
output read as a side input (every view kind; batch and streaming).
"""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.io import ReadFromText, iobase
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.core import RestrictionProvider

from beam_streams_runner import StreamsSparkRunner

pytestmark = pytest.mark.timeout(180)


def _write_lines(path, lines):
    with open(path, 'w', encoding='utf-8') as f:
        for line in lines:
            f.write(line + '\n')


def test_read_from_text_several_files(assert_same_as_direct, tmp_path):
    data_dir = tmp_path / 'input'
    data_dir.mkdir()
    for i in range(3):
        _write_lines(data_dir / f'part-{i}.txt', [f'file{i} line{j}' for j in range(5 + i)])
    _write_lines(data_dir / 'empty.txt', [])
    pattern = str(data_dir / '*.txt')

    def build(p):
        lines = p | ReadFromText(pattern)
        return {
            'lines': lines,
            'per_file': (lines
                         | beam.Map(lambda line: (line.split()[0], 1))
                         | beam.CombinePerKey(sum)),
        }

    out = assert_same_as_direct(build)
    assert len(out['lines']) == 5 + 6 + 7


def test_read_from_text_large_file_many_bundles(assert_same_as_direct, tmp_path):
    path = tmp_path / 'big.txt'
    _write_lines(path, [f'{i} {"x" * (i % 17)}' for i in range(20_000)])

    def build(p):
        lines = p | ReadFromText(str(path), min_bundle_size=1024)
        return {
            'count': lines | beam.combiners.Count.Globally(),
            'sum': (lines
                    | beam.Map(lambda line: int(line.split()[0]))
                    | beam.CombineGlobally(sum)),
            'longest': (lines
                        | beam.Map(len)
                        | beam.CombineGlobally(max)),
        }

    out = assert_same_as_direct(build, args=['--bundle_size=500'])
    assert out['count'] == ['20000']
    assert out['sum'] == [str(sum(range(20_000)))]


def test_read_from_text_with_file_names(assert_same_as_direct, tmp_path):
    for name in ('a.txt', 'b.txt'):
        _write_lines(tmp_path / name, [f'{name}-{j}' for j in range(3)])

    def build(p):
        return (p
                | beam.io.ReadFromTextWithFilename(str(tmp_path / '*.txt'))
                | beam.MapTuple(lambda filename, line: (os.path.basename(filename), line)))

    out = assert_same_as_direct(build)
    assert len(out['out']) == 6


class _CountingSource(iobase.BoundedSource):
    """Reads the integers [0, count) (squared); splittable at any offset."""

    def __init__(self, count):
        self._count = count

    def estimate_size(self):
        return self._count

    def get_range_tracker(self, start_position, stop_position):
        start = 0 if start_position is None else start_position
        stop = self._count if stop_position is None else stop_position
        return OffsetRangeTracker(start, stop)

    def read(self, range_tracker):
        position = range_tracker.start_position()
        while range_tracker.try_claim(position):
            yield position * position
            position += 1

    def split(self, desired_bundle_size, start_position=None, stop_position=None):
        start = 0 if start_position is None else start_position
        stop = self._count if stop_position is None else stop_position
        size = max(1, desired_bundle_size)
        for offset in range(start, stop, size):
            end = min(offset + size, stop)
            yield iobase.SourceBundle(end - offset, self, offset, end)

    def default_output_coder(self):
        return beam.coders.VarIntCoder()


def test_custom_bounded_source(assert_same_as_direct):
    def build(p):
        numbers = p | beam.io.Read(_CountingSource(2_000))
        return {
            'numbers': numbers | beam.Filter(lambda x: x % 97 == 0),
            'count': numbers | beam.combiners.Count.Globally(),
            'sum': numbers | beam.CombineGlobally(sum),
        }

    out = assert_same_as_direct(build, args=['--bundle_size=128'])
    assert out['count'] == ['2000']
    assert out['sum'] == [str(sum(i * i for i in range(2_000)))]


def test_two_custom_sources_flattened(assert_same_as_direct):
    def build(p):
        a = p | 'A' >> beam.io.Read(_CountingSource(10))
        b = p | 'B' >> beam.io.Read(_CountingSource(5))
        return (a, b) | beam.Flatten()

    out = assert_same_as_direct(build)
    assert len(out['out']) == 15


class _CharRangeProvider(RestrictionProvider):
    def initial_restriction(self, element):
        return OffsetRange(0, len(element))

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
        return restriction.size()

    def split(self, element, restriction):
        # Initial splits of at most 4 characters each.
        start = restriction.start
        while start < restriction.stop:
            stop = min(start + 4, restriction.stop)
            yield OffsetRange(start, stop)
            start = stop


class _ExplodeChars(beam.DoFn):
    """A bounded splittable DoFn: one output per character of the element."""

    def process(self, element,
                tracker=beam.DoFn.RestrictionParam(_CharRangeProvider())):
        position = tracker.current_restriction().start
        while tracker.try_claim(position):
            yield element, position, element[position]
            position += 1


def test_bounded_splittable_dofn(assert_same_as_direct):
    def build(p):
        words = p | beam.Create(['abc', 'defghijklmno', '', 'pqrstuvwxyz0123456789'])
        chars = words | beam.ParDo(_ExplodeChars())
        return {
            'chars': chars,
            'per_word': (chars
                         | beam.Map(lambda t: (t[0], 1))
                         | beam.CombinePerKey(sum)),
        }

    out = assert_same_as_direct(build)
    assert len(out['chars']) == 3 + 12 + 21


class _SelfCheckpointingCount(beam.DoFn):
    """A splittable DoFn that defers the rest of its restriction after every 2 claims."""

    def process(self, element,
                tracker=beam.DoFn.RestrictionParam(_CharRangeProvider())):
        position = tracker.current_restriction().start
        claimed = 0
        while tracker.try_claim(position):
            yield element[position]
            position += 1
            claimed += 1
            if claimed == 2:
                tracker.defer_remainder()
                return


def test_splittable_dofn_deferring_its_remainder(assert_same_as_direct):
    def build(p):
        return (p
                | beam.Create(['abcdefghij', 'klmnopq'])
                | beam.ParDo(_SelfCheckpointingCount()))

    out = assert_same_as_direct(build)
    assert len(out['out']) == 17


class _WholeRangeProvider(RestrictionProvider):
    """One restriction per element, not split up front: the runner cuts it."""

    def initial_restriction(self, element):
        return OffsetRange(0, element)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
        return restriction.size()


class _CountedRead(beam.DoFn):
    """Emits 0..element-1; counts its own (harness) bundles."""

    def __init__(self):
        self.bundles = Metrics.counter('source_bundling', 'read_bundles')

    def start_bundle(self):
        self.bundles.inc()

    def process(self, element, tracker=beam.DoFn.RestrictionParam(_WholeRangeProvider())):
        position = tracker.current_restriction().start
        while tracker.try_claim(position):
            yield position
            position += 1


class _BundleSizes(beam.DoFn):
    """Records how many elements each of its non-empty bundles held."""

    def __init__(self):
        self.sizes = Metrics.distribution('source_bundling', 'bundle_sizes')

    def start_bundle(self):
        self._count = 0

    def process(self, element):
        self._count += 1
        yield element

    def finish_bundle(self):
        if self._count:
            self.sizes.update(self._count)


@pytest.mark.parametrize('mode', ['batch', 'streaming'])
def test_source_bundles_are_cut_inside_read_slices(spark_session, spark_args, mode):
    elements = 3_000
    # Bundles cut by count only (a long bundle time), so their sizes are exact.
    args = [*spark_args, '--bundle_size=10', '--bundle_time_ms=600000']
    if mode == 'streaming':
        args.append('--streaming')
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(args))
    _ = (p
         | beam.Create([elements])
         | beam.ParDo(_CountedRead())
         | beam.ParDo(_BundleSizes())
         | beam.combiners.Count.Globally())
    result = p.run()
    result.wait_until_finish()
    found = result.metrics().query(MetricsFilter().with_namespace('source_bundling'))
    sizes = found['distributions'][0].committed
    assert (sizes.sum, sizes.max, sizes.count) == (elements, 10, elements // 10)
    # One harness bundle per slice of at least a default bundle (1000 elements; in
    # batch also 100 ms, which a quick read may not reach), not one per source
    # bundle: the read is checkpointed about 3 times at most, not 300.
    read_bundles = found['counters'][0].committed
    assert (1 if mode == 'batch' else 3) <= read_bundles <= 5, read_bundles


class _CharsByPosition(beam.DoFn):
    """A bounded splittable DoFn of key-value pairs: ('word:position', character)."""

    def process(self, element,
                tracker=beam.DoFn.RestrictionParam(_CharRangeProvider())):
        position = tracker.current_restriction().start
        while tracker.try_claim(position):
            yield f'{element}:{position}', element[position]
            position += 1


def _with_views(main, ranges, chars, one, many):
    """`main` read with a view of each source's output, straight from the source."""
    return main | 'With views' >> beam.Map(
        lambda x, it, lst, d, single, big: (
            x, sorted(it), sorted(lst), sorted(d.items()), single, len(big), sum(big)),
        it=beam.pvalue.AsIter(ranges),
        lst=beam.pvalue.AsList(ranges),
        d=beam.pvalue.AsDict(chars),
        single=beam.pvalue.AsSingleton(one),
        big=beam.pvalue.AsList(many))


def _sources(p):
    # `many` is read as several slices with bundle size 10: the read is
    # checkpointed while its only reader is another stage's side input.
    words = p | 'Words' >> beam.Create(['abcdef', 'gh'])
    return (p | 'Sizes' >> beam.Create([3, 2]) | 'Ranges' >> beam.ParDo(_CountedRead()),
            words | 'Chars' >> beam.ParDo(_CharsByPosition()),
            p | 'One' >> beam.Create([1]) | 'Zero' >> beam.ParDo(_CountedRead()),
            p | 'Big' >> beam.Create([2_500]) | 'Many' >> beam.ParDo(_CountedRead()))


def test_splittable_dofn_outputs_as_side_inputs(assert_same_as_direct):
    """Regression: a side input read straight from a splittable DoFn failed with
    KeyError 'ref_PCollection_...' (no coder known for the side input's PCollection)."""
    def build(p):
        ranges, chars, one, many = _sources(p)
        main = p | 'Main' >> beam.Create(['a', 'b'])
        return {
            'views': _with_views(main, ranges, chars, one, many),
            'after_map': main | 'After a Map' >> beam.Map(
                lambda x, s: (x, sorted(s)),
                s=beam.pvalue.AsIter(ranges | 'Shift' >> beam.Map(lambda v: v + 100))),
            # The source's output is read as a main input too.
            'ranges': ranges,
        }

    out = assert_same_as_direct(build, args=['--bundle_size=10'])
    assert out['after_map'] == [repr(('a', [100, 100, 101, 101, 102])),
                                repr(('b', [100, 100, 101, 101, 102]))]


def test_splittable_dofn_outputs_as_side_inputs_streaming(same_as_direct_streaming):
    def build(p):
        ranges, chars, one, many = _sources(p)
        main = p | 'Main' >> beam.Create(['a', 'b'])
        return (_with_views(main, ranges, chars, one, many), ranges) | beam.Flatten()

    out = same_as_direct_streaming(build, args=['--bundle_size=10'])
    assert len(out) == 2 + 5
