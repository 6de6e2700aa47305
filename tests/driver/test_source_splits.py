"""The driver's splits of a source with fewer restrictions than tasks (`source_splits`)."""

from __future__ import annotations

import ast
import collections
import itertools

import apache_beam as beam
from apache_beam.coders import PickleCoder, WindowedValueCoder
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import (
    ImpulseSeqGenRestrictionProvider,
    PeriodicImpulse,
)
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given
from hypothesis import strategies as st

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.driver import source_splits
from beam_streams_runner.driver.source_splits import SourceSplitter
from beam_streams_runner.translators.read import Residual
from tests.conftest import SPARK_ARGS, run_streaming

_CODER = WindowedValueCoder(PickleCoder()).get_impl()
_PROVIDER = ImpulseSeqGenRestrictionProvider()
_ELEMENT = (Timestamp(1000), Timestamp(2000), 0.001)  # firings every ms, long past


class _Stage:
    name = 'source'


def _splitter(tasks: int) -> SourceSplitter:
    splitter = SourceSplitter(lambda coder_id: _CODER, tasks)
    splitter._restrictions[('source', 'in')] = source_splits._Restrictions(_CODER, _PROVIDER)
    return splitter


def _residual(start: int, stop: int, watermark: int = 0) -> Residual:
    restriction = OffsetRange(start, stop)
    value = ((_ELEMENT, (restriction, None)), _PROVIDER.restriction_size(_ELEMENT, restriction))
    return Residual('in', _CODER.encode(WindowedValue(value, 0, [window.GlobalWindow()])),
                    0.0, watermark)


def _restriction(residual: Residual) -> OffsetRange:
    (element, (restriction, state)), size = _CODER.decode(residual.element).value
    assert element == _ELEMENT and state is None
    assert size == _PROVIDER.restriction_size(element, restriction)
    return restriction


@given(start=st.integers(0, 10_000), length=st.integers(1, 100_000),
       tasks=st.integers(1, 8), per_task=st.integers(1, 50_000))
def test_pieces_are_consecutive_and_cover_the_restriction(start, length, tasks, per_task):
    splitter = _splitter(tasks)
    splitter._rates['source'] = 8.0 * per_task  # restriction size (8 a firing) per second
    dealt = splitter.deal(_Stage(), [_residual(start, start + length)], budget_s=1.0)
    assert 1 <= len(dealt) <= tasks and all(len(d) == 1 for d in dealt)
    pieces = [_restriction(d[0]) for d in dealt]
    assert pieces[0].start == start and pieces[-1].stop == start + length
    for before, after in itertools.pairwise(pieces):
        assert before.stop == after.start
        assert abs(before.size() - per_task) <= 1  # the tracker rounds to whole offsets
    if len(pieces) < tasks:
        assert pieces[-1].size() <= per_task + 1, 'what was left is no bigger than a piece'


def test_no_split_before_a_rate_is_known_nor_with_a_residual_per_task():
    splitter = _splitter(2)
    first = splitter.deal(_Stage(), [_residual(0, 1000)], budget_s=1.0)
    assert [_restriction(d[0]) for d in first] == [OffsetRange(0, 1000)]
    splitter.observe(_Stage(), [_residual(100, 1000)], read_s=0.5)
    assert splitter._rates['source'] == 8 * 100 / 0.5
    behind, ahead = _residual(500, 600, watermark=5), _residual(0, 100, watermark=1)
    assert splitter.deal(_Stage(), [behind, ahead], budget_s=1.0) == [(ahead,), (behind,)]


def test_a_waiting_residual_is_not_split():
    splitter = _splitter(2)
    splitter._rates['source'] = 800.0
    waiting = _residual(0, 1000)._replace(resume_delay_s=0.5)
    assert splitter.deal(_Stage(), [waiting], budget_s=1.0) == [(waiting,)]


def test_one_restriction_is_read_by_every_task(tmp_path, spark_session, monkeypatch):
    """PeriodicImpulse over past timestamps (one restriction) into a windowed count: after
    the first epoch the restriction is cut so both tasks read, and the counts are exact."""
    dealt_to = []
    deal = SourceSplitter.deal

    def recording(self, stage, residuals, budget_s):
        slices = deal(self, stage, residuals, budget_s)
        dealt_to.append((len(residuals), len(slices)))
        return slices

    monkeypatch.setattr(SourceSplitter, 'deal', recording)
    # Short epochs and enough events that the source is read over many epochs on any
    # machine (a restriction is cut from the third epoch on: the first two give a rate).
    events, start, interval = 200_000, 1_000_000_000, 0.0005

    def build(p):
        return (p
                | PeriodicImpulse(start, start + (events - 0.5) * interval, interval)
                | beam.Map(lambda t: (round((float(t) - start) / interval) // 1000 % 7, 1))
                | beam.WindowInto(window.FixedWindows(5))
                | beam.CombinePerKey(sum)
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam: (int(w.start), *kv)))

    # Two tasks whatever the shared session's default parallelism (an earlier test's
    # pipeline may have started it with --parallelism=1).
    lines = run_streaming(build, StreamsSparkRunner(), str(tmp_path / 'out'),
                          [*SPARK_ARGS, '--parallelism=2', '--target_latency_ms=200'])
    expected = collections.Counter()
    for n in range(events):
        micros = Timestamp.of(start + interval * n).micros
        expected[((micros - micros % 5_000_000) // 1_000_000, n // 1000 % 7)] += 1
    counts = sorted(ast.literal_eval(line[:line.index(')') + 1]) for line in lines)
    assert counts == sorted((w, k, c) for (w, k), c in expected.items())
    assert (1, 2) in dealt_to, f'the one restriction was never read by two tasks: {dealt_to}'
