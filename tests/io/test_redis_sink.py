"""`io.WriteToRedis` against a real redis-server: the fenced Lua write, runs on Beam's
DirectRunner and on StreamsSparkRunner (batch and streaming), and a password in the URL
that never shows in errors, `repr` or display data."""

from __future__ import annotations

import socket
import traceback

import apache_beam as beam
import pytest
import redis
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.display import DisplayData
from conftest import SPARK_ARGS

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.io import WriteToRedis
from beam_streams_runner.io.redis_sink import FLUSH_AT, RedisIOError, default_sink_name
from beam_streams_runner.regions.publishing import current_fence, fenced, is_publishing
from beam_streams_runner.stores.redis_server import RedisServer

DB = 5  # a database of the session's server of its own: other test modules use db 0
SINK = 'test-sink'
FENCES = 'bsr:fence:' + SINK
PASSWORD = 's3cret-Pw'  # a test password: the point is that it never shows


def write(url: str, elements, fence: int | None, key_prefix: str = '') -> None:
    """Runs the sink's DoFn over `elements` in one bundle, under `fence` (None: plain)."""
    fn = WriteToRedis(url, key_prefix=key_prefix, sink_name=SINK)._fn
    fn.setup()
    try:
        fn.start_bundle()
        if fence is None:
            assert current_fence() is None
            for element in elements:
                fn.process(element)
        else:
            with fenced(fence):
                for element in elements:
                    fn.process(element)
        fn.finish_bundle()
    finally:
        fn.teardown()


# The fenced write --------------------------------------------------------------------------
def test_the_sink_publishes_after_the_checkpoint(redis_db):
    assert is_publishing(WriteToRedis(redis_db[0])._fn)


def test_fenced_set_newer_applies_equal_reapplies_older_is_ignored(redis_db):
    url, client = redis_db
    write(url, [('k', 'v5')], fence=5)
    assert client.get('k') == b'v5'
    write(url, [('k', b'v7')], fence=7)  # newer
    assert client.get('k') == b'v7'
    write(url, [('k', 'v7-again')], fence=7)  # equal: a replay of the same publish
    assert client.get('k') == b'v7-again'
    write(url, [('k', 'late')], fence=6)  # older: an old attempt's late write
    assert client.get('k') == b'v7-again'
    assert client.hgetall(FENCES) == {b'k': b'7'}


def test_fenced_hset_merges_fields_and_ignores_older_fences(redis_db):
    url, client = redis_db
    write(url, [('h', {'a': '1', 'b': b'2'})], fence=3, key_prefix='p:')
    write(url, [('h', {'b': '3', 'c': '4'})], fence=4, key_prefix='p:')
    write(url, [('h', {'a': 'old', 'd': 'old'})], fence=2, key_prefix='p:')
    assert client.hgetall('p:h') == {b'a': b'1', b'b': b'3', b'c': b'4'}
    write(url, [('h', {'a': '5'})], fence=4, key_prefix='p:')  # equal: re-applied
    assert client.hget('p:h', 'a') == b'5'
    assert client.hgetall(FENCES) == {b'p:h': b'4'}


def test_fences_are_per_key_and_the_last_equal_write_wins(redis_db):
    url, client = redis_db
    write(url, [('a', '1'), ('b', '1'), ('a', '2')], fence=10)
    write(url, [('b', '0')], fence=9)
    write(url, [('c', '0')], fence=1)  # a new key: no fence stored yet
    assert [client.get(k) for k in 'abc'] == [b'2', b'1', b'0']
    assert client.hgetall(FENCES) == {b'a': b'10', b'b': b'10', b'c': b'1'}


def test_without_a_fence_writes_are_plain(redis_db):
    url, client = redis_db
    write(url, [('s', 'x'), ('h', {'f': 'y'})], fence=None, key_prefix='plain:')
    assert client.get('plain:s') == b'x'
    assert client.hgetall('plain:h') == {b'f': b'y'}
    assert not client.exists(FENCES)


def test_a_bundle_larger_than_a_flush_is_written_whole(redis_db):
    url, client = redis_db
    count = FLUSH_AT * 2 + 7
    write(url, [(f'k{i}', str(i)) for i in range(count)], fence=1)
    assert client.dbsize() == count + 1  # and the fence hash
    assert client.hlen(FENCES) == count
    assert client.get(f'k{count - 1}') == str(count - 1).encode()


@pytest.mark.parametrize('element', [('k',), 'kv', (1, 'v'), ('k', None), ('k', {}),
                                     ('k', {'f': None})])
def test_bad_elements_say_what_the_sink_takes(redis_db, element):
    with pytest.raises((TypeError, ValueError), match='WriteToRedis'):
        write(redis_db[0], [element], fence=None)


def test_the_default_sink_name_is_the_db_and_the_prefix():
    assert default_sink_name('redis://:pw@host:1/3', 'user:') == 'db3/user:'
    assert default_sink_name('unix:///tmp/redis.sock?db=2', '') == 'db2/'
    assert WriteToRedis('redis://localhost')._fn.sink_name == 'db0/'


# Pipelines ------------------------------------------------------------------------------------
ELEMENTS = [(f'k{i}', f'v{i}') for i in range(40)] + [
    (f'h{i}', {'n': str(i), 'bytes': b'\x00\xff'}) for i in range(10)]


def run_sink(url: str, runner, args: list[str], prefix: str) -> None:
    with beam.Pipeline(runner=runner, options=PipelineOptions(args)) as p:
        (p | beam.Create(ELEMENTS)
           | beam.Reshuffle()  # more than one bundle and partition write
           | WriteToRedis(url, key_prefix=prefix))


def assert_written(client: redis.Redis, prefix: str) -> None:
    for key, value in ELEMENTS:
        if isinstance(value, dict):
            assert client.hgetall(prefix + key) == {
                k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in value.items()}
        else:
            assert client.get(prefix + key) == value.encode()
    assert len(client.keys(prefix + '*')) == len(ELEMENTS)


def test_direct_runner_batch(redis_db):
    url, client = redis_db
    run_sink(url, 'DirectRunner', [], 'direct:')
    assert_written(client, 'direct:')


def test_streams_spark_runner_batch(redis_db, spark_session):
    url, client = redis_db
    run_sink(url, StreamsSparkRunner(), list(SPARK_ARGS), 'batch:')
    assert_written(client, 'batch:')


@pytest.mark.parametrize('regions', ['on', 'off'])
def test_streams_spark_runner_streaming(redis_db, spark_session, regions):
    url, client = redis_db
    args = [*SPARK_ARGS, '--streaming'] + (['--checkpoint_period_s=0'] if regions == 'off' else [])
    run_sink(url, StreamsSparkRunner(), args, 'streaming:')
    assert_written(client, 'streaming:')
    # Consistent regions (on by default in streaming) release the sink's input behind the
    # publish gate, under a fence: every key has one. Without them writes are plain.
    fences = client.hgetall(f'bsr:fence:db{DB}/streaming:')
    if regions == 'on':
        assert sorted(fences) == sorted(f'streaming:{k}'.encode() for k, _ in ELEMENTS)
    else:
        assert fences == {}


# Passwords never show ---------------------------------------------------------------------------
def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_an_unreachable_server_is_named_redacted(redis_db):
    url = f'redis://:{PASSWORD}@127.0.0.1:{_unused_port()}/0'
    fn = WriteToRedis(url)._fn
    with pytest.raises(RedisIOError) as raised:
        fn.setup()
    text = ''.join(traceback.format_exception(raised.value))
    assert PASSWORD not in text
    assert 'redis://:***@127.0.0.1' in str(raised.value)
    assert 'redis-server is running' in str(raised.value)


@pytest.mark.parametrize('runner', ['direct', 'spark'])
def test_an_unreachable_server_fails_a_pipeline_without_its_password(request, runner):
    url = f'redis://:{PASSWORD}@127.0.0.1:{_unused_port()}/0'
    if runner == 'spark':
        request.getfixturevalue('spark_session')
        pipeline = beam.Pipeline(StreamsSparkRunner(), options=PipelineOptions(SPARK_ARGS))
    else:
        pipeline = beam.Pipeline('DirectRunner')
    # Exception: each runner wraps the sink's error in its own.
    with pytest.raises(Exception) as raised, pipeline as p:
        p | beam.Create([('k', 'v')]) | WriteToRedis(url)
    text = ''.join(traceback.format_exception(raised.value))
    assert 'cannot reach Redis at redis://:***@127.0.0.1' in text
    assert PASSWORD not in text


def test_a_wrong_password_is_not_shown():
    with RedisServer(password='right-Pw') as server:
        good = server.url
        write(good, [('k', 'v')], fence=None)
        assert server.client().get('k') == b'v'
        wrong = good.replace('right-Pw', PASSWORD)
        with pytest.raises(RedisIOError) as raised:
            write(wrong, [('k', 'v')], fence=None)
    text = ''.join(traceback.format_exception(raised.value))
    assert PASSWORD not in text and 'right-Pw' not in text


def test_repr_str_and_display_data_hide_the_password():
    transform = WriteToRedis(f'redis://:{PASSWORD}@localhost:6379/1', key_prefix='p:')
    shown = [repr(transform), str(transform), repr(transform._fn), str(transform._fn),
             repr(DisplayData.create_from(transform).items),
             repr(DisplayData.create_from(beam.ParDo(transform._fn)).items)]
    for text in shown:
        assert PASSWORD not in text
    assert 'redis://:***@localhost:6379/1' in repr(transform._fn)
