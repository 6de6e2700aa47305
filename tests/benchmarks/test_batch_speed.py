"""The batch speed benchmark runs every configuration of every case, checks every output
and writes its report (timings are never asserted)."""

from __future__ import annotations

import collections
import os

import pytest

from benchmarks import batch_cases, batch_speed, micro


def test_every_case_and_runner_checks_its_output_and_the_report_is_written(
        tmp_path, spark_session, spark_args):
    rows = batch_speed.main(['--scale=0.002', '--repeats=1', '--warm_ups=1',
                             '--bundle_sizes=default,100', f'--out={tmp_path}', *spark_args])
    configs = [(batch_speed.PYSPARK, ''), (micro.DIRECT, ''), (micro.DIRECT_2, ''),
               (batch_speed.SPARK, 'default'), (batch_speed.SPARK, '100')]
    assert [(r['case'], r['runner'], r['bundle_size']) for r in rows] == [
        (case, runner, size) for case in batch_cases.CASES for runner, size in configs]
    assert all(r['output_ok'] == 'yes' for r in rows), rows
    assert all(r['median_s'] != '' and r['cpu_s'] != '' and r['x PySpark'] != ''
               for r in rows)
    assert all(r['goals'].startswith(('met', 'missed')) for r in rows
               if r['runner'] == batch_speed.SPARK)
    for name in ('results.md', 'results.csv', 'batch_speed.png'):
        assert os.path.getsize(tmp_path / name) > 0
    report = (tmp_path / 'results.md').read_text()
    assert '| output_ok |' in report and 'Cores this session got' in report


def test_generated_counts_are_what_the_file_holds(tmp_path):
    path = tmp_path / 'words.txt'
    counts = batch_cases.generate_words(str(path), 1005, 7)
    words = path.read_text().split()
    assert len(words) == 1005 and collections.Counter(words) == counts
    assert len(path.read_text().splitlines()) == 101  # WORDS_PER_LINE = 10, and a rest


@pytest.mark.parametrize('name', list(batch_cases.CASES))
def test_each_case_expects_what_its_pyspark_program_writes(tmp_path, spark_session, name):
    case = batch_cases.CASES[name]
    case_input = case.prepare(str(tmp_path), 0.001)
    case.pyspark(spark_session.sparkContext, case_input, str(tmp_path / 'out'))
    lines = batch_speed.read_lines(str(tmp_path / 'out'))
    assert lines and sorted(lines) == sorted(case_input.expected)


def test_a_wrong_or_empty_output_fails_and_has_no_time():
    configs = [(batch_speed.PYSPARK, ''), (micro.DIRECT, ''), (micro.DIRECT_2, ''),
               (batch_speed.SPARK, ''), (batch_speed.SPARK, '10')]
    walls = {configs[0]: [0.5], configs[1]: [2.0], configs[2]: [1.2], configs[3]: [0.7],
             configs[4]: [1.0]}
    cpus = {config: [1.0] for config in configs}
    verdicts = {config: ['yes'] for config in configs}
    verdicts[configs[4]] = ['failed: expected 3, got 0 (empty output)']
    pyspark, direct, _, spark, broken = batch_speed.summarize(
        'maps', configs, walls, cpus, verdicts, 10)
    assert direct['median_s'] == 2.0 and direct['vs DirectRunner'] == 1.0
    assert direct['x PySpark'] == 4.0 and pyspark['goals'] == ''
    assert spark['x PySpark'] == 1.4 and spark['vs DirectRunner'] == 2.86
    assert spark['goals'] == 'missed: < 2.0x DirectRunner (2 processes)'
    assert broken['output_ok'].startswith('failed') and broken['median_s'] == ''
    assert broken['vs DirectRunner'] == '' and broken['cpu_s'] == ''
    assert broken['goals'] == 'no time'
    del walls[configs[0]]  # without a PySpark row there is nothing to judge against
    spark = batch_speed.summarize('maps', configs[1:], walls, cpus, verdicts, 10)[2]
    assert spark['x PySpark'] == '' and spark['goals'].startswith('not judged')
