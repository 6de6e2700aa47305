"""Tests of StreamsSparkOptions: defaults, parsing, validation messages and --help."""

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_streams_runner import options as options_module
from beam_streams_runner.options import (
    InvalidOptionsError,
    StreamsSparkOptions,
    configured_parallelism,
    parse_spark_conf,
    spark_parallelism,
    validate_streams_spark_options,
)


def _validate(*flags: str) -> StreamsSparkOptions:
    return validate_streams_spark_options(PipelineOptions(list(flags)))


def test_defaults():
    opts = _validate()
    assert isinstance(opts, StreamsSparkOptions)
    assert opts.spark_master == 'local[*]'
    assert opts.spark_conf is None
    assert configured_parallelism(opts) is None
    assert opts.bundle_size == 1000
    assert opts.bundle_time_ms == 100
    assert opts.target_latency_ms == 1000
    assert opts.keyed_state_gc is True


def test_values_are_parsed():
    opts = _validate('--spark_master=local[4]', '--parallelism=8', '--bundle_size=5',
                     '--bundle_time_ms=20')
    assert (opts.spark_master, opts.parallelism, opts.bundle_size, opts.bundle_time_ms) == (
        'local[4]', 8, 5, 20)
    opts = _validate('--target_latency_ms=250', '--no_keyed_state_gc')
    assert (opts.target_latency_ms, opts.keyed_state_gc) == (250, False)


def test_no_conflict_with_other_beam_options():
    # FlinkRunnerOptions also defines --parallelism; Beam parses all options classes with
    # one parser, so a second definition would be an argparse conflict.
    options = PipelineOptions(['--parallelism=4', '--bundle_size=7', '--runner=Direct'])
    all_options = options.get_all_options()
    assert all_options['parallelism'] == 4
    assert all_options['bundle_size'] == 7
    assert options.view_as(StreamsSparkOptions).parallelism == 4
    assert StreamsSparkOptions(['--parallelism=4']).parallelism == 4
    assert StreamsSparkOptions([]).parallelism is None


@pytest.mark.parametrize('flags', [[], ['--parallelism=-1']])
def test_parallelism_not_set(flags):
    assert configured_parallelism(_validate(*flags)) is None


def test_repeated_spark_conf():
    opts = _validate('--spark_conf=spark.driver.memory=4g',
                     '--spark_conf', 'spark.sql.shuffle.partitions=7',
                     '--spark_conf=spark.executor.extraJavaOptions=-Da=b',
                     '--spark_conf=spark.driver.memory=2g')
    assert len(opts.spark_conf) == 4
    assert parse_spark_conf(opts.spark_conf) == {
        'spark.driver.memory': '2g',  # the later entry wins
        'spark.sql.shuffle.partitions': '7',
        'spark.executor.extraJavaOptions': '-Da=b',  # value keeps its own '='
    }


def test_parse_spark_conf_empty():
    assert parse_spark_conf(None) == {}
    assert parse_spark_conf([]) == {}
    assert parse_spark_conf(['a=']) == {'a': ''}


@pytest.mark.parametrize('entry', ['novalue', '=value', ' =x'])
def test_parse_spark_conf_rejects_bad_entries(entry):
    with pytest.raises(InvalidOptionsError, match='--spark_conf'):
        parse_spark_conf([entry])


@pytest.mark.parametrize('master', [
    'local', 'local[1]', 'local[16]', 'local[*]', 'local[2,3]', 'local[*,4]',
    'spark://host:7077', 'spark://10.0.0.1:7077,10.0.0.2:7077', 'spark://my-host.example:7077',
    'yarn', 'k8s://https://kube.example:6443',
])
def test_valid_masters(master):
    assert _validate(f'--spark_master={master}').spark_master == master


@pytest.mark.parametrize('flag, option', [
    ('--bundle_size=0', 'bundle_size'),
    ('--bundle_size=-5', 'bundle_size'),
    ('--bundle_time_ms=0', 'bundle_time_ms'),
    ('--bundle_time_ms=-1', 'bundle_time_ms'),
    ('--target_latency_ms=0', 'target_latency_ms'),
    ('--parallelism=0', 'parallelism'),
    ('--parallelism=-2', 'parallelism'),
    ('--spark_conf=spark.driver.memory', 'spark_conf'),
    ('--spark_conf==4g', 'spark_conf'),
    ('--spark_master=local[0]', 'spark_master'),
    ('--spark_master=local[x]', 'spark_master'),
    ('--spark_master=local[*', 'spark_master'),
    ('--spark_master=spark://host', 'spark_master'),
    ('--spark_master=spark://', 'spark_master'),
    ('--spark_master=mesos://host:5050', 'spark_master'),
    ('--spark_master=k8s://', 'spark_master'),
    ('--spark_master=', 'spark_master'),
    ('--spark_master=locale', 'spark_master'),
])
def test_each_invalid_value_names_its_option(flag, option):
    with pytest.raises(InvalidOptionsError) as info:
        _validate(flag)
    message = str(info.value)
    assert f'--{option}' in message
    assert '1 problem' in message


def test_all_problems_in_one_message():
    with pytest.raises(InvalidOptionsError) as info:
        _validate('--bundle_size=0', '--bundle_time_ms=0', '--parallelism=0',
                  '--spark_conf=oops', '--spark_master=nowhere')
    message = str(info.value)
    assert '5 problems' in message
    for option in ('bundle_size', 'bundle_time_ms', 'parallelism', 'spark_conf',
                   'spark_master'):
        assert f'--{option}' in message
    # Each problem says what to do instead.
    assert 'positive integer' in message
    assert 'key=value' in message
    assert 'local[*]' in message


def test_invalid_options_error_is_value_error():
    assert issubclass(InvalidOptionsError, ValueError)


def test_help_lists_all_options(capsys):
    with pytest.raises(SystemExit) as info:
        StreamsSparkOptions(['--help'])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for option in ('--spark_master', '--spark_conf', '--parallelism', '--bundle_size',
                   '--bundle_time_ms'):
        assert option in out
    assert 'local[*]' in out
    assert 'key=value' in out


def test_spark_parallelism(monkeypatch):
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, '_active_spark_context', None)
    monkeypatch.setattr(options_module.os, 'cpu_count', lambda: 6)
    assert spark_parallelism(PipelineOptions(['--parallelism=5'])) == 5
    assert spark_parallelism(PipelineOptions(['--spark_master=local[3]'])) == 3
    assert spark_parallelism(PipelineOptions(['--spark_master=local[2,4]'])) == 2
    assert spark_parallelism(PipelineOptions(['--spark_master=local'])) == 1
    assert spark_parallelism(PipelineOptions(['--spark_master=local[*]'])) == 6
    assert spark_parallelism(PipelineOptions(['--spark_master=yarn'])) == 6
