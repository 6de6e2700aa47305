"""Live partition state shared by every Python worker of a host: one LMDB environment.

Design section 8 ("a structure that makes the miss cheap on one host"). PySpark gives
no task-to-process affinity, so a partition's next task often runs in another Python
worker than its last. Every Python worker of a host opens the same LMDB environment
(one per run, in the executor's local directory) and keeps there, through
`HostCopies`, the copy of each partition state that a `VersionedStateCache` holds:
its revision, lineage and size, then its keys and values. A task that lands in
another worker of the host finds the state at its revision without reading the
checkpoint store, and reads the values of only the keys it uses (`HostStateView`,
which a `KeyedStateBackend` restores from lazily); the OS page cache is the shared
cache, so the state's pages count once in the host's memory whatever the number of
workers that read them.

It is a cache, not a checkpoint: the checkpoint store stays the durable copy and is
written first; the environment is written without fsync, and any doubt (another
revision than the one asked for, a missing or damaged record) sends the load to the
checkpoint store. LMDB serialises writers across processes (one write transaction
at a time per host), and a reader sees a consistent state whatever is written
meanwhile. LMDB was chosen over RocksDB (`rocksdict`) because RocksDB lets one
process at a time open a database for writing (docs/decisions.md).

Layout, in the environment's main database: per state (entry) an 8-byte id (a hash
of the entry's name); under the id alone the state's record (name, revision, parent,
chain, chain bytes, state bytes, key count, marshal); under id + b'\\0' + key each
value (a key too long for LMDB: under id + b'\\1' + its SHA-256, the key in the
value), after a flags byte. The tail of a long value, what a scan does not read, is
in the database 'tails' under the same key.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import ClassVar, TypeVar

import lmdb

from beam_streams_runner.errors import StreamsSparkRunnerError
from beam_streams_runner.state.versioned_state import CachedState, Revision

# The environment's first map size; it doubles when full. With a writable map (writes
# go straight to the mapped file, ten times faster than LMDB's copies for large values)
# the file is as large as the map, sparse: its blocks are only those written.
MAP_SIZE = 1 << 30
MAX_READERS = 1024
_ID_SIZE = 8
_HASHED = 1  # the byte after a state's id when the key is hashed
_LONG_KEY = 1  # flags of a stored value
_HAS_TAIL = 2
_LENGTH = struct.Struct('<I')
# Values longer than this keep what a scan does not need apart (`HostCopies`).
SPLIT_ABOVE = 4096
# The environment's home under the executor's local directory (which Spark deletes
# when the executor stops), or under the system's temporary directory.
HOME_NAME = 'beam-streams-live-state'


T = TypeVar('T')


class HostStateChanged(StreamsSparkRunnerError):
    """The host's copy of a state moved to another revision while a task read it."""


class _Unavailable(Exception):
    """This process cannot use the environment: it was forked from the process that
    opened it (LMDB allows neither using nor reopening it there)."""


def host_state_root() -> str:
    """Where this host's live states go: the executor's local directory when Spark
    names one (deleted when the executor stops), else the temporary directory."""
    local_dirs = os.environ.get('SPARK_LOCAL_DIRS', '')
    root = local_dirs.split(',')[0] if local_dirs else tempfile.gettempdir()
    return os.path.join(root, HOME_NAME)


class HostStateStore:
    """The LMDB environment of one run on this host, opened once per process (a process
    forked from the one that opened it cannot use it: `_Unavailable`). `at` gives the
    one of a path (LMDB refuses to open an environment twice in a process)."""

    _open: ClassVar[dict[str, HostStateStore]] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def at(cls, path: str) -> HostStateStore:
        with cls._registry_lock:
            host = cls._open.get(path)
            if host is None:
                host = cls._open[path] = cls(path)
            return host

    def __init__(self, path: str, map_size: int = MAP_SIZE) -> None:
        self.path = path
        self._map_size = map_size
        self._env: lmdb.Environment | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self.max_key = 0
        self.tails: object = None  # the database of the values' tails (`HostCopies`)

    def env(self) -> lmdb.Environment:
        if self._env is None or self._pid != os.getpid():
            with self._lock:
                if self._env is not None and self._pid != os.getpid():
                    raise _Unavailable(self.path)
                if self._env is None:
                    os.makedirs(self.path, exist_ok=True)
                    self._env = lmdb.open(self.path, map_size=self._map_size, subdir=True,
                                          sync=False, metasync=False, readahead=False,
                                          writemap=True, max_readers=MAX_READERS,
                                          max_dbs=1)
                    self._env.reader_check()  # slots of killed workers
                    self.tails = self._env.open_db(b'tails')
                    self._pid = os.getpid()
                    self.max_key = self._env.max_key_size()
        return self._env

    @contextlib.contextmanager
    def read(self, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        """A read transaction (`buffers`: values as buffers valid inside it)."""
        env = self.env()
        try:
            txn = env.begin(buffers=buffers)
        except lmdb.MapResizedError:  # another worker grew the map
            env.set_mapsize(0)
            txn = env.begin(buffers=buffers)
        with txn:
            yield txn

    def write(self, body: Callable[[lmdb.Transaction], T]) -> T:
        """`body(txn)` in a write transaction (values as buffers), committed; run again
        in a map twice as large if the map was full."""
        env = self.env()
        while True:
            try:
                with env.begin(write=True, buffers=True) as txn:
                    return body(txn)
            except lmdb.MapFullError:
                env.set_mapsize(2 * env.info()['map_size'])
            except lmdb.MapResizedError:
                env.set_mapsize(0)

    def close(self, remove: bool = False) -> None:
        """Closes this process's handle; `remove` also deletes the environment's files
        (a worker that still has them open keeps its mapping)."""
        with self._registry_lock:
            if self._open.get(self.path) is self:
                del self._open[self.path]
        with self._lock:
            if self._env is not None and self._pid == os.getpid():
                self._env.close()
            self._env = None  # a forked child leaves the parent's handle alone
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)

    def __repr__(self) -> str:
        return f'HostStateStore({self.path!r})'


def entry_id(entry: str) -> bytes:
    return hashlib.blake2b(entry.encode(), digest_size=_ID_SIZE).digest()


class HostCopies:
    """A `VersionedStateCache`'s copies of its states, kept in the host's environment
    (see `versioned_state.MemoryCopies` for the contract).

    `head_of(key, value)`: how many leading bytes of a value a scan reads (a keyed-state
    backend's per-key header); a value longer than `split_above` keeps the rest apart,
    so that a scan of a large state reads its heads only (LMDB faults in every page of
    a value it returns)."""

    def __init__(self, host: HostStateStore,
                 head_of: Callable[[bytes, bytes], int] | None = None,
                 split_above: int = SPLIT_ABOVE) -> None:
        self.host = host
        self._head_of = head_of
        self._split_above = split_above

    def get(self, entry: str) -> CachedState | None:
        try:
            with self.host.read() as txn:
                record = _record(txn, entry)
        except _Unavailable:
            return None
        if record is None:
            return None
        revision, parent, chain, chain_bytes, nbytes, count = record
        view = HostStateView(self.host, entry, revision, nbytes, count)
        return CachedState(revision, view, chain, parent, chain_bytes)

    def put(self, entry: str, cached: CachedState) -> None:
        """Replaces the copy of `entry` by `cached` (its state a full mapping)."""
        ident = entry_id(entry)

        def replace(txn: lmdb.Transaction) -> tuple[int, int]:
            _clear(txn, self.host.tails, ident)
            nbytes = count = 0
            for key, value in cached.state.items():
                self._put(txn, ident, key, value)
                nbytes += len(key) + len(value)
                count += 1
            txn.put(ident, _pack(entry, cached, nbytes, count))
            return nbytes, count
        try:
            nbytes, count = self.host.write(replace)
        except _Unavailable:
            return
        cached.state = HostStateView(self.host, entry, cached.revision, nbytes, count)

    def advance(self, entry: str, held: Revision, cached: CachedState,
                changes: Iterable[tuple[Mapping[bytes, bytes], Iterable[bytes]]]) -> bool:
        """Applies `changes` to the copy of `entry` if it is at revision `held`, and
        gives it `cached`'s revision and lineage (`cached.state` becomes its view)."""
        ident = entry_id(entry)

        def apply(txn: lmdb.Transaction) -> tuple[int, int] | None:
            record = _record(txn, entry)
            if record is None or record[0] != held:
                return None
            nbytes, count = record[4], record[5]
            for pairs, deleted in changes:
                for key, value in pairs.items():
                    old = self._remove(txn, ident, key)
                    self._put(txn, ident, key, value)
                    nbytes += len(value) - (old if old is not None else -len(key))
                    count += old is None
                for key in deleted:
                    old = self._remove(txn, ident, key)
                    if old is not None:
                        nbytes -= len(key) + old
                        count -= 1
            txn.put(ident, _pack(entry, cached, nbytes, count))
            return nbytes, count
        try:
            applied = self.host.write(apply)
        except _Unavailable:
            return False
        if applied is None:
            return False
        cached.state = HostStateView(self.host, entry, cached.revision, *applied)
        return True

    def drop(self, entry: str) -> None:
        """Forgets the copy: its record, values and tails."""
        with contextlib.suppress(_Unavailable):
            self.host.write(lambda txn: _clear(txn, self.host.tails, entry_id(entry)))

    def _put(self, txn: lmdb.Transaction, ident: bytes, key: bytes, value: bytes) -> None:
        head = len(value)
        if head > self._split_above and self._head_of is not None:
            head = min(head, self._head_of(key, value))
        stored = _stored_key(ident, key, self.host.max_key)
        parts = [bytes([(_LONG_KEY if stored[_ID_SIZE] == _HASHED else 0)
                        | (_HAS_TAIL if head < len(value) else 0)])]
        if stored[_ID_SIZE] == _HASHED:
            parts += [_LENGTH.pack(len(key)), key]
        if head < len(value):
            parts.append(_LENGTH.pack(len(value) - head))
            txn.put(stored, memoryview(value)[head:], db=self.host.tails)
        parts.append(memoryview(value)[:head])
        txn.put(stored, b''.join(parts))

    def _remove(self, txn: lmdb.Transaction, ident: bytes, key: bytes) -> int | None:
        """Deletes `key`'s value; returns its length (None if it had none)."""
        stored = _stored_key(ident, key, self.host.max_key)
        old = txn.get(stored)
        if old is None:
            return None
        _, head, tail = _parse(stored, old)
        txn.delete(stored)
        if tail:
            txn.delete(stored, db=self.host.tails)
        return len(head) + tail


class HostStateView(Mapping):
    """A state of the host's environment at one revision: every read checks that the
    copy is still at it (else `HostStateChanged`). `scan` yields every key with the
    head of its value (a buffer valid until the next item) and the length of the rest;
    `fetch` reads one whole value. `nbytes`: the bytes of its keys and values."""

    def __init__(self, host: HostStateStore, entry: str, revision: Revision, nbytes: int,
                 count: int) -> None:
        self.host = host
        self.entry = entry
        self.revision = revision
        self.nbytes = nbytes
        self._count = count
        self._ident = entry_id(entry)

    def moved_to(self, revision: Revision) -> None:
        """The copy was advanced by its reader's own commit: the values it did not
        change are the same at `revision`."""
        self.revision = revision

    def fetch(self, key: bytes) -> bytes | None:
        with self.host.read(buffers=True) as txn:
            self._check(txn)
            stored = _stored_key(self._ident, key, self.host.max_key)
            value = txn.get(stored)
            return None if value is None else self._whole(txn, stored, value)[1]

    def scan(self) -> Iterator[tuple[bytes, memoryview, int]]:
        with self.host.read(buffers=True) as txn:
            self._check(txn)
            for stored, value in self._records(txn):
                yield _parse(stored, value)

    def __getitem__(self, key: bytes) -> bytes:
        value = self.fetch(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[bytes]:
        return iter([key for key, _, _ in self.scan()])

    def __len__(self) -> int:
        return self._count

    def items(self) -> list[tuple[bytes, bytes]]:  # type: ignore[override]
        with self.host.read(buffers=True) as txn:
            self._check(txn)
            return [self._whole(txn, stored, value) for stored, value in self._records(txn)]

    def _records(self, txn: lmdb.Transaction) -> Iterator[tuple[bytes, memoryview]]:
        """The stored key and value of each of this state's values, in key order."""
        cursor = txn.cursor()
        if not cursor.set_range(self._ident + b'\0'):
            return
        for stored, value in cursor:
            stored = bytes(stored)
            if stored[:_ID_SIZE] != self._ident:
                return
            yield stored, value

    def _whole(self, txn: lmdb.Transaction, stored: bytes,
               value: memoryview) -> tuple[bytes, bytes]:
        """The key and the whole value (head and tail) of a stored value."""
        key, head, tail = _parse(stored, value)
        if not tail:
            return key, bytes(head)
        return key, b''.join((head, txn.get(stored, db=self.host.tails)))

    def _check(self, txn: lmdb.Transaction) -> None:
        record = _record(txn, self.entry)
        held = None if record is None else record[0]
        if held != self.revision:
            raise HostStateChanged(
                f'The live state of {self.entry!r} on this host moved from revision '
                f'{self.revision} to {held} while a task read it: another attempt of the '
                'same task ran on this host at the same time. This attempt fails; Spark '
                'runs the task again from the state its driver names.')

    def __repr__(self) -> str:
        return f'HostStateView({self.entry!r} at {self.revision}, {self._count} keys)'


def _record(txn: lmdb.Transaction, entry: str) -> tuple | None:
    """(revision, parent, chain, chain bytes, state bytes, key count) of `entry`, or None
    (also when the record is not `entry`'s: a damaged record is a miss)."""
    raw = txn.get(entry_id(entry))
    if raw is None:
        return None
    try:
        name, revision, parent, chain, chain_bytes, nbytes, count = marshal.loads(raw)
    except (EOFError, ValueError, TypeError):
        return None
    if name != entry:
        return None
    return (Revision(*revision), None if parent is None else Revision(*parent),
            [Revision(*r) for r in chain], chain_bytes, nbytes, count)


def _pack(entry: str, cached: CachedState, nbytes: int, count: int) -> bytes:
    parent = None if cached.parent is None else tuple(cached.parent)
    return marshal.dumps((entry, tuple(cached.revision), parent,
                          [tuple(r) for r in cached.chain], cached.chain_bytes, nbytes, count))


def _clear(txn: lmdb.Transaction, tails: object, ident: bytes) -> None:
    txn.delete(ident)
    cursor = txn.cursor()
    if cursor.set_range(ident + b'\0'):
        while cursor.key()[:_ID_SIZE] == ident:
            if cursor.value()[0] & _HAS_TAIL:
                txn.delete(cursor.key(), db=tails)
            if not cursor.delete():
                break


def _stored_key(ident: bytes, key: bytes, max_key: int) -> bytes:
    """Where `key`'s value goes: after the state's id, the key itself, or its hash when
    LMDB's keys cannot hold it."""
    if len(key) + _ID_SIZE + 1 <= max_key:
        return ident + b'\0' + key
    return ident + bytes([_HASHED]) + hashlib.sha256(key).digest()


def _parse(stored: bytes, value: memoryview | bytes) -> tuple[bytes, memoryview, int]:
    """(key, head of the value, length of its tail) of a stored value: a flags byte, the
    key (length-prefixed) if it is hashed in `stored`, the tail's length if it has one,
    then the head."""
    flags = value[0]
    offset = 1
    if flags & _LONG_KEY:
        (length,) = _LENGTH.unpack_from(value, offset)
        key = bytes(value[offset + 4:offset + 4 + length])
        offset += 4 + length
    else:
        key = stored[_ID_SIZE + 1:]
    tail = 0
    if flags & _HAS_TAIL:
        (tail,) = _LENGTH.unpack_from(value, offset)
        offset += 4
    return key, memoryview(value)[offset:], tail
