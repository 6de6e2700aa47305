"""Contract tests of the checkpoint stores (no Spark).

The same tests run over `MemoryStore`, over `LocalDirectoryStore` in a
temporary directory and over `RedisStore` on a real `redis-server` (the
`redis_store` fixture). Chunked values are property-tested: any bytes with any
chunk size round-trip, and damaging or removing any one chunk, or damaging the
header, raises `CorruptCheckpointError`. Two processes share one
`LocalDirectoryStore` (or one Redis) and check that no read ever sees a partial
value.
"""

from __future__ import annotations

import multiprocessing
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
    EntryNotFoundError,
    LocalDirectoryStore,
    MemoryStore,
    RedisStore,
    store_from_url,
)
from beam_streams_runner.stores.base import CHUNK_INFIX

# Each hypothesis example uses a fresh entry, so sharing the store fixture is safe.
PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(params=['memory', 'local_directory', 'redis'])
def store(request, tmp_path) -> CheckpointStore:
    if request.param == 'memory':
        return MemoryStore()
    if request.param == 'redis':
        return request.getfixturevalue('redis_store')
    return LocalDirectoryStore(str(tmp_path / 'checkpoints'))


def fresh_entry(store: CheckpointStore) -> str:
    name = f'job/op-{uuid.uuid4().hex[:8]}'
    store.create_entry(name)
    return name


# Entries ---------------------------------------------------------------------------------
def test_entry_lifecycle(store):
    assert not store.entry_exists('job/a')
    store.create_entry('job/a')
    store.create_entry('job/a')  # idempotent
    assert store.entry_exists('job/a')
    store.put('job/a', b'k', b'v')
    store.delete_entry('job/a')
    store.delete_entry('job/a')  # deleting a missing entry does nothing
    assert not store.entry_exists('job/a')
    assert store.get('job/a', b'k') is None
    store.create_entry('job/a')
    assert store.keys('job/a') == []  # re-created empty


def test_entry_names_round_trip_and_filter_by_prefix(store):
    names = ['job-1/Op.A', 'job-1/op b', 'job-1/%41', 'job-2/ümlaut', '.hidden', '..']
    for name in names:
        store.create_entry(name)
    assert store.entries() == sorted(names)
    assert store.entries('job-1/') == sorted(names[:3])
    assert store.entries('nothing') == []
    for name in names:  # distinct names are distinct entries (case, escapes)
        store.put(name, b'name', name.encode())
    assert {store.get(name, b'name') for name in names} == {n.encode() for n in names}


def test_empty_entry_name_is_rejected(store):
    with pytest.raises(ValueError, match='non-empty'):
        store.create_entry('')


# Pairs -----------------------------------------------------------------------------------
KEYS = [b'', b'\x00', b'\xff\xfe', b'a', b'ab', b'abc', b'b', bytes(range(40))]


def test_put_get_delete_exists(store):
    entry = fresh_entry(store)
    for i, key in enumerate(KEYS):
        store.put(entry, key, b'value %d' % i)
    store.put(entry, b'a', b'')  # overwrite, with an empty value
    assert store.get(entry, b'a') == b''
    assert store.get(entry, b'\xff\xfe') == b'value 2'
    assert store.exists(entry, b'') and not store.exists(entry, b'zz')
    assert store.get(entry, b'zz') is None
    store.delete(entry, b'ab')
    store.delete(entry, b'ab')  # deleting a missing key does nothing
    assert not store.exists(entry, b'ab')
    assert store.keys(entry) == sorted(set(KEYS) - {b'ab'})
    assert store.keys(entry, prefix=b'a') == [b'a', b'abc']
    assert store.keys(entry, prefix=b'\xff') == [b'\xff\xfe']


def test_missing_entry_reads_empty_and_rejects_writes(store):
    assert store.get('nope', b'k') is None
    assert not store.exists('nope', b'k')
    assert store.keys('nope') == []
    store.delete('nope', b'k')
    with pytest.raises(EntryNotFoundError, match="'nope' does not exist"):
        store.put('nope', b'k', b'v')


def test_batched_operations(store):
    entry = fresh_entry(store)
    store.put_many(entry, {key: key * 2 for key in KEYS})
    assert store.get_many(entry, [b'a', b'b', b'missing']) == {
        b'a': b'aa', b'b': b'bb', b'missing': None}
    store.delete_many(entry, [b'a', b'b', b'missing'])
    assert store.keys(entry) == sorted(set(KEYS) - {b'a', b'b'})
    store.put_many(entry, {})
    store.delete_many(entry, [])
    assert store.get_many(entry, []) == {}


def test_put_together_writes_and_deletes(store):
    entry = fresh_entry(store)
    store.put_many(entry, {b'a': b'1', b'b': b'2', b'c': b'3'})
    store.put_together(entry, {b'a': b'10', b'b': None, b'd': b'', b'gone': None})
    assert store.get_many(entry, [b'a', b'b', b'c', b'd']) == {
        b'a': b'10', b'b': None, b'c': b'3', b'd': b''}
    store.put_together(entry, {})
    assert store.keys(entry) == [b'a', b'c', b'd']


def test_put_together_into_a_missing_entry(store):
    with pytest.raises(EntryNotFoundError, match="'nope' does not exist"):
        store.put_together('nope', {b'a': None, b'b': b'v'})
    assert not store.entry_exists('nope') and store.keys('nope') == []
    store.put_together('nope', {b'a': None})  # deleting in a missing entry does nothing
    assert not store.entry_exists('nope')


def test_pickle_round_trip(store):
    entry = fresh_entry(store)
    store.put(entry, b'k', b'v')
    copy = pickle.loads(pickle.dumps(store))
    assert copy.get(entry, b'k') == b'v'
    copy.put(entry, b'k2', b'v2')
    if isinstance(store, MemoryStore):  # a private copy (unit tests only)
        assert store.get(entry, b'k2') is None
    else:  # the same directory, or the same Redis database
        assert store.get(entry, b'k2') == b'v2'
    if isinstance(store, LocalDirectoryStore):
        assert store.__reduce__() == (LocalDirectoryStore, (store.root, None))
    assert repr(copy) == repr(store) or isinstance(store, MemoryStore)


# Local directory specifics -----------------------------------------------------------------
def test_local_directory_layout_and_limits(tmp_path):
    store = LocalDirectoryStore(str(tmp_path / 'relative-is-made-absolute'))
    store.create_entry('Job/Op')
    store.put('Job/Op', b'\x01\xab', b'v')
    directory = tmp_path / 'relative-is-made-absolute' / '%4Aob%2F%4Fp'
    assert sorted(os.listdir(directory)) == ['k01ab']  # no temporary file left behind
    (directory / '.tmp-crashed-writer').write_bytes(b'half')  # ignored
    (directory / 'not-a-key').write_bytes(b'x')
    assert store.keys('Job/Op') == [b'\x01\xab']
    (tmp_path / 'relative-is-made-absolute' / 'Foreign.dir').mkdir()
    assert store.entries() == ['Job/Op']
    with pytest.raises(ValueError, match='at most 127 bytes'):
        store.put('Job/Op', b'x' * 128, b'v')
    with pytest.raises(ValueError, match='too long'):
        store.create_entry('e' * 300)


# Chunked values ----------------------------------------------------------------------------
@st.composite
def values_and_chunk_sizes(draw, min_size=0):
    value = draw(st.binary(min_size=min_size, max_size=2000))
    # At most ~40 chunks, so that the directory store stays fast.
    chunk_size = draw(st.integers(max(1, len(value) // 40), max(1, len(value) + 3)))
    return value, chunk_size


def chunk_keys(store, entry, key):
    # Sorted keys put chunk i at position i (the index is big-endian at the end).
    return [k for k in store.keys(entry, prefix=key + CHUNK_INFIX)]


@PROPERTY
@given(case=values_and_chunk_sizes(), key=st.binary(max_size=20))
def test_chunked_values_round_trip(store, case, key):
    value, chunk_size = case
    entry = fresh_entry(store)
    store.put_chunked(entry, key, value, chunk_size=chunk_size)
    assert store.get_chunked(entry, key) == value
    assert len(chunk_keys(store, entry, key)) == -(-len(value) // chunk_size)
    store.delete_chunked(entry, key)
    assert store.get_chunked(entry, key) is None
    assert store.keys(entry) == []


@PROPERTY
@given(first=values_and_chunk_sizes(), second=values_and_chunk_sizes())
def test_rewriting_a_chunked_value_replaces_it_completely(store, first, second):
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', first[0], chunk_size=first[1])
    store.put_chunked(entry, b'ckpt', second[0], chunk_size=second[1])
    assert store.get_chunked(entry, b'ckpt') == second[0]
    # Only the header and the new chunks remain, however the value shrank.
    assert len(store.keys(entry)) == 1 + -(-len(second[0]) // second[1])


DAMAGE = ['flip', 'truncate', 'extend', 'remove', 'swap']


def damage(store, entry, key, how, pick):
    """Damage one stored value (`key`) in place; `pick` chooses a byte or a partner."""
    raw = store.get(entry, key)
    if how == 'remove':
        store.delete(entry, key)
    elif how == 'flip':
        position = pick % len(raw)
        store.put(entry, key, raw[:position] + bytes([raw[position] ^ 0x5a]) +
                  raw[position + 1:])
    elif how == 'truncate':
        store.put(entry, key, raw[:pick % len(raw)])
    elif how == 'extend':
        store.put(entry, key, raw + b'\x00')


@PROPERTY
@given(case=values_and_chunk_sizes(min_size=1), how=st.sampled_from(DAMAGE),
       index=st.integers(0, 10_000), pick=st.integers(0, 10_000))
def test_damaging_any_chunk_is_detected(store, case, how, index, pick):
    value, chunk_size = case
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', value, chunk_size=chunk_size)
    chunks = chunk_keys(store, entry, b'ckpt')
    index %= len(chunks)
    if how == 'swap':  # the right bytes under the wrong chunk key
        if len(chunks) < 2:
            return
        other = (index + 1 + pick % (len(chunks) - 1)) % len(chunks)
        store.put(entry, chunks[index], store.get(entry, chunks[other]))
    else:
        damage(store, entry, chunks[index], how, pick)
    with pytest.raises(CorruptCheckpointError) as raised:
        store.get_chunked(entry, b'ckpt')
    assert raised.value.chunk_index == index
    assert raised.value.entry == entry and raised.value.key == b'ckpt'


@PROPERTY
@given(case=values_and_chunk_sizes(), how=st.sampled_from(['flip', 'truncate', 'extend']),
       pick=st.integers(0, 10_000))
def test_damaging_the_header_is_detected(store, case, how, pick):
    value, chunk_size = case
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', value, chunk_size=chunk_size)
    damage(store, entry, b'ckpt', how, pick)
    with pytest.raises(CorruptCheckpointError, match='the header') as raised:
        store.get_chunked(entry, b'ckpt')
    assert raised.value.chunk_index is None


def test_a_removed_header_reads_as_no_value(store):
    # The header is the commit point: without it the value was never complete.
    # (The versioned state reports a missing delta or snapshot as a gap.)
    entry = fresh_entry(store)
    store.put_chunked(entry, b'ckpt', b'x' * 100, chunk_size=10)
    store.delete(entry, b'ckpt')
    assert store.get_chunked(entry, b'ckpt') is None
    store.delete_chunked(entry, b'ckpt')  # sweeps the orphaned chunks too
    assert store.keys(entry) == []


def test_corruption_message_names_entry_key_chunk_and_remedy(store):
    entry = fresh_entry(store)
    store.put_chunked(entry, b'snap', b'abcdef' * 10, chunk_size=7)
    store.delete(entry, chunk_keys(store, entry, b'snap')[3])
    with pytest.raises(CorruptCheckpointError) as raised:
        store.get_chunked(entry, b'snap')
    message = str(raised.value)
    assert isinstance(raised.value, RuntimeError)
    for part in (repr(entry), "b'snap'", 'chunk 3 of 9 is missing', 'start the pipeline from '
                 'scratch', 'checkpoint directory'):
        assert part in message


def test_chunk_size_must_be_positive(store):
    with pytest.raises(ValueError, match='chunk_size'):
        store.put_chunked(fresh_entry(store), b'k', b'v', chunk_size=0)


# Two processes over one directory ----------------------------------------------------------
def payload(writer: int, round_: int) -> bytes:
    """A self-checking value whose size swings between 0 and ~60 kB."""
    body = bytes([writer, round_ % 256]) * ((round_ * 7919) % 30_000)
    head = struct.pack('>II', writer, round_)
    return head + body + struct.pack('>I', zlib.crc32(head + body))


def check_payload(value: bytes) -> None:
    head_body, crc = value[:-4], struct.unpack('>I', value[-4:])[0]
    if zlib.crc32(head_body) != crc:
        raise AssertionError(f'partial or mixed value of {len(value)} bytes')


def worker(pickled_store: bytes, entry: str, me: int, rounds: int, errors) -> None:
    store = pickle.loads(pickled_store)  # as Spark ships a store to its workers
    other = 1 - me
    try:
        for round_ in range(rounds):
            value = payload(me, round_)
            store.put(entry, b'own-%d' % me, value)
            store.put(entry, b'shared', value)  # both processes overwrite this key
            store.put_chunked(entry, b'chunked-shared', value, chunk_size=4096)
            for key in (b'own-%d' % other, b'shared'):
                seen = store.get(entry, key)
                if seen is not None:
                    check_payload(seen)
            seen = store.get_chunked(entry, b'chunked-shared')
            if seen is not None:
                check_payload(seen)
    except Exception as error:  # noqa: BLE001 - reported to the parent process
        errors.put(f'process {me}: {type(error).__name__}: {error}')


@pytest.mark.parametrize('kind', ['local_directory', 'redis'])
def test_two_processes_share_one_store(request, tmp_path, kind):
    root = str(tmp_path / 'shared')
    if kind == 'redis':
        store = request.getfixturevalue('redis_store')
    else:
        store = LocalDirectoryStore(root)
    store.create_entry('job/op')
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context('fork' if 'fork' in methods else 'spawn')
    errors = context.Queue()
    processes = [context.Process(target=worker,
                                 args=(pickle.dumps(store), 'job/op', me, 150, errors))
                 for me in (0, 1)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0, 0]
    reported = []
    while not errors.empty():
        reported.append(errors.get())
    assert reported == []
    for key in (b'own-0', b'own-1', b'shared'):
        check_payload(store.get('job/op', key))
    check_payload(store.get_chunked('job/op', b'chunked-shared'))
    # Racing rewrites may orphan a losing writer's chunks; delete_chunked sweeps them.
    store.delete_chunked('job/op', b'chunked-shared')
    assert chunk_keys(store, 'job/op', b'chunked-shared') == []
    if kind == 'local_directory':
        assert not [name for name in os.listdir(os.path.join(root, 'job%2Fop'))
                    if name.startswith('.')]


# store_from_url ----------------------------------------------------------------------------
def test_store_from_url(tmp_path):
    assert isinstance(store_from_url('memory://'), MemoryStore)
    by_url = store_from_url(f'file://{tmp_path}/a%20b')
    assert isinstance(by_url, LocalDirectoryStore) and by_url.root == f'{tmp_path}/a b'
    by_path = store_from_url(str(tmp_path / 'plain'))
    assert isinstance(by_path, LocalDirectoryStore) and by_path.root == str(tmp_path / 'plain')
    by_redis = store_from_url('REDIS://:pw@localhost:6379/1', hmac_key_env='BSR_KEY')
    assert isinstance(by_redis, RedisStore) and by_redis.hmac_key_env == 'BSR_KEY'
    assert repr(by_redis) == "RedisStore('redis://:***@localhost:6379/1', hmac_key_env='BSR_KEY')"
    assert isinstance(store_from_url('rediss://localhost:6380/0'), RedisStore)
    for kind in ('memory://', str(tmp_path / 'keyed'), f'file://{tmp_path}/keyed'):
        assert store_from_url(kind, hmac_key_env='BSR_KEY').hmac_key_env == 'BSR_KEY'
    with pytest.raises(ValueError, match=r"redis://:\*\*\*@h/x: the path names the database"):
        store_from_url('redis://:secret@h/x')
    with pytest.raises(ValueError, match="accepted forms: 'memory://'"):
        store_from_url('s3://bucket/checkpoints')
    with pytest.raises(ValueError, match='local absolute path'):
        store_from_url('file://otherhost/checkpoints')
    with pytest.raises(ValueError):
        store_from_url('')
