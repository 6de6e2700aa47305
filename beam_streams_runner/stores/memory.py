"""An in-memory checkpoint store, for unit tests only.

Design section 8, "Checkpoint stores": the in-memory implementation of
`CheckpointStore`. Its entries live in this process's dicts, so nothing survives
the process and nothing is shared with other processes: a copy shipped to a
Spark task (it pickles by value) is that task's private copy. Use it to test
single-process logic; pipelines need `LocalDirectoryStore` or Redis.
`put_together` applies its writes under the store's lock, so they are atomic.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from beam_streams_runner.stores.base import (
    CheckpointStore,
    EntryNotFoundError,
    check_entry_name,
    check_hmac_key_env,
)


class MemoryStore(CheckpointStore):
    """Entries as dicts of bytes to bytes, guarded by one lock (tests may use threads)."""

    def __init__(self, hmac_key_env: str | None = None) -> None:
        self._entries: dict[str, dict[bytes, bytes]] = {}
        self._lock = threading.Lock()
        self.hmac_key_env = check_hmac_key_env(hmac_key_env)

    def __repr__(self) -> str:
        keyed = f', hmac_key_env={self.hmac_key_env!r}' if self.hmac_key_env else ''
        return f'MemoryStore({len(self._entries)} entries{keyed})'

    # Pickled by value: the lock cannot be pickled and is recreated.
    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {'entries': {name: dict(pairs) for name, pairs in self._entries.items()},
                    'hmac_key_env': self.hmac_key_env}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._entries = state['entries']
        self.hmac_key_env = state.get('hmac_key_env')
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

    def put_together(self, entry: str, items: Mapping[bytes, bytes | None]) -> None:
        with self._lock:
            pairs = self._entries.get(entry)
            if pairs is None:
                check_entry_name(entry)
                if any(value is not None for value in items.values()):
                    raise EntryNotFoundError(entry)
                return
            for key, value in items.items():
                if value is None:
                    pairs.pop(key, None)
                else:
                    pairs[bytes(key)] = bytes(value)
