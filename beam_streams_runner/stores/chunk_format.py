"""How a chunked value lies in a store: its header, its chunks, their checksums or HMACs.

Design section 8, "Checkpoint stores". `CheckpointStore.put_chunked` splits a
large value into chunks; this module encodes and checks them. Layout of a
chunked value stored under key K (chunks first, header last, so the header is
the commit point):

* K -> header: magic 'BSCK', format version, flags, chunk size, total length,
  number of chunks, CRC-32 of the whole value, an 8-byte random *generation*,
  then a trailer: the header's CRC-32 (4 bytes), or its HMAC-SHA256 (32 bytes)
  when the value is authenticated (flag bit 0);
* K + b'\\x00#' + generation + chunk index (4 bytes, big endian) -> chunk: the
  same kind of trailer, first (CRC-32 of the chunk's place and bytes, or their
  HMAC-SHA256), then the chunk's bytes.

Format version 2 added the flags (and the HMAC). Version 1 headers (no flags,
always CRC-32, chunks laid out as version 2 without HMAC) are still read, by
stores without a key.

CRC-32 guards against accidental damage (a torn file, a lost key, a flipped
bit) at well over a GB/s. A store given `hmac_key_env` (the NAME of an
environment variable holding a secret) authenticates instead: every chunk and
the header carry an HMAC-SHA256 keyed by the variable's value, which also
covers the entry's name and the value's key, so a chunk or a whole value moved
to another place, written without the key or with another one, or edited by
anyone without the key, is rejected. The key is read from the environment when
a chunked value is written or read, in whichever process does it (Spark ships
the store, never the key). Replaying an older, authentic value of the same key
is not detected: that would need state outside the store.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import struct
import zlib

from beam_streams_runner.errors import StreamsSparkRunnerError

# Separates a chunked value's key from the keys of its chunks. Callers must not
# store plain values under keys that start with (a chunked value's key + this).
CHUNK_INFIX = b'\x00#'
GENERATION_BYTES = 8

_MAGIC = b'BSCK'
_VERSION = 2
_FLAG_HMAC = 0x01
# magic, version, [flags,] chunk size, total length, chunk count, whole crc, generation
_BODY_V1 = struct.Struct('>4sBIQII8s')
_BODY_V2 = struct.Struct('>4sBBIQII8s')
_CRC = struct.Struct('>I')
_MAC_BYTES = hashlib.sha256().digest_size
_INDEX = struct.Struct('>I')
_LENGTH = struct.Struct('>I')
_MAC_DOMAIN = b'beam-streams-runner chunked value v2\x00'
_ENV_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')

_RESTART = ('This checkpoint cannot be restored: delete the checkpoint store data of this '
            'job (for a local directory store, its checkpoint directory) and start the '
            'pipeline from scratch.')


class CorruptCheckpointError(StreamsSparkRunnerError):
    """A chunked checkpoint value is missing a chunk, fails its checksums or its HMAC."""

    def __init__(self, entry: str, key: bytes, chunk_index: int | None, problem: str,
                 remedy: str = _RESTART) -> None:
        self.entry = entry
        self.key = key
        self.chunk_index = chunk_index
        self.problem = problem
        self.remedy = remedy
        where = 'the header' if chunk_index is None else f'chunk {chunk_index}'
        super().__init__(f'Corrupt checkpoint in store entry {entry!r}, key {key!r}: '
                         f'{where} {problem}. {remedy}')

    def __reduce__(self):
        return (type(self), (self.entry, self.key, self.chunk_index, self.problem, self.remedy))


class HmacKeyMissingError(StreamsSparkRunnerError):
    """The environment variable that should hold a store's HMAC key is unset or empty."""

    def __init__(self, variable: str) -> None:
        self.variable = variable
        super().__init__(
            f'The checkpoint store authenticates its checkpoints with an HMAC key read from '
            f'the environment variable {variable}, which is unset or empty in this process '
            f'(pid {os.getpid()}). Set {variable} to the job\'s secret key in the '
            'environment of every process that uses the store: the driver and every Spark '
            'executor (e.g. in spark-env.sh or through the cluster manager\'s secrets).')

    def __reduce__(self):
        return (type(self), (self.variable,))


def check_hmac_key_env(name: str | None) -> str | None:
    """`name` if it can name an environment variable; never shows it (it may be a key)."""
    if name is None:
        return None
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ValueError('hmac_key_env must be the NAME of an environment variable (letters, '
                         'digits and underscores, e.g. BSR_CHECKPOINT_KEY), not the key itself; '
                         'the store reads the key from that variable')
    return name


def hmac_key(variable: str) -> bytes:
    """The HMAC key held by environment variable `variable`, read now."""
    value = os.environ.get(variable)
    if not value:
        raise HmacKeyMissingError(variable)
    return os.fsencode(value)


def chunk_key(key: bytes, generation: bytes, index: int) -> bytes:
    return key + CHUNK_INFIX + generation + _INDEX.pack(index)


class Header:
    __slots__ = ('chunk_size', 'count', 'generation', 'keyed', 'total', 'whole_crc')

    def __init__(self, chunk_size: int, total: int, count: int, whole_crc: int,
                 generation: bytes, keyed: bool) -> None:
        self.chunk_size = chunk_size
        self.total = total
        self.count = count
        self.whole_crc = whole_crc
        self.generation = generation
        self.keyed = keyed


class ChunkCodec:
    """Seals and opens the header and chunks of one chunked value (entry, key)."""

    def __init__(self, entry: str, key: bytes, secret: bytes | None,
                 key_env: str | None) -> None:
        self.entry = entry
        self.key = key
        self._key_env = key_env
        self._mac = None
        if secret is not None:
            # Binding the MAC to the entry and key rejects an authentic value moved elsewhere.
            name = entry.encode('utf-8')
            self._mac = hmac.new(secret, _MAC_DOMAIN + _LENGTH.pack(len(name)) + name +
                                 _LENGTH.pack(len(key)) + key, hashlib.sha256)

    # Writing ---------------------------------------------------------------------------
    def seal_header(self, chunk_size: int, total: int, count: int, whole_crc: int,
                    generation: bytes) -> bytes:
        flags = _FLAG_HMAC if self._mac is not None else 0
        body = _BODY_V2.pack(_MAGIC, _VERSION, flags, chunk_size, total, count, whole_crc,
                             generation)
        if self._mac is None:
            return body + _CRC.pack(zlib.crc32(body))
        return body + self._digest(b'H', body)

    def seal_chunk(self, chunk_key_: bytes, data: memoryview | bytes) -> bytes:
        place = chunk_key_[len(self.key):]
        if self._mac is None:
            return _CRC.pack(_chunk_crc(place, data)) + data
        return self._digest(b'C', place, data) + data

    # Reading ---------------------------------------------------------------------------
    def open_header(self, raw: bytes) -> Header:
        if len(raw) < 6 or raw[:4] != _MAGIC:
            raise self._corrupt(None, f'does not start with the magic {_MAGIC!r} (it has '
                                      f'{len(raw)} bytes)')
        version = raw[4]
        if version not in (1, _VERSION):
            raise self._corrupt(None, f'has format version {version}; this release reads '
                                      f'versions 1 and {_VERSION}')
        body_format = _BODY_V1 if version == 1 else _BODY_V2
        flags = 0 if version == 1 else raw[5]
        if flags & ~_FLAG_HMAC:
            raise self._corrupt(None, f'has unknown flags {flags:#04x}')
        keyed = bool(flags & _FLAG_HMAC)
        expected = body_format.size + (_MAC_BYTES if keyed else _CRC.size)
        if len(raw) != expected:
            raise self._corrupt(None, f'has {len(raw)} bytes, expected {expected}')
        body, trailer = raw[:body_format.size], raw[body_format.size:]
        if keyed:
            if self._mac is None:
                raise self._corrupt(
                    None, 'is authenticated with an HMAC key, but this store was given none '
                          '(no hmac_key_env), so it cannot check it',
                    remedy='Give the store hmac_key_env, the name of the environment '
                           'variable holding the key the job wrote it with, and set that '
                           'variable in every process of the job.')
            if not hmac.compare_digest(trailer, self._digest(b'H', body)):
                raise self._unauthentic(None)
        else:
            if _CRC.unpack(trailer)[0] != zlib.crc32(body):
                raise self._corrupt(None, 'fails its checksum')
            if self._mac is not None:
                raise self._unauthentic(None, 'carries no HMAC, so it ')
        fields = body_format.unpack(body)
        chunk_size, total, count, whole_crc, generation = fields[-5:]
        if chunk_size < 1 or count != -(-total // chunk_size):
            raise self._corrupt(None, f'is inconsistent: {count} chunks of {chunk_size} '
                                      f'bytes for {total} bytes')
        return Header(chunk_size, total, count, whole_crc, generation, keyed)

    def open_chunk(self, header: Header, index: int, chunk_key_: bytes,
                   raw: bytes | None) -> memoryview:
        """The bytes of chunk `index`, checked against its trailer."""
        of = f'of {header.count}'
        if raw is None:
            raise self._corrupt(index, f'{of} is missing')
        trailer_size = _MAC_BYTES if header.keyed else _CRC.size
        expected = min(header.chunk_size, header.total - index * header.chunk_size)
        data = memoryview(raw)[trailer_size:]
        if len(raw) < trailer_size or len(data) != expected:
            raise self._corrupt(index, f'{of} has {max(len(raw) - trailer_size, 0)} bytes, '
                                       f'expected {expected}')
        place = chunk_key_[len(self.key):]
        if header.keyed:
            if not hmac.compare_digest(raw[:trailer_size], self._digest(b'C', place, data)):
                raise self._unauthentic(index, f'{of} ')
        elif _CRC.unpack_from(raw)[0] != _chunk_crc(place, data):
            raise self._corrupt(index, f'{of} fails its checksum')
        return data

    # Helpers ---------------------------------------------------------------------------
    def _digest(self, kind: bytes, *parts: bytes | memoryview) -> bytes:
        mac = self._mac.copy()
        mac.update(kind)
        for part in parts:
            mac.update(part)
        return mac.digest()

    def _corrupt(self, index: int | None, problem: str, **remedy: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(self.entry, self.key, index, problem, **remedy)

    def _unauthentic(self, index: int | None, lead: str = '') -> CorruptCheckpointError:
        variable = self._key_env
        return self._corrupt(
            index, f'{lead}fails authentication (HMAC-SHA256 keyed '
                   f'by the environment variable {variable}): it was written without the key, '
                   'with another key, or tampered with',
            remedy=f'If this job wrote it with another key, set {variable} to that key in '
                   f'every process of the job. Otherwise {_RESTART[0].lower()}{_RESTART[1:]}')


def _chunk_crc(place: bytes, data: memoryview | bytes) -> int:
    # Covering the generation and index too catches a chunk stored at the wrong place.
    return zlib.crc32(data, zlib.crc32(place))
