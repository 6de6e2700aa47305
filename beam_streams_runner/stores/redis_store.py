"""A checkpoint store in a Redis server, shared by every host of a cluster.

Design section 8, "Checkpoint stores": the Redis implementation of
`CheckpointStore`, over redis-py. The URL is `redis://[:password@]host:port/db`
(`rediss://` for TLS, `unix://` for a local socket; redis-py parses them). An
entry E is the Redis hash `bsr:E` (a pair is a field of it), and the names of
the entries are also kept in the set `bsr:entries`, so that an entry exists
while it is empty (Redis drops empty hashes) and `entries(prefix)` need not
scan the key space. One Redis server (or a primary): not Redis Cluster, whose
keys of one entry would live on different nodes.

* Writes go through a Lua script that checks the entry exists and writes in
  the same atomic step (a write racing `delete_entry` cannot leave an orphan
  hash behind), one round trip for `put`, `put_many` and `put_together`;
  `get_many` and `delete_many` are one command each. `put_together` is one
  script run, which Redis executes alone, as it does a MULTI/EXEC transaction:
  readers see all of its writes or none.
* `delete_entry` is a MULTI/EXEC transaction (the set member and the hash go
  together).

Failures to reach the server (refused, timed out after `connect_timeout` or
`timeout` seconds, authentication failed, wrong db, a server that is loading,
read-only or out of memory) raise `CheckpointStoreUnavailableError`, which names
the URL with its password masked, what failed and what to do; the runner treats
it as a fault. A connection error is retried once (a stale pooled connection
after a server restart); a timeout is not, so an operation fails within its
timeout. The password never reaches a repr or an error message.

The store pickles as its URL, timeouts and `hmac_key_env` (the name of the
variable holding the HMAC key of chunked values, never the key), and connects
lazily in the process that unpickles it (Spark ships stores to its Python
workers); a pickle therefore carries the password of the URL, as the Spark job
itself must. See `base` for the chunked values and their HMAC.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis import exceptions as redis_errors
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry

from beam_streams_runner.errors import CheckpointStoreUnavailableError
from beam_streams_runner.stores.base import (
    CheckpointStore,
    EntryNotFoundError,
    check_entry_name,
    check_hmac_key_env,
)
from beam_streams_runner.stores.urls import redacted_url, scrub

ENTRIES_KEY = b'bsr:entries'
ENTRY_KEY_PREFIX = b'bsr:'
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_TIMEOUT = 30.0

# KEYS: the entries set, the entry's hash. ARGV: the entry's name, the number n
# of keys to delete, those n keys, then key, value pairs to set. Returns 0 (and
# writes nothing) when the entry does not exist and there is something to set.
_WRITE_SCRIPT = """
local first_pair = 3 + tonumber(ARGV[2])
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  if #ARGV >= first_pair then return 0 end
  return 1
end
-- unpack() is limited to a few thousand values, so long lists go in slices
-- (of an even length, so that pairs stay whole).
for i = 3, first_pair - 1, 1000 do
  redis.call('HDEL', KEYS[2], unpack(ARGV, i, math.min(i + 999, first_pair - 1)))
end
for i = first_pair, #ARGV, 1000 do
  redis.call('HSET', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return 1
"""
_WRITE_SHA = hashlib.sha1(_WRITE_SCRIPT.encode()).hexdigest()

# A put_many larger than this goes as several script calls (still one round trip):
# Redis caps one command's size (client-query-buffer-limit, 1 GB by default).
_BATCH_BYTES = 64 << 20

_Method = TypeVar('_Method', bound=Callable[..., Any])


def _guarded(method: _Method) -> _Method:
    """Raise the server's unavailability as `CheckpointStoreUnavailableError`."""
    @functools.wraps(method)
    def guarded(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except redis_errors.RedisError as error:
            unavailable = self._unavailable(method.__name__, error)
            if unavailable is None:
                raise
        # Raised outside the except block, so no traceback chains to the client's
        # exception (its frames hold the connection's arguments, password included).
        raise unavailable
    return guarded  # type: ignore[return-value]


class RedisStore(CheckpointStore):
    """Entries as Redis hashes `bsr:<entry>` listed in the set `bsr:entries`."""

    def __init__(self, url: str, hmac_key_env: str | None = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.redacted_url = redacted_url(url)
        try:
            self._options = parse_url(url)
        except ValueError as error:
            raise ValueError(f'Checkpoint store URL {self.redacted_url}: '
                             f'{scrub(str(error), url)}') from None
        path = urlsplit(url).path.strip('/')
        if url.lower().startswith(('redis:', 'rediss:')) and path and not path.isdigit():
            raise ValueError(f'Checkpoint store URL {self.redacted_url}: the path names the '
                             f'database by its number (redis://host:6379/0), not {path!r}')
        self._url = url
        self.hmac_key_env = check_hmac_key_env(hmac_key_env)
        self.connect_timeout = float(connect_timeout)
        self.timeout = float(timeout)
        self._client: redis.Redis | None = None
        self._script_loaded = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        keyed = f', hmac_key_env={self.hmac_key_env!r}' if self.hmac_key_env else ''
        return f'RedisStore({self.redacted_url!r}{keyed})'

    def __reduce__(self) -> tuple[type, tuple[str, str | None, float, float]]:
        # Connections stay behind: the copy connects when it is first used.
        return (RedisStore, (self._url, self.hmac_key_env, self.connect_timeout, self.timeout))

    def close(self) -> None:
        """Close this process's connections (the store reconnects if used again)."""
        with self._lock:
            client, self._client = self._client, None
            self._script_loaded = False
        if client is not None:
            client.close()

    @_guarded
    def check(self) -> None:
        """Ping the server; raises `CheckpointStoreUnavailableError` naming what failed."""
        self._redis().ping()

    # Entries ---------------------------------------------------------------------------
    @_guarded
    def create_entry(self, name: str) -> None:
        check_entry_name(name)
        self._redis().sadd(ENTRIES_KEY, name.encode('utf-8'))

    @_guarded
    def delete_entry(self, name: str) -> None:
        hash_key = _entry_key(name)
        pipe = self._redis().pipeline(transaction=True)
        pipe.srem(ENTRIES_KEY, name.encode('utf-8'))
        pipe.delete(hash_key)
        pipe.execute()

    @_guarded
    def entry_exists(self, name: str) -> bool:
        check_entry_name(name)
        return bool(self._redis().sismember(ENTRIES_KEY, name.encode('utf-8')))

    @_guarded
    def entries(self, prefix: str = '') -> list[str]:
        members = self._redis().smembers(ENTRIES_KEY)
        names = (raw.decode('utf-8', errors='replace') for raw in members)
        return sorted(name for name in names if name.startswith(prefix))

    # Pairs -----------------------------------------------------------------------------
    @_guarded
    def put(self, entry: str, key: bytes, value: bytes) -> None:
        self._write(entry, [([], [(key, value)])])

    @_guarded
    def get(self, entry: str, key: bytes) -> bytes | None:
        return self._redis().hget(_entry_key(entry), key)

    @_guarded
    def delete(self, entry: str, key: bytes) -> None:
        self._redis().hdel(_entry_key(entry), key)

    @_guarded
    def exists(self, entry: str, key: bytes) -> bool:
        return bool(self._redis().hexists(_entry_key(entry), key))

    @_guarded
    def keys(self, entry: str, prefix: bytes = b'') -> list[bytes]:
        # HKEYS, not HSCAN: before Redis 7.4 HSCAN also returns every value.
        return sorted(key for key in self._redis().hkeys(_entry_key(entry))
                      if key.startswith(prefix))

    # Batched pairs: one round trip each --------------------------------------------------
    @_guarded
    def put_many(self, entry: str, items: Mapping[bytes, bytes]) -> None:
        batches: list[tuple[list[bytes], list[tuple[bytes, bytes]]]] = []
        size = 0
        for key, value in items.items():
            if not batches or size + len(key) + len(value) > _BATCH_BYTES:
                batches.append(([], []))
                size = 0
            batches[-1][1].append((key, value))
            size += len(key) + len(value)
        if batches:
            self._write(entry, batches)
        else:
            _entry_key(entry)  # the same argument check as a write

    @_guarded
    def get_many(self, entry: str, keys: Iterable[bytes]) -> dict[bytes, bytes | None]:
        keys = list(keys)
        if not keys:
            return {}
        return dict(zip(keys, self._redis().hmget(_entry_key(entry), keys), strict=True))

    @_guarded
    def delete_many(self, entry: str, keys: Iterable[bytes]) -> None:
        keys = list(keys)
        if keys:
            self._redis().hdel(_entry_key(entry), *keys)

    @_guarded
    def put_together(self, entry: str, items: Mapping[bytes, bytes | None]) -> None:
        """All of `items` in one atomic script run (None deletes the key)."""
        deletes = [key for key, value in items.items() if value is None]
        pairs = [(key, value) for key, value in items.items() if value is not None]
        self._write(entry, [(deletes, pairs)])

    # Helpers ---------------------------------------------------------------------------
    def _write(self, entry: str,
               batches: list[tuple[list[bytes], list[tuple[bytes, bytes]]]]) -> None:
        """Runs the write script once per batch, all in one round trip."""
        hash_key = _entry_key(entry)
        name = entry.encode('utf-8')
        client = self._redis()
        if not self._script_loaded:
            # Sent blind to a server without the script, a large write would fail
            # whole and go again (a 256 MB snapshot took 15 s instead of 1.5 s).
            client.script_load(_WRITE_SCRIPT)
            self._script_loaded = True
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            for deletes, pairs in batches:
                pipe.evalsha(_WRITE_SHA, 2, ENTRIES_KEY, hash_key, name, len(deletes),
                             *deletes, *(part for pair in pairs for part in pair))
            try:
                results = pipe.execute()
            except redis_errors.NoScriptError:
                # First use on this server (or after SCRIPT FLUSH, or a restart):
                # the writes are idempotent, so load the script and send them again.
                if attempt:
                    raise
                client.script_load(_WRITE_SCRIPT)
                continue
            if not all(results):
                raise EntryNotFoundError(entry)
            return

    def _redis(self) -> redis.Redis:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = redis.Redis.from_url(
                        self._url, socket_connect_timeout=self.connect_timeout,
                        socket_timeout=self.timeout,
                        # One immediate retry of a connection error: a pooled
                        # connection may be stale after a server restart. Timeouts
                        # are not retried, so a call fails within its timeout.
                        retry=Retry(NoBackoff(), 1, (redis_errors.ConnectionError,)))
                client = self._client
        return client

    def _unavailable(self, operation: str,
                     error: redis_errors.RedisError) -> CheckpointStoreUnavailableError | None:
        diagnosis = _diagnose(error, self)
        if diagnosis is None:
            return None
        problem, remedy = diagnosis
        detail = scrub(f'{type(error).__name__}: {error}', self._url)
        return CheckpointStoreUnavailableError(
            self.redacted_url, f'{problem} (in {operation}: {detail})', remedy)

    def _ping_command(self) -> str:
        host = self._options.get('host', 'localhost')
        port = self._options.get('port', 6379)
        tls = ' --tls' if self._url.lower().startswith('rediss:') else ''
        return f'redis-cli -h {host} -p {port}{tls} ping'


def _entry_key(name: str) -> bytes:
    check_entry_name(name)
    return ENTRY_KEY_PREFIX + name.encode('utf-8')


def _diagnose(error: redis_errors.RedisError, store: RedisStore) -> tuple[str, str] | None:
    """(what failed, what to do) when `error` means the server is unavailable, else None."""
    text = str(error)
    check = f'Check that the server is up and reachable from this host ({store._ping_command()}).'
    if isinstance(error, redis_errors.AuthenticationError) or text.startswith(
            ('WRONGPASS', 'NOAUTH', 'invalid password')):
        return ('authentication failed', 'Put the server\'s password in the URL, '
                'percent-encoded (redis://:password@host:port/db, or redis://user:password@... '
                'for an ACL user), matching its requirepass or ACL.')
    if 'DB index is out of range' in text or 'Invalid Database' in text:
        return ('wrong db: the server has no database of that number',
                'Use a db number below the server\'s "databases" setting (16 by default), as in '
                'redis://host:6379/0.')
    if isinstance(error, redis_errors.BusyLoadingError):
        return ('the server is still loading its data into memory',
                'Wait until its log says "Ready to accept connections"; the runner retries.')
    if isinstance(error, redis_errors.TimeoutError):
        return (f'timed out (connect timeout {store.connect_timeout:g} s, operation timeout '
                f'{store.timeout:g} s)', 'The server is overloaded, paused, or a firewall drops '
                f'the packets. {check}')
    if isinstance(error, (redis_errors.NoPermissionError, redis_errors.AuthorizationError)):
        return ('the user lacks a permission', "Grant the URL's ACL user the commands of "
                "hashes, sets and scripts on the keys bsr:* (e.g. ACL SETUSER name "
                "+@hash +@set +@scripting +ping ~bsr:*).")
    if isinstance(error, redis_errors.ReadOnlyError):
        return ('the server is a read-only replica', 'Point the URL at the primary.')
    if isinstance(error, redis_errors.OutOfMemoryError):
        return ('the server is out of memory (maxmemory)', 'Give it more memory or delete the '
                'checkpoints of old jobs; never let it evict keys (maxmemory-policy noeviction).')
    if text.startswith(('MISCONF', 'MASTERDOWN')) or isinstance(
            error, redis_errors.MasterDownError):
        return ('the server refuses writes', f'Read its log: {text.split(".")[0]}.')
    if isinstance(error, redis_errors.ConnectionError):
        lowered = text.lower()
        if 'refused' in lowered:
            return ('connection refused', 'Start redis-server there, or fix the host and port '
                    f'in the URL. {check}')
        if any(s in lowered for s in ('name or service not known', 'nodename nor servname',
                                      'name resolution', 'getaddrinfo')):
            return ('the host name does not resolve', 'Fix the host in the URL.')
        if 'ssl' in lowered or 'certificate' in lowered or 'tls' in lowered:
            return ('the TLS handshake failed', 'Use rediss:// only for a server that speaks '
                    'TLS, and make sure its certificate is trusted here.')
        return ('connection failed', check)
    return None
