"""A bounded read's initial split cut into one share per partition
(`translators.source_shares`, through the reshuffle's map side).

Checked here, over real text files read by Beam's own text source:

* (hypothesis) any file or two, any initial chunk size, any number of shares: every
  line is read exactly once across the pieces, a share's pieces follow each other in
  the file, and no share but the last holds more than its `total / shares` of the bytes
  (to within the slack, or the short tail a file source keeps with a piece);
* a compressed file (unsplittable) and a source that ignores the positions it is
  asked to split go whole to one share;
* the reshuffle deals a source's split by shares, from its own partition index, and
  keeps dealing anything else round-robin.
"""

from __future__ import annotations

import gzip
import itertools
import os
import uuid

from apache_beam.coders import coders
from apache_beam.io import iobase
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.io.textio import ReadFromText
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_streams_runner.records import decode_with_raw
from beam_streams_runner.translators.reshuffle import RoundRobinPartitioner
from beam_streams_runner.translators.source_shares import (
    _SLACK,
    cut_into_shares,
    is_source_restriction,
)

_LINE = st.text(st.characters(blacklist_categories=('Cs',), blacklist_characters='\r\n'),
                max_size=30)


def _split(pattern: str, chunk: int | None = None) -> list[WindowedValue]:
    """Beam's initial split of `ReadFromText(pattern)`, as its split-and-size step
    outputs it."""
    source = ReadFromText(pattern)._source
    provider = iobase._SDFBoundedSourceRestrictionProvider(desired_chunk_size=chunk)
    return [WindowedValue(((source, (r, None)), provider.restriction_size(source, r)), 0,
                          (window.GlobalWindow(),))
            for r in provider.split(source, provider.initial_restriction(source))]


def _lines_of(piece: WindowedValue) -> list[str]:
    (_, (restriction, _)), _ = piece.value
    return list(restriction.source().read(restriction.range_tracker()))


def _bounds(piece: WindowedValue) -> tuple:
    bundle = piece.value[0][1][0]._source_bundle
    return bundle.source._file_name, bundle.start_position, bundle.stop_position


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.lists(_LINE, min_size=1, max_size=80), min_size=1, max_size=2),
       chunk=st.sampled_from([None, 7, 64, 300]), shares=st.integers(1, 5),
       first=st.integers(0, 4))
def test_every_line_once_and_shares_even(tmp_path, files, chunk, shares, first):
    directory = tmp_path / uuid.uuid4().hex
    directory.mkdir()
    expected = []
    for index, lines in enumerate(files):
        (directory / f'part-{index}.txt').write_text(''.join(f'{x}\n' for x in lines),
                                                     encoding='utf-8')
        expected += lines
    restrictions = _split(str(directory / 'part-*.txt'), chunk)
    total = sum(r.value[1] for r in restrictions)
    cut = list(cut_into_shares(restrictions, shares, first))

    assert sorted(line for _, piece in cut for line in _lines_of(piece)) == sorted(expected)
    assert [t for t, _ in cut] == sorted((t for t, _ in cut), key=lambda t: (t - first) % shares)
    weights = [0.0] * shares
    for target, piece in cut:
        weights[target] += piece.value[1]
    assert abs(sum(weights) - total) < 1e-6
    ordered = [weights[(first + i) % shares] for i in range(shares)]
    for weight in ordered[:-1]:
        # Within the slack of its due, or a quarter over: Beam's OffsetRange.split keeps
        # a tail shorter than a quarter of the piece asked for with it.
        assert weight <= total / shares * 1.25 * (1 + _SLACK) + 1
    for share in range(shares):
        pieces = [_bounds(p) for t, p in cut if t == share]
        for (name, _, stop), (next_name, start, _) in itertools.pairwise(pieces):
            assert name != next_name or stop == start  # one file's pieces follow on


def test_one_file_in_two_equal_halves(tmp_path):
    path = tmp_path / 'words.txt'
    path.write_text(''.join(f'word{i} ' * 10 + '\n' for i in range(20_000)), encoding='utf-8')
    restrictions = _split(str(path), 300_000)
    assert len(restrictions) > 2  # Beam's chunks, which round-robin would deal unevenly
    weights = [0.0, 0.0]
    for target, piece in cut_into_shares(restrictions, 2):
        weights[target] += piece.value[1]
    assert abs(weights[0] - weights[1]) <= 1 + os.path.getsize(path) * 2 * _SLACK


def test_a_compressed_file_goes_whole(tmp_path):
    path = tmp_path / 'words.txt.gz'
    with gzip.open(path, 'wt', encoding='utf-8') as f:
        f.write(''.join(f'line {i}\n' for i in range(5000)))
    restrictions = _split(str(path))
    cut = list(cut_into_shares(restrictions, 3, first=1))
    assert [t for t, _ in cut] == [1]
    assert len(_lines_of(cut[0][1])) == 5000


class _PositionBlindSource(iobase.BoundedSource):
    """A source whose split ignores the positions it is given (as some users' do)."""

    def __init__(self, size: int) -> None:
        self._size = size

    def estimate_size(self):
        return self._size

    def split(self, desired_bundle_size, start_position=None, stop_position=None):
        for start in range(0, self._size, desired_bundle_size):
            stop = min(self._size, start + desired_bundle_size)
            yield iobase.SourceBundle(stop - start, self, start, stop)

    def get_range_tracker(self, start_position, stop_position):
        return OffsetRangeTracker(start_position or 0,
                                  self._size if stop_position is None else stop_position)

    def read(self, range_tracker):
        for i in range(range_tracker.start_position(), range_tracker.stop_position()):
            if not range_tracker.try_claim(i):
                return
            yield i


def test_a_source_blind_to_positions_is_not_cut():
    source = _PositionBlindSource(100)
    restrictions = [
        WindowedValue(((source, (iobase._SDFBoundedSourceRestriction(bundle), None)),
                       bundle.weight), 0, (window.GlobalWindow(),))
        for bundle in (iobase.SourceBundle(30, source, 0, 30),
                       iobase.SourceBundle(70, source, 30, 100))]
    cut = list(cut_into_shares(restrictions, 2))
    # Asked for [30, 50), it gives [0, 20): the second restriction is not cut.
    assert [(t, p.value[1]) for t, p in cut] == [(0, 30), (0, 70)]
    assert sorted(x for _, p in cut for x in _lines_of(p)) == list(range(100))


_PICKLED = coders.WindowedValueCoder(coders.PickleCoder()).get_impl()
_INTS = coders.WindowedValueCoder(coders.VarIntCoder()).get_impl()


def _dealt(values, impl, start: int, partitions: int = 2) -> list[tuple[int, object]]:
    chunk = b''.join(impl.encode_nested(v) for v in values)
    partitioner = RoundRobinPartitioner(impl, impl, partitions, 1000, start=start)
    return [(target, value) for target, (_, data) in partitioner.partition('t', [chunk])
            for value, _ in decode_with_raw(impl, data)]


def test_the_reshuffle_deals_a_split_by_shares(tmp_path):
    path = tmp_path / 'words.txt'
    path.write_text(''.join(f'word{i} ' * 10 + '\n' for i in range(20_000)), encoding='utf-8')
    dealt = _dealt(_split(str(path), 300_000), _PICKLED, start=1)
    assert all(is_source_restriction(v) for _, v in dealt)
    weights = {0: 0.0, 1: 0.0}
    for target, value in dealt:
        weights[target] += value.value[1]
    assert abs(weights[0] - weights[1]) <= 1 + os.path.getsize(path) * 2 * _SLACK
    # The first share (the file's start) is the map partition's own index's.
    assert [t for t, v in dealt if _bounds(v)[1] == 0] == [1]
    assert sorted(x for _, v in dealt for x in _lines_of(v)) == sorted(
        f'word{i} ' * 10 for i in range(20_000))


def test_anything_else_is_still_dealt_round_robin():
    values = [WindowedValue(i, 0, (window.GlobalWindow(),)) for i in range(7)]
    assert [(t, v.value) for t, v in _dealt(values, _INTS, start=1, partitions=3)] == sorted(
        [((1 + i) % 3, i) for i in range(7)])
