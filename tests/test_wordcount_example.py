"""The word count example gives the same output on StreamsSparkRunner as on the DirectRunner."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

import pytest
from conftest import read_shards

from beam_streams_runner.examples import wordcount

pytestmark = pytest.mark.timeout(180)

TEXT = [
    "It was the best of times, it was the worst of times,",
    "it was the age of wisdom, it was the age of foolishness,",
    "",
    "it was the epoch of belief, it was the epoch of incredulity,",
    "don't count 'quoted' words twice: it's the same word",
    "Üñíçødé wörds count too; 42 is a word and so is x_y",
]


@pytest.fixture
def input_file(tmp_path):
    path = tmp_path / 'input.txt'
    # Enough lines for several bundles, few enough to stay quick.
    path.write_text('\n'.join(TEXT * 40) + '\n', encoding='utf-8')
    return str(path)


def _counts(prefix):
    return read_shards(prefix)


def _expected_counts():
    words = collections.Counter(
        word for line in TEXT * 40 for word in re.findall(r"[\w\']+", line))
    return sorted(f'{word}: {count}' for word, count in words.items())


def test_wordcount_same_on_both_runners(input_file, tmp_path, spark_session, spark_args):
    direct_out = str(tmp_path / 'direct' / 'counts')
    spark_out = str(tmp_path / 'spark' / 'counts')
    direct = wordcount.main(['--runner=DirectRunner', '--input', input_file,
                             '--output', direct_out])
    spark = wordcount.main(['--runner=StreamsSparkRunner', '--input', input_file,
                            '--output', spark_out, '--bundle_size=50', *spark_args])
    assert direct.state == spark.state == 'DONE'
    expected = _counts(direct_out)
    assert expected, 'the DirectRunner wrote no counts'
    assert expected == _expected_counts()
    assert "don't: 40" in expected and 'Üñíçødé: 40' in expected
    assert _counts(spark_out) == expected


def test_wordcount_as_a_module(input_file, tmp_path):
    """`python -m beam_streams_runner.examples.wordcount --runner=StreamsSparkRunner`."""
    out = str(tmp_path / 'module' / 'counts')
    subprocess.run(
        [sys.executable, '-m', 'beam_streams_runner.examples.wordcount',
         '--runner=StreamsSparkRunner', '--spark_master=local[2]',
         '--input', input_file, '--output', out],
        check=True, cwd=str(tmp_path), timeout=170,
        env={**os.environ, 'PYSPARK_PYTHON': sys.executable})
    assert _counts(out) == _expected_counts()
