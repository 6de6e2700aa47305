"""`WriteToRedis`: a Redis sink, exactly-once under consistent regions.

Design sections 8 and 12 ("Sinks publish after the cut"). The sink writes a
PCollection of `(key, value)`: a `str`/`bytes` value is a SET of `key_prefix + key`,
a `dict[str, str | bytes]` an HSET of those fields (merged into the hash).

Its DoFn sets `publishes_after_checkpoint = True` (regions/publishing.py): with
consistent regions on, the runner holds the sink's input until the cut covering it
is committed, then releases it under a fence (`current_fence()`, the epoch it
waited from). Released data may be released again after a failure (a replay), and
a task attempt that the runner gave up on may still write late. So each write goes
through one Lua script, atomic on the server, which keeps per sink a hash
`bsr:fence:<sink_name>` of key -> fence and applies a write only if the key's
stored fence is missing or <= the write's fence (equal: a replay of the same
publish re-applies the same value), then stores the fence. An older fence is
ignored: a late write never overwrites a newer value. Without a fence (regions
off, batch, another runner) writes are plain SET/HSET: at-least-once, idempotent
for a deterministic pipeline.

`sink_name` defaults to `db<N>/<key_prefix>` (the URL's database number and the
prefix), not the transform's label: the fences guard keys, so every sink writing
the same keys of the same database must share one fence hash, and a pipeline whose
steps are renamed must keep its fences. The fence hash holds one field per key
written (it grows with the key space it guards).

The URL may carry a password: errors, logs, `repr` and display data show it
redacted (`stores.urls.redacted_url`), never the URL itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import apache_beam as beam
import redis
from apache_beam.metrics import Metrics
from apache_beam.transforms.display import DisplayDataItem
from redis import exceptions as redis_errors

from beam_streams_runner.errors import StreamsSparkRunnerError
from beam_streams_runner.regions.publishing import current_fence
from beam_streams_runner.stores.urls import redacted_url, scrub

_LOGGER = logging.getLogger(__name__)

FENCE_HASH_PREFIX = 'bsr:fence:'
# Writes buffered before a pipelined round trip (also flushed at the bundle's end).
FLUSH_AT = 500

# KEYS[1]: the sink's fence hash, KEYS[2]: the key written. ARGV[1]: the fence,
# ARGV[2]: 'set' or 'hset', ARGV[3..]: the value, or the hash's field/value pairs.
# Returns 1 if applied, 0 if ignored (an older fence than the key's).
FENCED_WRITE_LUA = """
local stored = redis.call('HGET', KEYS[1], KEYS[2])
if stored and tonumber(stored) > tonumber(ARGV[1]) then
  return 0
end
if ARGV[2] == 'set' then
  redis.call('SET', KEYS[2], ARGV[3])
else
  redis.call('HSET', KEYS[2], unpack(ARGV, 3))
end
redis.call('HSET', KEYS[1], KEYS[2], ARGV[1])
return 1
"""

_HOW_TO_FIX = ('Check that redis-server is running there and that the URL is right: '
               'redis://[:password@]host:port/db, rediss:// for TLS, unix:///path?db=N.')


class RedisIOError(StreamsSparkRunnerError):
    """A Redis sink or source cannot reach or use its server (the URL is redacted)."""


def connect(url: str, who: str) -> redis.Redis:
    """A client of `url`, checked with a PING; errors name `who` and the redacted URL."""
    shown = redacted_url(url)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=10, socket_timeout=60)
    except ValueError as error:
        # `from None`: the chained error could hold parts of the URL.
        raise ValueError(f'{who}: invalid Redis URL {shown}: {scrub(str(error), url)}. '
                         f'{_HOW_TO_FIX}') from None
    try:
        client.ping()
    except redis_errors.RedisError as error:
        client.close()
        raise unavailable(who, url, 'cannot reach', error) from None
    return client


def unavailable(who: str, url: str, doing: str, error: BaseException) -> RedisIOError:
    detail = scrub(f'{type(error).__name__}: {error}', url)
    return RedisIOError(f'{who} {doing} Redis at {redacted_url(url)} ({detail}). {_HOW_TO_FIX}')


def default_sink_name(url: str, key_prefix: str) -> str:
    """`db<N>/<key_prefix>`: the fences guard keys, whatever the step is called."""
    try:
        db = redis.connection.parse_url(url).get('db', 0)
    except ValueError as error:
        raise ValueError(f'WriteToRedis: invalid Redis URL {redacted_url(url)}: '
                         f'{scrub(str(error), url)}. {_HOW_TO_FIX}') from None
    return f'db{db}/{key_prefix}'


class WriteToRedis(beam.PTransform):
    """Writes `(key, str | bytes)` (SET) or `(key, dict)` (HSET) elements to Redis.

    Exactly-once with consistent regions on (fenced, idempotent writes after the
    cut), at-least-once otherwise. See the module docstring.
    """

    def __init__(self, url: str, *, key_prefix: str = '', sink_name: str | None = None) -> None:
        super().__init__()
        self._fn = _WriteToRedisFn(url, key_prefix,
                                   sink_name or default_sink_name(url, key_prefix))

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return pcoll | 'Write' >> beam.ParDo(self._fn)

    def display_data(self) -> dict:
        return self._fn.display_data()


class _WriteToRedisFn(beam.DoFn):
    """Buffers a bundle's writes and sends them pipelined, fenced when behind the gate."""

    publishes_after_checkpoint = True

    def __init__(self, url: str, key_prefix: str, sink_name: str) -> None:
        self._url = url
        self._key_prefix = key_prefix
        self.sink_name = sink_name
        self._fence_hash = FENCE_HASH_PREFIX + sink_name
        # Made in setup(): a client does not pickle, and the DoFn is shipped to workers.
        self._client: redis.Redis | None = None
        self._script = None
        self._buffer: list[tuple[str, object, int | None]] = []
        self._written = Metrics.counter('WriteToRedis', 'writes')
        self._stale = Metrics.counter('WriteToRedis', 'stale_writes_ignored')

    def __repr__(self) -> str:
        return f'WriteToRedis({redacted_url(self._url)!r}, sink_name={self.sink_name!r})'

    def display_data(self) -> dict:
        return {'url': DisplayDataItem(redacted_url(self._url), label='Redis URL'),
                'key_prefix': DisplayDataItem(self._key_prefix, label='Key prefix'),
                'sink_name': DisplayDataItem(self.sink_name, label='Fence hash')}

    def setup(self) -> None:
        self._client = connect(self._url, 'WriteToRedis')
        # register_script: EVALSHA, loading the script again if the server lost it.
        self._script = self._client.register_script(FENCED_WRITE_LUA)
        self._buffer = []

    def start_bundle(self) -> None:
        self._buffer = []

    def process(self, element) -> None:
        key, value = _checked(element)
        # Read per element: each released element carries the epoch it waited from.
        self._buffer.append((self._key_prefix + key, value, current_fence()))
        if len(self._buffer) >= FLUSH_AT:
            self._flush()

    def finish_bundle(self) -> None:
        self._flush()

    def teardown(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _flush(self) -> None:
        if not self._buffer:
            return
        writes, self._buffer = self._buffer, []
        pipe = self._client.pipeline(transaction=False)
        fenced = []
        for key, value, fence in writes:
            if fence is None:
                if isinstance(value, Mapping):
                    pipe.hset(key, mapping=value)
                else:
                    pipe.set(key, value)
                fenced.append(False)
                continue
            if isinstance(value, Mapping):
                args = [fence, 'hset', *(part for item in value.items() for part in item)]
            else:
                args = [fence, 'set', value]
            self._script(keys=[self._fence_hash, key], args=args, client=pipe)
            fenced.append(True)
        try:
            results = pipe.execute()
        except redis_errors.RedisError as error:
            raise unavailable('WriteToRedis', self._url, 'could not write to', error) from None
        stale = sum(1 for is_fenced, result in zip(fenced, results, strict=True)
                    if is_fenced and result == 0)
        self._written.inc(len(writes) - stale)
        if stale:
            # Normal after a failure: an old attempt's late writes lose to newer ones.
            self._stale.inc(stale)
            _LOGGER.debug('WriteToRedis %s (%s): %d writes under an older fence ignored',
                          self.sink_name, redacted_url(self._url), stale)


def _checked(element) -> tuple[str, object]:
    """`(key, value)` of an element, or a TypeError saying what the sink takes."""
    try:
        if isinstance(element, (str, bytes, Mapping)):
            raise TypeError  # these unpack too, but are no pair
        key, value = element
    except (TypeError, ValueError):
        raise TypeError(f'WriteToRedis takes (key, value) pairs, got {type(element).__name__}: '
                        f'{element!r:.200}') from None
    if not isinstance(key, str):
        raise TypeError(f'WriteToRedis keys are str, got {type(key).__name__}: {key!r:.200}')
    if isinstance(value, Mapping):
        if not value:
            # HSET of no field is an error in Redis; an empty hash does not exist there.
            raise ValueError(f'WriteToRedis: an empty dict for key {key!r:.200} '
                             '(Redis has no empty hashes)')
        bad = [v for v in value.values() if not isinstance(v, (str, bytes, int, float))]
        if bad:
            raise TypeError(f'WriteToRedis: hash values are str or bytes, got '
                            f'{type(bad[0]).__name__} for key {key!r:.200}')
    elif not isinstance(value, (str, bytes, int, float)):
        raise TypeError(f'WriteToRedis values are str, bytes or dict, got '
                        f'{type(value).__name__} for key {key!r:.200}')
    return key, value
