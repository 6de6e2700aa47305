"""`io.ReadFromRedisStream`: its restriction tracker, its DoFn read by hand (watermarks,
self-checkpoints, runner splits), and runs against a real redis-server on Beam's
DirectRunner and StreamsSparkRunner `--streaming`, with entries added before and
while the pipeline runs."""

from __future__ import annotations

import json
import threading
import time

import apache_beam as beam
import pytest
import redis
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners import sdf_utils
from apache_beam.utils.timestamp import Timestamp
from conftest import SPARK_ARGS

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.io import ReadFromRedisStream, WriteToRedis
from beam_streams_runner.io.redis_sink import RedisIOError
from beam_streams_runner.io.redis_stream_source import (
    StreamRange,
    StreamRestrictionTracker,
    _ReadStreamFn,
    parse_id,
)

DB = 6  # a database of its own on the session's server
STREAM = 'events'
OUT = 'out'  # the list `Record` appends to, in the order elements come out


def add(client: redis.Redis, first: int, count: int) -> list[str]:
    """XADDs entries `<first + i>-0` with field n = i + first; returns their ids."""
    ids = [f'{first + i}-0' for i in range(count)]
    for stream_id in ids:
        client.xadd(STREAM, {'n': stream_id.split('-')[0], 'b': b'\xc3\xa9'}, id=stream_id)
    return ids


# The tracker --------------------------------------------------------------------------------
def test_ids_parse_as_integer_pairs():
    assert parse_id('1000-2') == (1000, 2) and parse_id(b'7-0') == (7, 0)
    assert parse_id('5') == (5, 0) and parse_id('5', as_end=True) == (5, 2 ** 64 - 1)
    assert parse_id('10-0') > parse_id('9-99')  # integers, not text
    with pytest.raises(ValueError, match='Not a Redis stream id'):
        parse_id('$')


def test_the_tracker_claims_in_order_up_to_the_stop():
    tracker = StreamRestrictionTracker(StreamRange((1000, 0), (1002, 0)))
    assert tracker.is_bounded()
    assert tracker.try_claim('1000-1') and tracker.try_claim((1001, 0))
    with pytest.raises(ValueError, match='increasing'):
        tracker.try_claim('1001-0')
    with pytest.raises(ValueError):
        tracker.check_done()  # 1002-0 may still come
    assert not tracker.try_claim('1002-1')  # past the stop
    tracker.check_done()
    assert tracker.try_split(0) is None  # nothing left to split off


def test_the_start_is_exclusive():
    tracker = StreamRestrictionTracker(StreamRange((1000, 0), None))
    with pytest.raises(ValueError):
        tracker.try_claim('1000-0')


def test_a_checkpoint_residual_starts_after_the_last_claimed_id():
    tracker = StreamRestrictionTracker(StreamRange((0, 0), None))
    assert not tracker.is_bounded()
    with pytest.raises(ValueError):
        tracker.check_done()  # an unbounded restriction is never done unless split
    assert tracker.try_claim('5-0') and tracker.try_claim('7-3')
    primary, residual = tracker.try_split(0)
    assert primary == StreamRange((0, 0), (7, 3)) == tracker.current_restriction()
    assert residual == StreamRange((7, 3), None)
    assert tracker.is_bounded()
    tracker.check_done()
    assert not tracker.try_claim('8-0')  # belongs to the residual now
    residual_tracker = StreamRestrictionTracker(residual)
    assert residual_tracker.try_claim('7-4')


def test_a_checkpoint_before_any_claim_hands_everything_on():
    tracker = StreamRestrictionTracker(StreamRange((3, 0), (9, 0)))
    primary, residual = tracker.try_split(0.5)
    assert primary.is_empty() and residual == StreamRange((3, 0), (9, 0))
    tracker.check_done()


# The DoFn, read by hand ------------------------------------------------------------------------
def read(fn, restriction: StreamRange, split_after: int | None = None):
    """(outputs, watermark, deferred residual or None, the final restriction)."""
    tracker = sdf_utils.ThreadsafeRestrictionTracker(StreamRestrictionTracker(restriction))
    estimator = ManualWatermarkEstimator(Timestamp(0))
    outputs, split = [], None
    for output in fn._read(sdf_utils.RestrictionTrackerView(tracker), estimator):
        outputs.append((output.value[0], output.timestamp))
        if split_after is not None and len(outputs) == split_after:
            split = tracker.try_split(1e-9)  # as the runner checkpoints after a bundle
    tracker.check_done()
    deferred = tracker.deferred_status()
    residual = deferred[0] if deferred else (split[1] if split else None)
    return (outputs, estimator.current_watermark(), residual,
            tracker.current_restriction())


@pytest.fixture
def fn(redis_db):
    read_fn = _ReadStreamFn(redis_db[0], STREAM, poll_interval_s=0.1, batch_size=3)
    read_fn.setup()
    yield read_fn
    read_fn.teardown()


def test_the_dofn_defers_what_it_has_not_read_yet(redis_db, fn):
    add(redis_db[1], 1000, 5)
    outputs, watermark, residual, primary = read(fn, StreamRange((0, 0), None))
    assert outputs == [(f'{1000 + i}-0', Timestamp(micros=(1000 + i) * 1000))
                       for i in range(5)]
    assert watermark == Timestamp(micros=1_004_000)  # the last id's milliseconds
    assert primary == StreamRange((0, 0), (1004, 0))
    assert residual == StreamRange((1004, 0), None)
    add(redis_db[1], 1005, 2)
    outputs, watermark, residual, _ = read(fn, residual)  # the replay of a cut
    assert [o[0] for o in outputs] == ['1005-0', '1006-0']
    assert residual == StreamRange((1006, 0), None)


def test_a_runner_split_mid_read_leaves_the_rest_to_the_residual(redis_db, fn):
    add(redis_db[1], 1000, 6)
    outputs, _, residual, primary = read(fn, StreamRange((0, 0), (1005, 0)), split_after=2)
    assert [o[0] for o in outputs] == ['1000-0', '1001-0']
    assert primary == StreamRange((0, 0), (1001, 0))
    assert residual == StreamRange((1001, 0), (1005, 0))
    outputs, watermark, left, _ = read(fn, residual)
    assert [o[0] for o in outputs] == ['1002-0', '1003-0', '1004-0', '1005-0']
    assert left is None and watermark == Timestamp(micros=1_005_000)


def test_a_bounded_read_ends_when_the_stream_passes_the_stop(redis_db, fn):
    add(redis_db[1], 1000, 2)
    outputs, _, residual, _ = read(fn, StreamRange((0, 0), (1010, 0)))
    assert len(outputs) == 2 and residual == StreamRange((1001, 0), (1010, 0))  # waits
    # An id past the stop, deleted again: no entry <= the stop can come any more.
    redis_db[1].xadd(STREAM, {'n': 'x'}, id='1012-0')
    redis_db[1].xdel(STREAM, '1012-0')
    outputs, watermark, left, _ = read(fn, residual)
    assert outputs == [] and left is None
    assert watermark == Timestamp(micros=1_010_000)  # done: the watermark at the stop


def test_an_unreachable_server_is_named_redacted():
    fn = _ReadStreamFn('redis://:pw-Secret@127.0.0.1:1/0', STREAM, 0.1, 3)
    with pytest.raises(RedisIOError, match=r'redis://:\*\*\*@127.0.0.1:1/0') as raised:
        fn.setup()
    assert 'pw-Secret' not in str(raised.value)
    assert 'pw-Secret' not in repr(ReadFromRedisStream('redis://:pw-Secret@h/0', STREAM)._fn)


def test_the_output_is_unbounded_without_a_stop():
    p = beam.Pipeline()
    assert not (p | 'U' >> ReadFromRedisStream('redis://h', STREAM)).is_bounded
    assert (p | 'B' >> ReadFromRedisStream('redis://h', STREAM, stop_after_id='9-0')).is_bounded


# Pipelines ---------------------------------------------------------------------------------------
class Record(beam.DoFn):
    """RPUSHes `id|millis|fields` to list OUT: the order and count elements came out in."""

    def __init__(self, url: str) -> None:
        self._url = url

    def setup(self) -> None:
        self._client = redis.Redis.from_url(self._url)

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        stream_id, fields = element
        self._client.rpush(OUT, f'{stream_id}|{timestamp.micros // 1000}|'
                                f'{json.dumps(fields, sort_keys=True)}')

    def teardown(self) -> None:
        self._client.close()


def expected(ids: list[str]) -> list[str]:
    return [f'{i}|{i.split("-")[0]}|{json.dumps({"b": "é", "n": i.split("-")[0]})}'
            for i in ids]


def run_read(url: str, runner, args: list[str], stop: str) -> None:
    with beam.Pipeline(runner=runner, options=PipelineOptions(args)) as p:
        read = p | ReadFromRedisStream(url, STREAM, stop_after_id=stop, batch_size=4,
                                       poll_interval_s=0.2)
        read | beam.ParDo(Record(url))
        read | WriteToRedis(url, key_prefix='copy:')


def recorded(client: redis.Redis) -> list[str]:
    return [line.decode() for line in client.lrange(OUT, 0, -1)]


@pytest.fixture(params=['direct', 'spark-streaming'])
def runner(request) -> tuple[object, list[str]]:
    """The runner a read runs on and its flags (Spark's session started for it)."""
    if request.param == 'direct':
        return 'DirectRunner', []
    request.getfixturevalue('spark_session')
    return StreamsSparkRunner(), [*SPARK_ARGS, '--streaming']


@pytest.mark.timeout(120)
def test_entries_added_before_the_run_come_out_once_in_order(redis_db, runner):
    url, client = redis_db
    ids = add(client, 1000, 11)
    run_read(url, *runner, stop=ids[-1])
    assert recorded(client) == expected(ids)
    assert client.hgetall('copy:1010-0') == {b'n': b'1010', b'b': 'é'.encode()}


@pytest.mark.timeout(120)
def test_entries_added_while_the_pipeline_runs(redis_db, runner):
    url, client = redis_db
    first = add(client, 1000, 3)
    later = [f'{1003 + i}-0' for i in range(6)]

    def add_later() -> None:
        # Once the pipeline has read the first entries (or after 60 s, so that it ends
        # whatever happened), add the rest in small steps.
        adder = redis.Redis.from_url(url)
        deadline = time.monotonic() + 60
        while adder.llen(OUT) < len(first) and time.monotonic() < deadline:
            time.sleep(0.05)
        for start in range(0, len(later), 2):
            time.sleep(0.3)
            add(adder, 1003 + start, 2)
        adder.close()

    thread = threading.Thread(target=add_later, daemon=True)
    thread.start()
    run_read(url, *runner, stop=later[-1])
    thread.join(timeout=10)
    assert recorded(client) == expected(first + later)
