"""The checkpoint store interface: named entries of byte keys to byte values.

Design section 8, "Checkpoint stores" (after Jacques-Silva et al., VLDB 2016,
the IBM Streams checkpoint data store): a store holds named Data Store Entries
(one per job and operator, or per operator partition); an entry holds byte keys
mapped to byte values. `CheckpointStore` is that abstract two-level model. The
batched pair operations exist so that a networked store (Redis) can pipeline
them; here they are loops over the single operations. `put_together` writes
and deletes several keys of one entry so that they become visible at once where
the store can do it (memory, Redis); the local directory store cannot make
several files change atomically, so there it is a loop, and callers that need
atomicity across keys keep what must change together under one key.

Large values (snapshots, deltas) are written with `put_chunked`, which splits
them into fixed-size chunks, each carrying a checksum, under keys derived from
the value's key; `get_chunked` reassembles and checks them and raises
`CorruptCheckpointError` on a missing or damaged chunk. The layout of chunks
and header is in `chunk_format`.

A rewrite writes a new generation's chunks, swaps the header, then deletes the
old generation's chunks, so a concurrent reader sees either the old value or the
new one (it re-reads the header when a chunk vanished under it) and a value that
shrinks leaves no stale chunks behind. Two processes rewriting one key at once
each leave a complete value (the last header wins), but the loser's chunks may
stay behind as orphans until `delete_chunked`, which sweeps every chunk under
the key. Deleting a key while another process writes it is a race the caller
must avoid (the writer's new chunks may be swept).

Checksums are CRC-32 (`zlib.crc32`) by default: the threat is accidental damage
(a torn or truncated file, a lost key, a bit flip), and CRC-32 detects those at
well over a GB/s from the standard library, where a cryptographic hash would
cost several times more per byte of every checkpoint. Where the store itself is
not trusted (a shared Redis), give the store `hmac_key_env`, the NAME of an
environment variable holding a secret key: every chunk and header then carries
an HMAC-SHA256 under that key, and reading one that fails it (written without
the key, with another key, or tampered with) raises `CorruptCheckpointError`.
A store with a key rejects values written without one, and a store without a
key rejects values written with one. The key is read from the environment of
whichever process writes or reads a chunked value, when it does; only the
variable's name is pickled, shown in reprs or named in errors. Plain `put`/
`get` pairs are not authenticated.
"""

from __future__ import annotations

import abc
import os
import zlib
from collections.abc import Iterable, Mapping

from beam_streams_runner.errors import StreamsSparkRunnerError
from beam_streams_runner.stores.chunk_format import (
    CHUNK_INFIX,
    GENERATION_BYTES,
    ChunkCodec,
    CorruptCheckpointError,
    Header,
    HmacKeyMissingError,
    check_hmac_key_env,
    chunk_key,
    hmac_key,
)

__all__ = [
    'CHUNK_INFIX',
    'DEFAULT_CHUNK_SIZE',
    'CheckpointStore',
    'CorruptCheckpointError',
    'EntryNotFoundError',
    'HmacKeyMissingError',
    'check_entry_name',
    'check_hmac_key_env',
]

DEFAULT_CHUNK_SIZE = 1 << 20

# A reader whose chunks vanish under a concurrent rewrite starts over this often.
_READ_ATTEMPTS = 5


class EntryNotFoundError(StreamsSparkRunnerError, LookupError):
    """A pair was written into an entry that does not exist."""

    def __init__(self, entry: str) -> None:
        self.entry = entry
        super().__init__(f'Checkpoint store entry {entry!r} does not exist; '
                         'create it with create_entry() before writing to it')

    def __reduce__(self):
        return (type(self), (self.entry,))


def check_entry_name(name: str) -> None:
    """Entry names are non-empty strings (stores use them as hash or directory names)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f'A checkpoint store entry name must be a non-empty str, got {name!r}')


class CheckpointStore(abc.ABC):
    """Named entries of byte keys to byte values (the paper's Data Store Entries).

    Contract shared by every implementation:

    * `create_entry` is idempotent (several workers may create the same entry);
      `delete_entry` of a missing entry does nothing.
    * Reading a missing entry behaves as reading an empty one; writing a pair
      into a missing entry raises `EntryNotFoundError`.
    * `keys` and `entries` return sorted lists.
    * A single `put` is atomic: a reader, in any process, sees the old value or
      the new one, never a part.
    * `hmac_key_env`, when set, names the environment variable holding the key
      that authenticates chunked values (see the module's docstring).
    """

    #: The name (never the value) of the environment variable holding the HMAC key.
    hmac_key_env: str | None = None

    def check(self) -> None:
        """Raise `CheckpointStoreUnavailableError` if the store cannot be used now.

        Stores without a server have nothing to check.
        """
        return

    # Entries ---------------------------------------------------------------------
    @abc.abstractmethod
    def create_entry(self, name: str) -> None: ...

    @abc.abstractmethod
    def delete_entry(self, name: str) -> None: ...

    @abc.abstractmethod
    def entry_exists(self, name: str) -> bool: ...

    @abc.abstractmethod
    def entries(self, prefix: str = '') -> list[str]: ...

    # Pairs -------------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, entry: str, key: bytes, value: bytes) -> None: ...

    @abc.abstractmethod
    def get(self, entry: str, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    def delete(self, entry: str, key: bytes) -> None: ...

    @abc.abstractmethod
    def exists(self, entry: str, key: bytes) -> bool: ...

    @abc.abstractmethod
    def keys(self, entry: str, prefix: bytes = b'') -> list[bytes]: ...

    # Batched pairs: loops here; a networked store overrides them to pipeline. ------
    def put_many(self, entry: str, items: Mapping[bytes, bytes]) -> None:
        for key, value in items.items():
            self.put(entry, key, value)

    def get_many(self, entry: str, keys: Iterable[bytes]) -> dict[bytes, bytes | None]:
        return {key: self.get(entry, key) for key in keys}

    def delete_many(self, entry: str, keys: Iterable[bytes]) -> None:
        for key in keys:
            self.delete(entry, key)

    def put_together(self, entry: str, items: Mapping[bytes, bytes | None]) -> None:
        """Write every `key: value` of `items` (None deletes the key), visible at once.

        Stores that can (memory, Redis) apply them atomically: a reader sees all
        of them or none. This default is a loop, which is all the local
        directory store can do (one file is atomic, several are not): callers
        that need atomicity across keys there keep them under one key. Raises
        `EntryNotFoundError` if the entry is missing and `items` writes a value
        (deletes in a missing entry do nothing).
        """
        for key, value in items.items():
            if value is None:
                self.delete(entry, key)
            else:
                self.put(entry, key, value)

    # Chunked large values --------------------------------------------------------
    def put_chunked(self, entry: str, key: bytes, value: bytes,
                    chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        """Store `value` under `key` as checksummed (or HMAC'ed) chunks, replacing any
        earlier value."""
        if chunk_size < 1:
            raise ValueError(f'chunk_size must be positive, got {chunk_size}')
        codec = self._codec(entry, key)
        view = memoryview(value).cast('B')
        total = len(view)
        generation = os.urandom(GENERATION_BYTES)
        chunks: dict[bytes, bytes] = {}
        whole_crc = 0
        for index, start in enumerate(range(0, total, chunk_size)):
            data = view[start:start + chunk_size]
            whole_crc = zlib.crc32(data, whole_crc)
            place = chunk_key(key, generation, index)
            chunks[place] = codec.seal_chunk(place, data)
        old_header = self.get(entry, key)
        self.put_many(entry, chunks)
        self.put(entry, key, codec.seal_header(chunk_size, total, len(chunks), whole_crc,
                                               generation))
        self._delete_old_chunks(codec, old_header, keep=generation)

    def get_chunked(self, entry: str, key: bytes) -> bytes | None:
        """The value stored by `put_chunked`, or None if there is none (no header).

        Raises `CorruptCheckpointError` if the header or a chunk is damaged, fails
        authentication, or a chunk is missing. A missing header reads as "no
        value": the header is written last, so a value without one was never
        completely written.
        """
        header_bytes = self.get(entry, key)
        if header_bytes is None:
            return None
        codec = self._codec(entry, key)
        for _ in range(_READ_ATTEMPTS):
            if header_bytes is None:
                return None
            header = codec.open_header(header_bytes)
            try:
                return self._read_chunks(codec, header)
            except CorruptCheckpointError:
                # A concurrent rewrite or delete may have removed the chunks this
                # header named; only an unchanged header means real damage.
                latest = self.get(entry, key)
                if latest == header_bytes:
                    raise
                header_bytes = latest
        raise CorruptCheckpointError(
            entry, key, None, f'kept changing during {_READ_ATTEMPTS} read attempts')

    def delete_chunked(self, entry: str, key: bytes) -> None:
        """Delete a chunked value: its header first (so readers see it gone), then chunks."""
        self.delete(entry, key)
        # Listing (rather than reading the header) also finds the chunks left by
        # a writer that died before writing its header.
        self.delete_many(entry, self.keys(entry, prefix=key + CHUNK_INFIX))

    # Helpers -----------------------------------------------------------------------
    def _codec(self, entry: str, key: bytes) -> ChunkCodec:
        variable = self.hmac_key_env
        secret = None if variable is None else hmac_key(variable)
        return ChunkCodec(entry, key, secret, variable)

    def _read_chunks(self, codec: ChunkCodec, header: Header) -> bytes:
        keys = [chunk_key(codec.key, header.generation, i) for i in range(header.count)]
        found = self.get_many(codec.entry, keys)
        parts = []
        whole_crc = 0
        for index, place in enumerate(keys):
            data = codec.open_chunk(header, index, place, found.get(place))
            whole_crc = zlib.crc32(data, whole_crc)
            parts.append(data)
        if whole_crc != header.whole_crc:
            raise CorruptCheckpointError(
                codec.entry, codec.key, None,
                'checksum does not match the value its chunks assemble')
        return b''.join(parts)

    def _delete_old_chunks(self, codec: ChunkCodec, old_header: bytes | None,
                           keep: bytes) -> None:
        if old_header is None:
            return
        entry, key = codec.entry, codec.key
        try:
            old = codec.open_header(old_header)
        except CorruptCheckpointError:
            # The old header is unreadable (or not authentic), so its chunks are
            # unknown: sweep them all.
            stale = [k for k in self.keys(entry, prefix=key + CHUNK_INFIX)
                     if k[len(key) + len(CHUNK_INFIX):][:GENERATION_BYTES] != keep]
            self.delete_many(entry, stale)
            return
        if old.generation != keep:
            self.delete_many(entry, [chunk_key(key, old.generation, i)
                                     for i in range(old.count)])
