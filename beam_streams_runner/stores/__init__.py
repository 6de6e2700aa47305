"""Checkpoint stores (design section 8, "Checkpoint stores"), chosen by URL.

`store_from_url` turns the `--checkpoint_store` option into a store:

* `memory://` -> `MemoryStore` (this process only; unit tests);
* `file:///absolute/path` or a plain path -> `LocalDirectoryStore` (the
  embedded default, shared by the processes of one host);
* `redis://[:password@]host:port/db`, `rediss://...` (TLS) or
  `unix:///path/to/socket?db=0` -> `RedisStore` (shared by every host).

`hmac_key_env`, the NAME of an environment variable holding a secret key,
makes any kind of store authenticate its chunked values with HMAC-SHA256 (see
`base`); the key itself is read from that variable by each process that reads
or writes checkpoints, and never shown or pickled. URLs are shown through
`redacted_url`, which masks passwords.

Every store pickles (stores are shipped to Spark tasks).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlparse

from beam_streams_runner.errors import CheckpointStoreUnavailableError
from beam_streams_runner.stores.base import (
    CheckpointStore,
    CorruptCheckpointError,
    EntryNotFoundError,
    HmacKeyMissingError,
)
from beam_streams_runner.stores.local_directory import LocalDirectoryStore
from beam_streams_runner.stores.memory import MemoryStore
from beam_streams_runner.stores.redis_store import RedisStore
from beam_streams_runner.stores.urls import redacted_url

__all__ = [
    'CheckpointStore',
    'CheckpointStoreUnavailableError',
    'CorruptCheckpointError',
    'EntryNotFoundError',
    'HmacKeyMissingError',
    'LocalDirectoryStore',
    'MemoryStore',
    'RedisStore',
    'redacted_url',
    'store_from_url',
]

_SCHEME = re.compile(r'^([A-Za-z][A-Za-z0-9+.-]*)://')
_ACCEPTED = ("'memory://', 'file:///absolute/path', a plain directory path, "
             "'redis://[:password@]host:port/db' or 'rediss://...' (TLS)")


def store_from_url(url: str, hmac_key_env: str | None = None) -> CheckpointStore:
    """The checkpoint store a `--checkpoint_store` URL names.

    `hmac_key_env`: the name of the environment variable holding the key that
    authenticates chunked values (None: CRC-32 checksums only).
    """
    if not url:
        raise ValueError(f'Empty checkpoint store URL; accepted forms: {_ACCEPTED}')
    match = _SCHEME.match(url)
    if match is None:  # no scheme: a path
        return LocalDirectoryStore(url, hmac_key_env=hmac_key_env)
    scheme = match.group(1).lower()
    shown = redacted_url(url)
    if scheme == 'memory':
        if url[match.end():]:
            raise ValueError(f"Checkpoint store URL {shown!r}: a memory store takes no "
                             f"name or path, use 'memory://'")
        return MemoryStore(hmac_key_env=hmac_key_env)
    if scheme == 'file':
        parsed = urlparse(url)
        if parsed.netloc not in ('', 'localhost') or not parsed.path:
            raise ValueError(f"Checkpoint store URL {shown!r}: a file URL names a local "
                             f"absolute path, as in 'file:///tmp/checkpoints'")
        return LocalDirectoryStore(unquote(parsed.path), hmac_key_env=hmac_key_env)
    if scheme in ('redis', 'rediss', 'unix'):
        # redis-py wants the scheme in lower case.
        return RedisStore(scheme + url[len(scheme):], hmac_key_env=hmac_key_env)
    raise ValueError(f'Unknown checkpoint store URL {shown!r}; accepted forms: {_ACCEPTED}')
