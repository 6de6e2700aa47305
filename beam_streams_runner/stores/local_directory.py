"""The embedded default checkpoint store: a directory on the local disk.

Design section 8, "Checkpoint stores": the local-directory implementation of
`CheckpointStore`. An entry is a directory under the root, a pair a file in it.
Several PySpark Python worker processes on one host (and the driver) share the
directory, so every operation is safe with readers and writers in other
processes at the same time:

* a put writes a temporary file in the entry's directory and renames it over
  the key's file (`os.replace`, atomic on POSIX), so a reader opens either the
  old file or the new one, never a half-written value;
* deleting an entry first renames its directory out of the way (atomic), so no
  reader sees a half-deleted entry and a writer racing the delete fails cleanly.

Puts are not fsync'ed. The rename makes them atomic and visible to every process
at once, and they survive the death of any process (the data is in the OS page
cache); they may be lost only if the whole host loses power. An fsync per put
would cost milliseconds on every commit of every partition, and losing the host
loses its Spark executors and this directory anyway: surviving a host is the
job of the shared, multi-host store (Redis).

File names: a key's file is 'k' + the key in hex (any bytes work, case does not
matter, and the empty key has a name); an entry's directory is its name with
every character but [a-z0-9_-] escaped as %XX (readable, and safe on
case-insensitive file systems). Names starting with '.' are temporary files or
deleted entries, never keys or entries. File names are limited to 255 bytes, so
keys to 127 bytes.

`put_together` is the base class's loop: each file changes atomically, but
several files cannot change at once, so a reader may see some of the writes
and not others. Callers that need atomicity across keys keep what must change
together under one key.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from urllib.parse import unquote_to_bytes

from beam_streams_runner.stores.base import (
    CheckpointStore,
    EntryNotFoundError,
    check_entry_name,
    check_hmac_key_env,
)

_NAME_MAX = 255
MAX_KEY_LENGTH = (_NAME_MAX - 1) // 2
_UNESCAPED = frozenset(b'abcdefghijklmnopqrstuvwxyz0123456789_-')
_ESCAPES = [chr(b) if b in _UNESCAPED else f'%{b:02X}' for b in range(256)]


class LocalDirectoryStore(CheckpointStore):
    """Entries as directories under `root`, pairs as files; safe across processes."""

    def __init__(self, root: str, hmac_key_env: str | None = None) -> None:
        # Absolute, so that a copy unpickled in a worker with another cwd finds it.
        self.root = os.path.abspath(os.fspath(root))
        self.hmac_key_env = check_hmac_key_env(hmac_key_env)
        os.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        keyed = f', hmac_key_env={self.hmac_key_env!r}' if self.hmac_key_env else ''
        return f'LocalDirectoryStore({self.root!r}{keyed})'

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        # Shipped to Spark tasks as its root (and the key's variable name, never the
        # key): the data stays on disk.
        return (LocalDirectoryStore, (self.root, self.hmac_key_env))

    # Entries -----------------------------------------------------------------------
    def create_entry(self, name: str) -> None:
        os.makedirs(self._entry_path(name), exist_ok=True)

    def delete_entry(self, name: str) -> None:
        path = self._entry_path(name)
        if not os.path.isdir(path):
            return
        graveyard = tempfile.mkdtemp(prefix='.deleted-', dir=self.root)
        try:
            os.rename(path, os.path.join(graveyard, 'entry'))
        except FileNotFoundError:
            pass
        shutil.rmtree(graveyard, ignore_errors=True)

    def entry_exists(self, name: str) -> bool:
        return os.path.isdir(self._entry_path(name))

    def entries(self, prefix: str = '') -> list[str]:
        try:
            file_names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        names = []
        for file_name in file_names:
            if file_name.startswith('.'):
                continue
            name = unquote_to_bytes(file_name).decode('utf-8', errors='replace')
            # Skip directories this store did not name (they would not map back).
            if name.startswith(prefix) and _escape(name) == file_name:
                names.append(name)
        return sorted(names)

    # Pairs -------------------------------------------------------------------------
    def put(self, entry: str, key: bytes, value: bytes) -> None:
        directory = self._entry_path(entry)
        target = os.path.join(directory, _key_file(key))
        try:
            fd, temporary = tempfile.mkstemp(prefix='.tmp-', dir=directory)
        except FileNotFoundError:
            raise EntryNotFoundError(entry) from None
        try:
            with open(fd, 'wb') as out:
                out.write(value)
            os.replace(temporary, target)
        except FileNotFoundError:
            # The entry was deleted while we wrote.
            _remove_quietly(temporary)
            raise EntryNotFoundError(entry) from None
        except BaseException:
            _remove_quietly(temporary)
            raise

    def get(self, entry: str, key: bytes) -> bytes | None:
        try:
            with open(os.path.join(self._entry_path(entry), _key_file(key)), 'rb') as f:
                return f.read()
        except FileNotFoundError:
            return None

    def delete(self, entry: str, key: bytes) -> None:
        _remove_quietly(os.path.join(self._entry_path(entry), _key_file(key)))

    def exists(self, entry: str, key: bytes) -> bool:
        return os.path.isfile(os.path.join(self._entry_path(entry), _key_file(key)))

    def keys(self, entry: str, prefix: bytes = b'') -> list[bytes]:
        try:
            file_names = os.listdir(self._entry_path(entry))
        except FileNotFoundError:
            return []
        start = 'k' + prefix.hex()
        found = []
        for file_name in file_names:
            if file_name.startswith(start):
                try:
                    found.append(bytes.fromhex(file_name[1:]))
                except ValueError:
                    continue  # not a key's file
        return sorted(found)

    # Paths -------------------------------------------------------------------------
    def _entry_path(self, name: str) -> str:
        check_entry_name(name)
        escaped = _escape(name)
        if len(escaped) > _NAME_MAX:
            raise ValueError(f'Entry name {name!r} is too long for a LocalDirectoryStore '
                             f'(escaped to {len(escaped)} characters, at most {_NAME_MAX})')
        return os.path.join(self.root, escaped)


def _escape(name: str) -> str:
    return ''.join([_ESCAPES[b] for b in name.encode('utf-8')])


def _key_file(key: bytes) -> str:
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f'Key {key[:16]!r}... has {len(key)} bytes; a LocalDirectoryStore '
                         f'holds keys of at most {MAX_KEY_LENGTH} bytes')
    return 'k' + key.hex()


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
