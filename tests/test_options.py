"""Tests of StreamsSparkOptions: defaults, parsing, validation messages and --help;
the consistent-region options, their settings and the store password kept out of sight."""

import copy
import logging
import os
import pickle
import re
from urllib.parse import urlparse

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_streams_runner import options as options_module
from beam_streams_runner.options import (
    CheckpointSettings,
    InvalidOptionsError,
    SecretUrl,
    StreamsSparkOptions,
    checkpoint_settings,
    configured_parallelism,
    default_checkpoint_root,
    default_checkpoint_store,
    new_job_name,
    parse_spark_conf,
    spark_parallelism,
    validate_streams_spark_options,
)
from beam_streams_runner.regions.layout import RegionLayout


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


# Consistent regions ----------------------------------------------------------------------

SECRET = 's3cr3t-Pw'
REDIS_URL = f'redis://:{SECRET}@redis.example:6379/2'


def _no_secret(text: str, *secrets: str) -> None:
    for secret in secrets or (SECRET,):
        assert secret not in text


def test_checkpoint_defaults():
    opts = _validate()
    assert opts.checkpoint_store is None
    assert opts.checkpoint_period_s == 10
    assert opts.checkpoint_mode == 'non_blocking'
    assert (opts.drain_timeout_s, opts.reset_timeout_s) == (180, 180)
    assert opts.max_consecutive_reset_attempts == 5
    assert opts.consistent_region is None and opts.autonomous_steps is None
    assert opts.checkpoint_hmac_key_env is None
    assert opts.restart_from_scratch is False
    settings = checkpoint_settings(PipelineOptions([]))
    assert settings == CheckpointSettings(
        store_url=None, period_s=10.0, mode='non_blocking', drain_timeout_s=180.0,
        reset_timeout_s=180.0, max_consecutive_reset_attempts=5,
        layout=RegionLayout({'default': ()}), hmac_key_env=None,
        restart_from_scratch=False, job_name=None)
    assert settings.enabled
    assert settings.layout.covers_every_step


def test_checkpoint_values_are_parsed():
    settings = checkpoint_settings(PipelineOptions([
        '--checkpoint_store=file:///var/ckpt', '--checkpoint_period_s=2.5',
        '--checkpoint_mode=blocking', '--drain_timeout_s=30', '--reset_timeout_s=0.5',
        '--max_consecutive_reset_attempts=1', '--consistent_region=in=Read,Parse',
        '--consistent_region', 'out=Write', '--autonomous_steps=Log',
        '--checkpoint_hmac_key_env=CKPT_KEY', '--restart_from_scratch', '--job_name=wc']))
    assert settings.store_url == 'file:///var/ckpt'
    assert isinstance(settings.store_url, SecretUrl)
    assert (settings.period_s, settings.mode, settings.drain_timeout_s,
            settings.reset_timeout_s, settings.max_consecutive_reset_attempts) == (
        2.5, 'blocking', 30.0, 0.5, 1)
    assert settings.layout.regions == {'in': ('Read', 'Parse'), 'out': ('Write',)}
    assert settings.layout.autonomous == ('Log',)
    assert (settings.hmac_key_env, settings.restart_from_scratch, settings.job_name) == (
        'CKPT_KEY', True, 'wc')
    assert settings.store_url_for('other') == 'file:///var/ckpt'


def test_period_zero_turns_regions_off():
    assert not checkpoint_settings(PipelineOptions(['--checkpoint_period_s=0'])).enabled


def test_checkpoint_values_set_from_code():
    options = PipelineOptions(checkpoint_period_s=3, max_consecutive_reset_attempts=2,
                              consistent_region='a=Read')
    settings = checkpoint_settings(options)
    assert settings.period_s == 3.0 and isinstance(settings.period_s, float)
    assert settings.max_consecutive_reset_attempts == 2
    assert settings.layout.regions == {'a': ('Read',)}


@pytest.mark.parametrize('store', [
    'redis://localhost:6379/0', 'redis://localhost', 'redis://h:6379', 'redis://h/3',
    'rediss://h:6380/1', f'redis://:{SECRET}@h:6379/0', f'redis://user:{SECRET}@h:1/0',
    'redis://[::1]:6379/0', 'redis://h:6379/0?socket_timeout=5', 'REDIS://h:1/0',
    'file:///var/ckpt', 'file://localhost/var/ckpt', '/var/ckpt', 'ckpt', './a:b',
    'memory://',
])
def test_valid_checkpoint_stores(store):
    assert checkpoint_settings(PipelineOptions([f'--checkpoint_store={store}'])).store_url == (
        store)


@pytest.mark.parametrize('flag, option', [
    ('--checkpoint_store=', 'checkpoint_store'),
    ('--checkpoint_store=redis://', 'checkpoint_store'),
    ('--checkpoint_store=redis://:6379/0', 'checkpoint_store'),
    ('--checkpoint_store=redis://h:port/0', 'checkpoint_store'),
    ('--checkpoint_store=redis://h:99999/0', 'checkpoint_store'),
    ('--checkpoint_store=redis://h:0/0', 'checkpoint_store'),
    ('--checkpoint_store=redis://h:6379/zero', 'checkpoint_store'),
    ('--checkpoint_store=rediss://h:1/0/1', 'checkpoint_store'),
    ('--checkpoint_store=redis://[::1/0', 'checkpoint_store'),
    ('--checkpoint_store=file://host/var/ckpt', 'checkpoint_store'),
    ('--checkpoint_store=file://relative', 'checkpoint_store'),
    ('--checkpoint_store=memory://name', 'checkpoint_store'),
    ('--checkpoint_store=s3://bucket/ckpt', 'checkpoint_store'),
    ('--checkpoint_store=localhost:6379', 'checkpoint_store'),
    ('--checkpoint_store=redis:localhost', 'checkpoint_store'),
    ('--checkpoint_period_s=-1', 'checkpoint_period_s'),
    ('--checkpoint_period_s=often', 'checkpoint_period_s'),
    ('--checkpoint_period_s=nan', 'checkpoint_period_s'),
    ('--checkpoint_period_s=inf', 'checkpoint_period_s'),
    ('--checkpoint_mode=sometimes', 'checkpoint_mode'),
    ('--checkpoint_mode=non-blocking', 'checkpoint_mode'),
    ('--drain_timeout_s=0', 'drain_timeout_s'),
    ('--drain_timeout_s=-5', 'drain_timeout_s'),
    ('--reset_timeout_s=0', 'reset_timeout_s'),
    ('--reset_timeout_s=soon', 'reset_timeout_s'),
    ('--max_consecutive_reset_attempts=0', 'max_consecutive_reset_attempts'),
    ('--max_consecutive_reset_attempts=1.5', 'max_consecutive_reset_attempts'),
    ('--consistent_region=nameonly', 'consistent_region'),
    ('--consistent_region==Read', 'consistent_region'),
    ('--consistent_region=a=', 'consistent_region'),
    ('--autonomous_steps=Read,,Write', 'autonomous_steps'),
    ('--checkpoint_hmac_key_env=1KEY', 'checkpoint_hmac_key_env'),
    ('--checkpoint_hmac_key_env=MY-KEY', 'checkpoint_hmac_key_env'),
    ('--job_name=', 'job_name'),
])
def test_each_invalid_checkpoint_value_names_its_option(flag, option):
    for check in (_validate, lambda *flags: checkpoint_settings(PipelineOptions(list(flags)))):
        with pytest.raises(InvalidOptionsError) as info:
            check(flag)
        message = str(info.value)
        assert f'--{option}' in message
        assert '1 problem' in message


def test_period_problem_says_what_zero_means():
    with pytest.raises(InvalidOptionsError, match='0 turns consistent regions off'):
        _validate('--checkpoint_period_s=-1')


def test_hmac_key_given_instead_of_a_name_is_not_echoed():
    key = 'k3y/with+chars=='
    with pytest.raises(InvalidOptionsError) as info:
        _validate(f'--checkpoint_hmac_key_env={key}')
    assert key not in str(info.value)
    assert 'not the key' in str(info.value)


def test_all_checkpoint_problems_in_one_message():
    with pytest.raises(InvalidOptionsError) as info:
        _validate('--bundle_size=0', '--checkpoint_store=s3://b', '--checkpoint_period_s=-1',
                  '--checkpoint_mode=x', '--drain_timeout_s=0', '--reset_timeout_s=0',
                  '--max_consecutive_reset_attempts=0', '--consistent_region=x',
                  '--consistent_region=a=Read', '--consistent_region=a=Parse',
                  '--autonomous_steps=,', '--checkpoint_hmac_key_env=-')
    message = str(info.value)
    assert '11 problems' in message
    for option in ('bundle_size', 'checkpoint_store', 'checkpoint_period_s', 'checkpoint_mode',
                   'drain_timeout_s', 'reset_timeout_s', 'max_consecutive_reset_attempts',
                   'consistent_region', 'autonomous_steps', 'checkpoint_hmac_key_env'):
        assert f'--{option}' in message


def test_region_layout_problems_come_as_options_problems():
    with pytest.raises(InvalidOptionsError) as info:
        checkpoint_settings(PipelineOptions(['--consistent_region=a=Read',
                                             '--consistent_region=b=Read']))
    assert str(info.value).startswith('Invalid StreamsSparkRunner options (1 problem)')
    assert "step prefix 'Read' is in regions 'a' and 'b'" in str(info.value)


@pytest.mark.parametrize('flag, suggestion', [
    ('--checkpoint-store=/tmp/x', '--checkpoint_store'),
    ('--checkpoint_period=5', '--checkpoint_period_s'),
    ('--consistent_regions=a=Read', '--consistent_region'),
    ('--autonomous_step=Read', '--autonomous_steps'),
    ('--restart_from_scrach', '--restart_from_scratch'),
    ('--max_consecutive_reset_attempt=3', '--max_consecutive_reset_attempts'),
])
def test_misspelled_checkpoint_flags(flag, suggestion):
    with pytest.raises(InvalidOptionsError, match=f'did you mean {suggestion}\\?'):
        _validate(flag)


def test_misspelled_store_flag_does_not_show_the_password():
    with pytest.raises(InvalidOptionsError) as info:
        _validate(f'--checkpoint-store={REDIS_URL}')
    assert 'did you mean --checkpoint_store?' in str(info.value)
    assert 'redis://:***@redis.example:6379/2' in str(info.value)
    _no_secret(str(info.value))


def test_help_lists_checkpoint_options(capsys):
    with pytest.raises(SystemExit):
        StreamsSparkOptions(['--help'])
    out = capsys.readouterr().out
    for option in ('--checkpoint_store', '--checkpoint_period_s', '--checkpoint_mode',
                   '--drain_timeout_s', '--reset_timeout_s', '--max_consecutive_reset_attempts',
                   '--consistent_region', '--autonomous_steps', '--checkpoint_hmac_key_env',
                   '--restart_from_scratch', 'BEAM_STREAMS_RUNNER_HOME',
                   '~/.beam_streams_runner', '<home>/checkpoints/<job_name>'):
        assert option in out


# The store password ----------------------------------------------------------------------

def test_secret_url_shows_no_password_but_holds_it():
    url = SecretUrl(REDIS_URL)
    redacted = 'redis://:***@redis.example:6379/2'
    assert url.redacted == redacted
    assert (str(url), repr(url), f'{url}', f'{url!r}', f'{url!s}', '%s' % url, '%r' % url,
            '{}'.format(url), format(url, '>5')) == (
        redacted, repr(redacted), redacted, repr(redacted), redacted, redacted,
        repr(redacted), redacted, redacted)
    assert url == REDIS_URL and url.reveal() == REDIS_URL
    assert type(url.reveal()) is str
    assert urlparse(url).password == SECRET
    assert hash(url) == hash(REDIS_URL)


def test_secret_url_survives_copies_and_pickles():
    url = SecretUrl(REDIS_URL)
    for copied in (pickle.loads(pickle.dumps(url)), pickle.loads(pickle.dumps(url, 0)),
                   copy.deepcopy(url), copy.copy(url), SecretUrl(url)):
        assert isinstance(copied, SecretUrl)
        assert copied.reveal() == REDIS_URL
        _no_secret(str(copied))


def test_secret_url_without_password_is_unchanged():
    for text in ('/var/ckpt', 'file:///var/a@b', 'redis://h:1/0', 'memory://'):
        assert str(SecretUrl(text)) == text == SecretUrl(text).redacted


def test_password_with_special_characters():
    password = 'p@ss:w%40rd'  # '@' and ':' as they are, and '@' percent-encoded
    url = f'redis://:{password}@h.example:6379/1'
    settings = checkpoint_settings(PipelineOptions([f'--checkpoint_store={url}']))
    store = settings.store_url
    assert str(store) == 'redis://:***@h.example:6379/1'
    _no_secret(repr(settings), 'p@ss', 'w%40rd', 'w@rd')
    parsed = urlparse(store)
    assert (parsed.hostname, parsed.port, parsed.password) == ('h.example', 6379, password)
    import redis

    kwargs = redis.ConnectionPool.from_url(store).connection_kwargs
    assert (kwargs['host'], kwargs['port'], kwargs['db'], kwargs['password']) == (
        'h.example', 6379, 1, 'p@ss:w@rd')


def test_beam_options_do_not_show_the_password(caplog):
    from apache_beam.transforms.display import DisplayData

    options = PipelineOptions([f'--checkpoint_store={REDIS_URL}', '--job_name=j'])
    view = options.view_as(StreamsSparkOptions)
    texts = [repr(options), str(options), repr(view), str(view), '%s' % view, f'{view}',
             str(options.get_all_options()), repr(options.get_all_options()),
             str(options.display_data()), str(view.get_all_options(drop_default=True)),
             str(DisplayData.create_from_options(options).items),
             repr(checkpoint_settings(options)), str(checkpoint_settings(options))]
    assert 'redis://:***@redis.example:6379/2' in str(view)
    with caplog.at_level(logging.INFO):
        logging.getLogger('test').info('store %s %r', view.checkpoint_store,
                                       view.checkpoint_store)
        logging.getLogger('test').info('options %s', view)
    texts.append(caplog.text)
    for text in texts:
        _no_secret(text)
    # The real URL is still there for the store's client.
    assert urlparse(options.get_all_options()['checkpoint_store']).password == SECRET
    assert checkpoint_settings(options).store_url.reveal() == REDIS_URL


def test_store_url_set_from_code_does_not_show_the_password():
    options = PipelineOptions(checkpoint_store=REDIS_URL)
    view = validate_streams_spark_options(options)
    _no_secret(str(view))
    _no_secret(str(options.get_all_options()))
    assert isinstance(view.checkpoint_store, SecretUrl)
    view.checkpoint_store = f'rediss://:{SECRET}@other:1/0'
    _no_secret(str(view))
    assert checkpoint_settings(options).store_url.reveal() == f'rediss://:{SECRET}@other:1/0'


@pytest.mark.parametrize('store', [
    f'redis://:{SECRET}@h:port/0', f'redis://:{SECRET}@:6379/0', f'redis://:{SECRET}@h:1/x',
    f'redis://:{SECRET}/x@h:1/0', f'redis://:{SECRET}[@h:1/0', f'bogus://:{SECRET}@h',
    f'rediss://u:{SECRET}@h:0',
])
def test_store_problems_do_not_show_the_password(store):
    with pytest.raises(InvalidOptionsError) as info:
        _validate(f'--checkpoint_store={store}')
    assert '--checkpoint_store=' in str(info.value)
    _no_secret(str(info.value))


# Default store and job names -------------------------------------------------------------

def test_default_store_is_a_directory_per_job(monkeypatch, tmp_path):
    monkeypatch.delenv('BEAM_STREAMS_RUNNER_HOME', raising=False)
    monkeypatch.setenv('HOME', str(tmp_path))
    root = str(tmp_path / '.beam_streams_runner' / 'checkpoints')
    assert default_checkpoint_root() == root
    assert default_checkpoint_store('wordcount') == os.path.join(root, 'wordcount')
    settings = checkpoint_settings(PipelineOptions(['--job_name=wordcount']))
    assert settings.store_url is None
    assert settings.store_url_for(settings.job_name) == os.path.join(root, 'wordcount')
    monkeypatch.setenv('BEAM_STREAMS_RUNNER_HOME', str(tmp_path / 'elsewhere'))
    assert default_checkpoint_store('a-b_c.1') == str(
        tmp_path / 'elsewhere' / 'checkpoints' / 'a-b_c.1')


@pytest.mark.parametrize('job_name, directory', [
    ('../up', '%2E.%2Fup'), ('..', '%2E.'), ('.hidden', '%2Ehidden'), ('a/b', 'a%2Fb'),
    ('a%2Fb', 'a%252Fb'), ('my job', 'my%20job'),
])
def test_default_store_escapes_the_job_name(monkeypatch, tmp_path, job_name, directory):
    monkeypatch.setenv('BEAM_STREAMS_RUNNER_HOME', str(tmp_path))
    assert default_checkpoint_store(job_name) == str(tmp_path / 'checkpoints' / directory)


def test_default_store_needs_a_job_name():
    with pytest.raises(ValueError, match='job name'):
        default_checkpoint_store('')


def test_plain_store_path_expands_home(monkeypatch, tmp_path):
    monkeypatch.setenv('HOME', str(tmp_path))
    settings = checkpoint_settings(PipelineOptions(['--checkpoint_store=~/ckpt']))
    assert settings.store_url == str(tmp_path / 'ckpt')
    assert isinstance(settings.store_url, SecretUrl)


def test_new_job_names_are_fresh():
    first, second = new_job_name(), new_job_name()
    assert first != second
    assert re.fullmatch(r'beamapp-[a-z0-9-]+-\d{8}-\d{6}-[0-9a-f]{6}', first)
