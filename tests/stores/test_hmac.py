"""HMAC-authenticated chunked values, in every kind of store.

A store given `hmac_key_env` (the name of an environment variable holding the
key) seals every chunk and the header of a chunked value with HMAC-SHA256.
Property tests: any value with any chunk size round-trips, and any single
flipped byte of any chunk or of the header, written through the store's plain
pairs (or straight into Redis with the redis client), is rejected as failing
authentication. Values written without the key, with another key, or moved
to another key are rejected; a store without a key rejects a keyed value; an
unset variable is named (its value never is); version 1 headers still read.
"""

from __future__ import annotations

import os
import pickle
import struct
import uuid
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_streams_runner.stores import (
    CheckpointStore,
    CorruptCheckpointError,
    HmacKeyMissingError,
    LocalDirectoryStore,
    MemoryStore,
    RedisStore,
    store_from_url,
)
from beam_streams_runner.stores.base import CHUNK_INFIX

VARIABLE = 'BSR_TEST_CHECKPOINT_KEY'
KEY = 'k3y-that-must-never-show-9a1c'
OTHER_KEY = 'another-key-5e2b'
PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(params=['memory', 'local_directory', 'redis'])
def kind(request):
    return request.param


@pytest.fixture
def make_store(kind, tmp_path, request, monkeypatch):
    """`make_store(hmac_key_env)`: stores of one kind over the same data."""
    monkeypatch.setenv(VARIABLE, KEY)
    shared = MemoryStore()
    made: list[CheckpointStore] = []

    def make(hmac_key_env: str | None = VARIABLE) -> CheckpointStore:
        if kind == 'memory':
            # The same dicts under another key setting.
            store = MemoryStore(hmac_key_env=hmac_key_env)
            store._entries = shared._entries
            return store
        if kind == 'redis':
            made.append(RedisStore(request.getfixturevalue('redis_store')._url,
                                   hmac_key_env=hmac_key_env))
            return made[-1]
        return LocalDirectoryStore(str(tmp_path / 'checkpoints'), hmac_key_env=hmac_key_env)
    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(make_store) -> CheckpointStore:
    return make_store()


def fresh_entry(store: CheckpointStore) -> str:
    name = f'job/op-{uuid.uuid4().hex[:8]}'
    store.create_entry(name)
    return name


def chunk_keys(store, entry, key):
    return store.keys(entry, prefix=key + CHUNK_INFIX)


def flipped(raw: bytes, position: int) -> bytes:
    position %= len(raw)
    return raw[:position] + bytes([raw[position] ^ 0x01]) + raw[position + 1:]


def assert_unauthentic(raised, entry, index) -> None:
    message = str(raised.value)
    assert raised.value.entry == entry and raised.value.key == b'ckpt'
    assert raised.value.chunk_index == index
    assert 'fails authentication' in message and VARIABLE in message
    assert 'written without the key, with another key, or tampered with' in message
    assert KEY not in message


@st.composite
def values_and_chunk_sizes(draw, min_size=0):
    value = draw(st.binary(min_size=min_size, max_size=2000))
    chunk_size = draw(st.integers(max(1, len(value) // 40), max(1, len(value) + 3)))
    return value, chunk_size


# Round trips and tampering ------------------------------------------------------------------
@PROPERTY
@given(case=values_and_chunk_sizes(), key=st.binary(max_size=20))
def test_keyed_values_round_trip(store, case, key):
    value, chunk_size = case
    entry = fresh_entry(store)
    store.put_chunked(entry, key, value, chunk_size=chunk_size)
    assert store.get_chunked(entry, key) == value
    chunks = chunk_keys(store, entry, key)
    assert len(chunks) == -(-len(value) // chunk_size)
    # Each chunk carries a 32-byte HMAC instead of a 4-byte CRC.
    assert sum(len(store.get(entry, k)) for k in chunks) == len(value) + 32 * len(chunks)
    store.put_chunked(entry, key, value[::-1], chunk_size=chunk_size)  # a rewrite
    assert store.get_chunked(entry, key) == value[::-1]
    store.delete_chunked(entry, key)
    assert store.keys(entry) == []


@PROPERTY
@given(case=values_and_chunk_sizes(min_size=1), index=st.integers(0, 10_000),
       position=st.integers(0, 1 << 20))
def test_any_flipped_chunk_byte_fails_authentication(store, case, index, position):
    value, chunk_size = case
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', value, chunk_size=chunk_size)
    chunks = chunk_keys(store, entry, b'ckpt')
    index %= len(chunks)
    store.put(entry, chunks[index], flipped(store.get(entry, chunks[index]), position))
    with pytest.raises(CorruptCheckpointError) as raised:
        store.get_chunked(entry, b'ckpt')
    assert_unauthentic(raised, entry, index)


@PROPERTY
@given(case=values_and_chunk_sizes(), position=st.integers(0, 1 << 20))
def test_any_flipped_header_byte_is_rejected(store, case, position):
    value, chunk_size = case
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', value, chunk_size=chunk_size)
    store.put(entry, b'ckpt', flipped(store.get(entry, b'ckpt'), position))
    with pytest.raises(CorruptCheckpointError, match='the header') as raised:
        store.get_chunked(entry, b'ckpt')
    assert KEY not in str(raised.value)


def test_tampering_straight_into_redis(redis_store, monkeypatch):
    monkeypatch.setenv(VARIABLE, KEY)
    store = RedisStore(redis_store._url, hmac_key_env=VARIABLE)
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', os.urandom(10_000), chunk_size=1000)
    third = chunk_keys(store, entry, b'ckpt')[3]
    client = store._redis()
    raw = client.hget(b'bsr:' + entry.encode(), third)
    client.hset(b'bsr:' + entry.encode(), third, flipped(raw, 500))
    with pytest.raises(CorruptCheckpointError) as raised:
        store.get_chunked(entry, b'ckpt')
    assert_unauthentic(raised, entry, 3)


def test_swapped_chunks_fail_authentication(store):
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', b'0123456789' * 3, chunk_size=10)
    chunks = chunk_keys(store, entry, b'ckpt')
    store.put(entry, chunks[1], store.get(entry, chunks[2]))
    with pytest.raises(CorruptCheckpointError) as raised:
        store.get_chunked(entry, b'ckpt')
    assert_unauthentic(raised, entry, 1)


def test_a_value_moved_to_another_key_fails_authentication(store):
    entry = fresh_entry(store)
    store.put_chunked(entry, b'old', b'a snapshot', chunk_size=4)
    store.put_chunked(entry, b'ckpt', b'x', chunk_size=4)
    for key in store.keys(entry, prefix=b'old'):  # header and chunks, renamed
        store.put(entry, b'ckpt' + key[len(b'old'):], store.get(entry, key))
    with pytest.raises(CorruptCheckpointError) as raised:
        store.get_chunked(entry, b'ckpt')
    assert_unauthentic(raised, entry, None)


# Keys that do not match ---------------------------------------------------------------------
def test_another_key_fails_authentication(store, monkeypatch):
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', b'secret state' * 10, chunk_size=16)
    monkeypatch.setenv(VARIABLE, OTHER_KEY)
    with pytest.raises(CorruptCheckpointError) as raised:
        store.get_chunked(entry, b'ckpt')
    assert_unauthentic(raised, entry, None)
    assert OTHER_KEY not in str(raised.value)
    assert f'set {VARIABLE} to that key' in str(raised.value)


def test_a_value_written_without_the_key_is_rejected(make_store):
    plain, keyed = make_store(None), make_store(VARIABLE)
    entry = fresh_entry(plain)
    plain.put_chunked(entry, b'ckpt', b'unauthenticated' * 10, chunk_size=16)
    with pytest.raises(CorruptCheckpointError) as raised:
        keyed.get_chunked(entry, b'ckpt')
    assert_unauthentic(raised, entry, None)
    assert 'carries no HMAC' in str(raised.value)


def test_a_store_without_the_key_rejects_a_keyed_value(make_store):
    plain, keyed = make_store(None), make_store(VARIABLE)
    entry = fresh_entry(keyed)
    keyed.put_chunked(entry, b'ckpt', b'authenticated' * 10, chunk_size=16)
    with pytest.raises(CorruptCheckpointError, match='the header is authenticated with an HMAC '
                       'key, but this store was given none') as raised:
        plain.get_chunked(entry, b'ckpt')
    assert 'hmac_key_env' in str(raised.value)
    # Rewriting it without the key replaces it, keyed chunks and all.
    plain.put_chunked(entry, b'ckpt', b'plain', chunk_size=16)
    assert plain.get_chunked(entry, b'ckpt') == b'plain'
    assert len(plain.keys(entry)) == 2


@pytest.mark.parametrize('value', [None, ''])
def test_an_unset_variable_is_named(store, monkeypatch, value):
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', b'v', chunk_size=16)
    if value is None:
        monkeypatch.delenv(VARIABLE)
    else:
        monkeypatch.setenv(VARIABLE, value)
    for operation in (lambda: store.get_chunked(entry, b'ckpt'),
                      lambda: store.put_chunked(entry, b'other', b'v')):
        with pytest.raises(HmacKeyMissingError, match=f'environment variable {VARIABLE}, '
                           'which is unset or empty') as raised:
            operation()
        assert raised.value.variable == VARIABLE
    # A value that is not there needs no key to be found missing.
    assert store.get_chunked(entry, b'missing') is None


def test_the_key_is_read_when_used(make_store, monkeypatch):
    monkeypatch.delenv(VARIABLE)
    store = make_store()  # no key needed to make the store
    monkeypatch.setenv(VARIABLE, KEY)
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', b'v')
    assert store.get_chunked(entry, b'ckpt') == b'v'


def test_the_key_never_shows_nor_pickles(store, kind):
    pickled = pickle.dumps(store)
    assert KEY.encode() not in pickled and VARIABLE.encode() in pickled
    assert KEY not in repr(store) and VARIABLE in repr(store)
    assert pickle.loads(pickled).hmac_key_env == VARIABLE
    error = HmacKeyMissingError(VARIABLE)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


@pytest.mark.parametrize('name', ['', 'not a name', '0starts-with-digit', KEY])
def test_hmac_key_env_is_a_variable_name(tmp_path, name):
    for make in (MemoryStore, lambda n: LocalDirectoryStore(str(tmp_path), n),
                 lambda n: store_from_url('redis://localhost:6379/0', hmac_key_env=n)):
        with pytest.raises(ValueError, match='NAME of an environment variable') as raised:
            make(name)
        assert name not in str(raised.value) or not name


# Format versions ---------------------------------------------------------------------------
def legacy_put_chunked(store, entry, key, value, chunk_size):
    """What the release before HMAC wrote: a version 1 header, CRC-32 everywhere."""
    generation = os.urandom(8)
    whole_crc, count = 0, 0
    for index, start in enumerate(range(0, len(value), chunk_size)):
        data = value[start:start + chunk_size]
        whole_crc = zlib.crc32(data, whole_crc)
        place = CHUNK_INFIX + generation + struct.pack('>I', index)
        store.put(entry, key + place, struct.pack('>I', zlib.crc32(data, zlib.crc32(place)))
                  + data)
        count += 1
    body = struct.pack('>4sBIQII8s', b'BSCK', 1, chunk_size, len(value), count, whole_crc,
                       generation)
    store.put(entry, key, body + struct.pack('>I', zlib.crc32(body)))


def test_version_1_values_still_read_without_a_key(make_store):
    plain, keyed = make_store(None), make_store(VARIABLE)
    entry = fresh_entry(plain)
    legacy_put_chunked(plain, entry, b'ckpt', b'from the old release' * 5, chunk_size=7)
    assert plain.get_chunked(entry, b'ckpt') == b'from the old release' * 5
    with pytest.raises(CorruptCheckpointError) as raised:
        keyed.get_chunked(entry, b'ckpt')
    assert_unauthentic(raised, entry, None)
    plain.put_chunked(entry, b'ckpt', b'new', chunk_size=7)  # replaces the legacy chunks
    assert len(plain.keys(entry)) == 2
