"""An in-memory checkpoint store, for unit tests only.

Design section 8, "Checkpoint stores": the in-memory implementation of
`CheckpointStore`. Its entries live in this process's dicts, so nothing survives
the process and nothing is shared with other processes: a copy shipped to a
Spark task (it pickles by value) is that task's private copy. Use it to test
single-process logic; pipelines need `LocalDirectoryStore` or Redis.
"""

from __future__ import annotations

import threading
from typing import Any

from beam_streams_runner.stores.base import CheckpointStore, EntryNotFoundError, check_entry_name


class MemoryStore(CheckpointStore):
    """Entries as dicts of bytes to bytes, guarded by one lock (tests may use threads)."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[bytes, bytes]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f'MemoryStore({len(self._entries)} entries)'

    # Pickled by value: the lock cannot be pickled and is recreated.
    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {'entries': {name: dict(pairs) for name, pairs in self._entries.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._entries = state['entries']
        self._lock = threading.Lock()

    # Entries -----------------------------------------------------------------------
    def create_entry(self, name: str) -> None:
        check_entry_name(name)
        with self._lock:
            self._entries.setdefault(name, {})

    def delete_entry(self, name: str) -> None:
        check_entry_name(name)
        with self._lock:
            self._entries.pop(name, None)

    def entry_exists(self, name: str) -> bool:
        check_entry_name(name)
        return name in self._entries

    def entries(self, prefix: str = '') -> list[str]:
        with self._lock:
            return sorted(name for name in self._entries if name.startswith(prefix))

    # Pairs -------------------------------------------------------------------------
    def put(self, entry: str, key: bytes, value: bytes) -> None:
        with self._lock:
            pairs = self._entries.get(entry)
            if pairs is None:
                check_entry_name(entry)
                raise EntryNotFoundError(entry)
            pairs[bytes(key)] = bytes(value)

    def get(self, entry: str, key: bytes) -> bytes | None:
        return self._entries.get(entry, {}).get(key)

    def delete(self, entry: str, key: bytes) -> None:
        with self._lock:
            self._entries.get(entry, {}).pop(key, None)

    def exists(self, entry: str, key: bytes) -> bool:
        return key in self._entries.get(entry, {})

    def keys(self, entry: str, prefix: bytes = b'') -> list[bytes]:
        with self._lock:
            return sorted(key for key in self._entries.get(entry, {}) if key.startswith(prefix))
