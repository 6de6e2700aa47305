"""The checkpoint store interface: named entries of byte keys to byte values.

Design section 8, "Checkpoint stores" (after Jacques-Silva et al., VLDB 2016,
the IBM Streams checkpoint data store): a store holds named Data Store Entries
(one per job and operator, or per operator partition); an entry holds byte keys
mapped to byte values. `CheckpointStore` is that abstract two-level model. The
batched pair operations exist so that a networked store (Redis) can pipeline
them; here they are loops over the single operations.

Large values (snapshots, deltas) are written with `put_chunked`, which splits
them into fixed-size chunks, each carrying a checksum, under keys derived from
the value's key; `get_chunked` reassembles and checks them and raises
`CorruptCheckpointError` on a missing or damaged chunk.

Layout of a chunked value stored under key K (chunks first, header last, so the
header is the commit point):

* K -> header: magic, format version, chunk size, total length, number of
  chunks, checksum of the whole value, an 8-byte random *generation*, and a
  checksum of the header itself;
* K + b'\\x00#' + generation + chunk index (4 bytes, big endian) -> chunk:
  checksum (4 bytes) then the chunk's bytes.

A rewrite writes a new generation's chunks, swaps the header, then deletes the
old generation's chunks, so a concurrent reader sees either the old value or the
new one (it re-reads the header when a chunk vanished under it) and a value that
shrinks leaves no stale chunks behind. Two processes rewriting one key at once
each leave a complete value (the last header wins), but the loser's chunks may
stay behind as orphans until `delete_chunked`, which sweeps every chunk under
the key. Deleting a key while another process writes it is a race the caller
must avoid (the writer's new chunks may be swept).

Checksums are CRC-32 (`zlib.crc32`): the threat is accidental damage (a torn or
truncated file, a lost key, a bit flip), not an adversary, and CRC-32 detects
those at well over a GB/s from the standard library, where a cryptographic
hash would cost several times more per byte of every checkpoint.
"""

from __future__ import annotations

import abc
import os
import struct
import zlib
from collections.abc import Iterable, Mapping

from beam_streams_runner.errors import StreamsSparkRunnerError

DEFAULT_CHUNK_SIZE = 1 << 20

# Separates a chunked value's key from the keys of its chunks. Callers must not
# store plain values under keys that start with (a chunked value's key + this).
CHUNK_INFIX = b'\x00#'

_HEADER_MAGIC = b'BSCK'
_HEADER_FORMAT_VERSION = 1
# magic, format version, chunk size, total length, chunk count, whole crc, generation
_HEADER = struct.Struct('>4sBIQII8s')
_CRC = struct.Struct('>I')
_CHUNK_INDEX = struct.Struct('>I')
_GENERATION_BYTES = 8
# A reader whose chunks vanish under a concurrent rewrite starts over this often.
_READ_ATTEMPTS = 5


class CorruptCheckpointError(StreamsSparkRunnerError):
    """A chunked checkpoint value is missing a chunk or fails its checksums."""

    def __init__(self, entry: str, key: bytes, chunk_index: int | None, problem: str) -> None:
        self.entry = entry
        self.key = key
        self.chunk_index = chunk_index
        self.problem = problem
        where = 'the header' if chunk_index is None else f'chunk {chunk_index}'
        super().__init__(
            f'Corrupt checkpoint in store entry {entry!r}, key {key!r}: {where} {problem}. '
            'This checkpoint cannot be restored: delete the checkpoint store data of this '
            'job (for a local directory store, its checkpoint directory) and start the '
            'pipeline from scratch.')


class EntryNotFoundError(StreamsSparkRunnerError, LookupError):
    """A pair was written into an entry that does not exist."""

    def __init__(self, entry: str) -> None:
        self.entry = entry
        super().__init__(f'Checkpoint store entry {entry!r} does not exist; '
                         'create it with create_entry() before writing to it')


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
    """

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

    # Chunked large values --------------------------------------------------------
    def put_chunked(self, entry: str, key: bytes, value: bytes,
                    chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        """Store `value` under `key` as checksummed chunks, replacing any earlier value."""
        if chunk_size < 1:
            raise ValueError(f'chunk_size must be positive, got {chunk_size}')
        view = memoryview(value).cast('B')
        total = len(view)
        generation = os.urandom(_GENERATION_BYTES)
        chunks: dict[bytes, bytes] = {}
        whole_crc = 0
        for index, start in enumerate(range(0, total, chunk_size)):
            data = view[start:start + chunk_size]
            whole_crc = zlib.crc32(data, whole_crc)
            chunk_key = _chunk_key(key, generation, index)
            chunks[chunk_key] = _CRC.pack(_chunk_crc(chunk_key, key, data)) + data
        old_header = self.get(entry, key)
        self.put_many(entry, chunks)
        self.put(entry, key, _encode_header(chunk_size, total, len(chunks), whole_crc, generation))
        self._delete_old_chunks(entry, key, old_header, keep=generation)

    def get_chunked(self, entry: str, key: bytes) -> bytes | None:
        """The value stored by `put_chunked`, or None if there is none (no header).

        Raises `CorruptCheckpointError` if the header or a chunk is damaged or a
        chunk is missing. A missing header reads as "no value": the header is
        written last, so a value without one was never completely written.
        """
        header_bytes = self.get(entry, key)
        for _ in range(_READ_ATTEMPTS):
            if header_bytes is None:
                return None
            header = _decode_header(entry, key, header_bytes)
            try:
                return self._read_chunks(entry, key, header)
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
    def _read_chunks(self, entry: str, key: bytes, header: _Header) -> bytes:
        keys = [_chunk_key(key, header.generation, i) for i in range(header.count)]
        found = self.get_many(entry, keys)
        parts = []
        whole_crc = 0
        for index, chunk_key in enumerate(keys):
            chunk = found.get(chunk_key)
            of = f'of {header.count}'
            if chunk is None:
                raise CorruptCheckpointError(entry, key, index, f'{of} is missing')
            expected_length = min(header.chunk_size, header.total - index * header.chunk_size)
            data = memoryview(chunk)[_CRC.size:]
            if len(chunk) < _CRC.size or len(data) != expected_length:
                raise CorruptCheckpointError(
                    entry, key, index, f'{of} has {max(len(chunk) - _CRC.size, 0)} bytes, '
                    f'expected {expected_length}')
            if _CRC.unpack_from(chunk)[0] != _chunk_crc(chunk_key, key, data):
                raise CorruptCheckpointError(entry, key, index, f'{of} fails its checksum')
            whole_crc = zlib.crc32(data, whole_crc)
            parts.append(data)
        if whole_crc != header.whole_crc:
            raise CorruptCheckpointError(
                entry, key, None, 'checksum does not match the value its chunks assemble')
        return b''.join(parts)

    def _delete_old_chunks(self, entry: str, key: bytes, old_header: bytes | None,
                           keep: bytes) -> None:
        if old_header is None:
            return
        try:
            old = _decode_header(entry, key, old_header)
        except CorruptCheckpointError:
            # The old header is unreadable, so its chunks are unknown: sweep them all.
            stale = [k for k in self.keys(entry, prefix=key + CHUNK_INFIX)
                     if k[len(key) + len(CHUNK_INFIX):][:_GENERATION_BYTES] != keep]
            self.delete_many(entry, stale)
            return
        if old.generation != keep:
            self.delete_many(entry, [_chunk_key(key, old.generation, i)
                                     for i in range(old.count)])


class _Header:
    __slots__ = ('chunk_size', 'count', 'generation', 'total', 'whole_crc')

    def __init__(self, chunk_size: int, total: int, count: int, whole_crc: int,
                 generation: bytes) -> None:
        self.chunk_size = chunk_size
        self.total = total
        self.count = count
        self.whole_crc = whole_crc
        self.generation = generation


def _chunk_key(key: bytes, generation: bytes, index: int) -> bytes:
    return key + CHUNK_INFIX + generation + _CHUNK_INDEX.pack(index)


def _chunk_crc(chunk_key: bytes, key: bytes, data: memoryview | bytes) -> int:
    # Covering the generation and index too catches a chunk stored at the wrong place.
    return zlib.crc32(data, zlib.crc32(chunk_key[len(key):]))


def _encode_header(chunk_size: int, total: int, count: int, whole_crc: int,
                   generation: bytes) -> bytes:
    body = _HEADER.pack(_HEADER_MAGIC, _HEADER_FORMAT_VERSION, chunk_size, total, count,
                        whole_crc, generation)
    return body + _CRC.pack(zlib.crc32(body))


def _decode_header(entry: str, key: bytes, raw: bytes) -> _Header:
    if len(raw) != _HEADER.size + _CRC.size:
        raise CorruptCheckpointError(entry, key, None, f'has {len(raw)} bytes, expected '
                                     f'{_HEADER.size + _CRC.size}')
    body = raw[:_HEADER.size]
    if _CRC.unpack_from(raw, _HEADER.size)[0] != zlib.crc32(body):
        raise CorruptCheckpointError(entry, key, None, 'fails its checksum')
    magic, version, chunk_size, total, count, whole_crc, generation = _HEADER.unpack(body)
    if magic != _HEADER_MAGIC or version != _HEADER_FORMAT_VERSION:
        raise CorruptCheckpointError(
            entry, key, None, f'has magic {magic!r} version {version}, expected '
                              f'{_HEADER_MAGIC!r} version {_HEADER_FORMAT_VERSION}')
    if chunk_size < 1 or count != -(-total // chunk_size):
        raise CorruptCheckpointError(entry, key, None, f'is inconsistent: {count} chunks '
                                     f'of {chunk_size} bytes for {total} bytes')
    return _Header(chunk_size, total, count, whole_crc, generation)
