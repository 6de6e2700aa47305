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
value; a key too long for LMDB goes under id + b'\\1' + its SHA-256, its value
prefixed by the key.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import ClassVar

import lmdb

from beam_streams_runner.errors import StreamsSparkRunnerError
from beam_streams_runner.state.versioned_state import CachedState, Revision

# Address space only: the file grows with what it holds.
MAP_SIZE = 1 << 40
MAX_READERS = 1024
_ID_SIZE = 8
_SHORT = b'\0'
_LONG = b'\1'
_KEY_LENGTH = struct.Struct('<I')
# The environment's home under the executor's local directory (which Spark deletes
# when the executor stops), or under the system's temporary directory.
HOME_NAME = 'beam-streams-live-state'


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
    """The LMDB environment of one run on this host, opened once per process (and again
    in a forked child: an LMDB environment must not cross a fork). `at` gives the one
    of a path (LMDB refuses to open an environment twice in a process)."""

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

    def env(self) -> lmdb.Environment:
        if self._env is None or self._pid != os.getpid():
            with self._lock:
                if self._env is not None and self._pid != os.getpid():
                    raise _Unavailable(self.path)
                if self._env is None:
                    os.makedirs(self.path, exist_ok=True)
                    self._env = lmdb.open(self.path, map_size=self._map_size, subdir=True,
                                          sync=False, metasync=False, readahead=False,
                                          max_readers=MAX_READERS, max_dbs=0)
                    self._env.reader_check()  # slots of killed workers
                    self._pid = os.getpid()
                    self.max_key = self._env.max_key_size()
        return self._env

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
    (see `versioned_state.MemoryCopies` for the contract)."""

    def __init__(self, host: HostStateStore) -> None:
        self.host = host

    def get(self, entry: str) -> CachedState | None:
        env = self._env()
        if env is None:
            return None
        with env.begin() as txn:
            record = _record(txn, entry)
        if record is None:
            return None
        revision, parent, chain, chain_bytes, nbytes, count = record
        view = HostStateView(self.host, entry, revision, nbytes, count)
        return CachedState(revision, view, chain, parent, chain_bytes)

    def put(self, entry: str, cached: CachedState) -> None:
        """Replaces the copy of `entry` by `cached` (its state a full mapping)."""
        env = self._env()
        if env is None:
            return
        ident = entry_id(entry)
        with env.begin(write=True) as txn:
            _clear(txn, ident)
            nbytes = count = 0
            for key, value in cached.state.items():
                txn.put(*self._pair(ident, key, value))
                nbytes += len(key) + len(value)
                count += 1
            txn.put(ident, _pack(entry, cached, nbytes, count))
        cached.state = HostStateView(self.host, entry, cached.revision, nbytes, count)

    def advance(self, entry: str, held: Revision, cached: CachedState,
                changes: Iterable[tuple[Mapping[bytes, bytes], Iterable[bytes]]]) -> bool:
        """Applies `changes` to the copy of `entry` if it is at revision `held`, and
        gives it `cached`'s revision and lineage (`cached.state` becomes its view)."""
        env = self._env()
        if env is None:
            return False
        ident = entry_id(entry)
        with env.begin(write=True, buffers=True) as txn:
            record = _record(txn, entry)
            if record is None or record[0] != held:
                return False
            nbytes, count = record[4], record[5]
            for pairs, deleted in changes:
                for key, value in pairs.items():
                    old = self._remove(txn, ident, key)
                    txn.put(*self._pair(ident, key, value))
                    nbytes += len(value) - (old if old is not None else -len(key))
                    count += old is None
                for key in deleted:
                    old = self._remove(txn, ident, key)
                    if old is not None:
                        nbytes -= len(key) + old
                        count -= 1
            txn.put(ident, _pack(entry, cached, nbytes, count))
        cached.state = HostStateView(self.host, entry, cached.revision, nbytes, count)
        return True

    def drop(self, entry: str) -> None:
        """Forgets the copy (its record first: without it no load reads the values)."""
        env = self._env()
        if env is not None:
            with env.begin(write=True) as txn:
                _clear(txn, entry_id(entry))

    def _env(self) -> lmdb.Environment | None:
        """The environment, or None in a process forked from the one that opened it
        (a fault test's zombie task): there the host's copies are left alone."""
        try:
            return self.host.env()
        except _Unavailable:
            return None

    def _pair(self, ident: bytes, key: bytes, value: bytes) -> tuple[bytes, bytes]:
        if len(key) + _ID_SIZE + 1 <= self.host.max_key:
            return ident + _SHORT + key, value
        return (ident + _LONG + hashlib.sha256(key).digest(),
                _KEY_LENGTH.pack(len(key)) + key + value)

    def _remove(self, txn: lmdb.Transaction, ident: bytes, key: bytes) -> int | None:
        """Deletes `key`'s value; returns its length (None if it had none)."""
        stored, _ = self._pair(ident, key, b'')
        old = txn.pop(stored)
        if old is None:
            return None
        return len(old) if stored[_ID_SIZE:_ID_SIZE + 1] == _SHORT else len(old) - 4 - len(key)


class HostStateView(Mapping):
    """A state of the host's environment at one revision: every read checks that the
    copy is still at it (else `HostStateChanged`). `scan` yields every key with its
    value as a buffer valid until the next item (for indexing without copying);
    `fetch` reads one value. `nbytes`: the bytes of its keys and values."""

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
        with self._begin() as txn:
            return _value_of(txn, self._ident, key, self.host.max_key)

    def scan(self) -> Iterator[tuple[bytes, memoryview]]:
        with self.host.env().begin(buffers=True) as txn:
            self._check(txn)
            cursor = txn.cursor()
            if not cursor.set_range(self._ident + _SHORT):
                return
            for stored, value in cursor:
                stored = bytes(stored)
                if stored[:_ID_SIZE] != self._ident:
                    return
                if stored[_ID_SIZE:_ID_SIZE + 1] == _SHORT:
                    yield stored[_ID_SIZE + 1:], value
                else:
                    (length,) = _KEY_LENGTH.unpack_from(value)
                    yield bytes(value[4:4 + length]), value[4 + length:]

    def __getitem__(self, key: bytes) -> bytes:
        value = self.fetch(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[bytes]:
        return iter([key for key, _ in self.scan()])

    def __len__(self) -> int:
        return self._count

    def items(self) -> list[tuple[bytes, bytes]]:  # type: ignore[override]
        return [(key, bytes(value)) for key, value in self.scan()]

    def _begin(self) -> lmdb.Transaction:
        txn = self.host.env().begin()
        try:
            self._check(txn)
        except BaseException:
            txn.abort()
            raise
        return txn

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


def _clear(txn: lmdb.Transaction, ident: bytes) -> None:
    txn.delete(ident)
    cursor = txn.cursor()
    if cursor.set_range(ident + _SHORT):
        while cursor.key()[:_ID_SIZE] == ident:
            if not cursor.delete():
                break


def _value_of(txn: lmdb.Transaction, ident: bytes, key: bytes, max_key: int) -> bytes | None:
    if len(key) + _ID_SIZE + 1 <= max_key:
        return txn.get(ident + _SHORT + key)
    stored = txn.get(ident + _LONG + hashlib.sha256(key).digest())
    if stored is None:
        return None
    (length,) = _KEY_LENGTH.unpack_from(stored)
    return stored[4 + length:]
