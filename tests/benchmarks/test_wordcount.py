"""The word count benchmark runs every configuration, checks every output and writes its
report (timings are never asserted)."""

from __future__ import annotations

import collections
import os

from benchmarks import micro, wordcount


def test_wordcount_benchmark_checks_every_output_and_writes_its_report(
        tmp_path, spark_session, spark_args):
    rows = wordcount.main(['--words=3000', '--distinct=50', '--repeats=1', '--warm_ups=1',
                           '--bundle_sizes=default,100', f'--out={tmp_path}', *spark_args])
    assert [(r['runner'], r['bundle_size']) for r in rows] == [
        (wordcount.PYSPARK, ''), (micro.DIRECT, ''), (micro.DIRECT_2, ''),
        (wordcount.SPARK, 'default'), (wordcount.SPARK, '100')]
    assert all(r['output_ok'] == 'yes' for r in rows), rows
    assert all(r['median_s'] != '' and r['cpu_s'] != '' for r in rows)
    assert all(r[f'vs {direct}'] != '' for r in rows for direct in micro.DIRECT_RUNNERS)
    for name in ('results.md', 'results.csv', 'wordcount.png'):
        assert os.path.getsize(tmp_path / name) > 0
    report = (tmp_path / 'results.md').read_text()
    assert '| output_ok |' in report and 'Cores this session got' in report


def test_generated_counts_are_what_the_file_holds(tmp_path):
    path = tmp_path / 'words.txt'
    counts = wordcount.generate(str(path), 1005, 7)
    words = path.read_text().split()
    assert len(words) == 1005 and collections.Counter(words) == counts
    assert len(path.read_text().splitlines()) == 101  # WORDS_PER_LINE = 10, and a rest
    assert sorted(wordcount.expected_lines(counts)) == sorted(
        f'{word}: {count}' for word, count in counts.items())


def test_a_wrong_or_empty_output_fails_and_has_no_time():
    configs = [(micro.DIRECT, ''), (wordcount.SPARK, '')]
    walls = {configs[0]: [2.0], configs[1]: [1.0]}
    cpus = {configs[0]: [2.0], configs[1]: [1.5]}
    verdicts = {configs[0]: ['yes'], configs[1]: ['failed: expected 3, got 0 (empty output)']}
    direct, spark = wordcount.summarize(configs, walls, cpus, verdicts, 10, 3)
    assert direct['median_s'] == 2.0 and direct['vs DirectRunner'] == 1.0
    assert spark['output_ok'].startswith('failed') and spark['median_s'] == ''
    assert spark['vs DirectRunner'] == '' and spark['cpu_s'] == ''
