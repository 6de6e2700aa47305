"""Checkpoint stores (design section 8, "Checkpoint stores"), chosen by URL.

`store_from_url` turns the `--checkpoint_store` option into a store:

* `memory://` -> `MemoryStore` (this process only; unit tests);
* `file:///absolute/path` or a plain path -> `LocalDirectoryStore` (the
  embedded default, shared by the processes of one host);
* `redis://...` -> not in this release (Redis stores come with consistent
  regions).

Every store pickles (stores are shipped to Spark tasks).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlparse

from beam_streams_runner.errors import UnsupportedFeatureError
from beam_streams_runner.stores.base import (
    CheckpointStore,
    CorruptCheckpointError,
    EntryNotFoundError,
)
from beam_streams_runner.stores.local_directory import LocalDirectoryStore
from beam_streams_runner.stores.memory import MemoryStore

__all__ = [
    'CheckpointStore',
    'CorruptCheckpointError',
    'EntryNotFoundError',
    'LocalDirectoryStore',
    'MemoryStore',
    'store_from_url',
]

_SCHEME = re.compile(r'^([A-Za-z][A-Za-z0-9+.-]*)://')
_ACCEPTED = ("'memory://', 'file:///absolute/path', a plain directory path, "
             "or (in a later release) 'redis://host:port/db'")


def store_from_url(url: str) -> CheckpointStore:
    """The checkpoint store a `--checkpoint_store` URL names."""
    if not url:
        raise ValueError(f'Empty checkpoint store URL; accepted forms: {_ACCEPTED}')
    match = _SCHEME.match(url)
    if match is None:  # no scheme: a path
        return LocalDirectoryStore(url)
    scheme = match.group(1).lower()
    if scheme == 'memory':
        if url[match.end():]:
            raise ValueError(f"Checkpoint store URL {url!r}: a memory store takes no "
                             f"name or path, use 'memory://'")
        return MemoryStore()
    if scheme == 'file':
        parsed = urlparse(url)
        if parsed.netloc not in ('', 'localhost') or not parsed.path:
            raise ValueError(f"Checkpoint store URL {url!r}: a file URL names a local "
                             f"absolute path, as in 'file:///tmp/checkpoints'")
        return LocalDirectoryStore(unquote(parsed.path))
    if scheme in ('redis', 'rediss', 'unix'):
        raise UnsupportedFeatureError(
            f'Checkpoint store {url!r}: Redis stores come with consistent regions (not in '
            f"this release); use a local directory ('file:///path' or a plain path)")
    raise ValueError(f'Unknown checkpoint store URL {url!r}; accepted forms: {_ACCEPTED}')
