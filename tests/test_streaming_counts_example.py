"""The streaming counts example, bounded by --num_elements: its panes and its progress.

(Run as a module until Ctrl-C or SIGTERM, it is the program of the cancellation
tests in `test_result`.)
"""

from __future__ import annotations

import collections
import datetime
import re

import pytest
from apache_beam.runners.runner import PipelineState
from conftest import read_shards

from beam_streams_runner.examples import streaming_counts

pytestmark = pytest.mark.timeout(600)

PANE = re.compile(r'^\[(\S+), (\S+)\) (\w+): (\d+) \((\w+) pane (\d+)\)$')


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace('Z', '+00:00'))


def test_each_tick_of_the_grid_has_the_next_word():
    from apache_beam.utils.timestamp import Timestamp
    words, first = streaming_counts.WORDS, 51_000_000_003  # ticks at 30 a second
    ticks = [Timestamp.of((first + i) / 30) for i in range(18)]
    assert [streaming_counts.word_at(t, 30.0) for t in ticks] == [
        words[(first + i) % len(words)] for i in range(18)]


def test_bounded_streaming_counts(tmp_path, spark_session, spark_args):
    prefix = str(tmp_path / 'panes')
    result = streaming_counts.main([
        '--runner=StreamsSparkRunner', *spark_args, '--num_elements=45', '--rate=30',
        '--window_s=1', f'--output={prefix}'])
    assert result.state == PipelineState.DONE
    lines = read_shards(prefix)
    panes = [PANE.match(line) for line in lines]
    assert all(panes), lines
    totals: dict[str, int] = collections.Counter()
    windows = set()
    for pane in panes:
        start, end, word, count, timing, index = pane.groups()
        assert (_time(end) - _time(start)).total_seconds() == 1.0
        # The default trigger: one pane per window and word, when the watermark passes it.
        assert (timing, index) == ('ON_TIME', '0')
        assert (start, word) not in windows
        windows.add((start, word))
        totals[word] += int(count)
    # 45 words are five rounds of the nine words ('the' twice a round).
    assert totals == {word: 5 * streaming_counts.WORDS.count(word)
                      for word in streaming_counts.WORDS}
    records = result.progress()
    assert [r['epoch'] for r in records] == list(range(len(records)))
    assert sum(r['sources']['Words']['elements'] for r in records) == 45
    assert sum(r['sinks']['Write']['elements'] for r in records) == len(lines)
