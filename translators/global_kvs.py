"""Chunks of windowed KVs in the global window, read without building WindowedValues.

Design section 3.5 (the shuffle of a GroupByKey). A keyed shuffle's map side needs each
element's key bytes (to pick its partition) and its raw bytes (to send on); the reduce
side of a batch GroupByKey in the global window with the default trigger needs each
element's key bytes (to group by), its key and its value, and nothing else. Beam's
`WindowedValueCoder` first decodes the timestamp, the windows and the pane into objects:
1.4 us an element of two small ints here, of which the KV is 0.3 us. Every element in
the global window with the pane Beam gives elements that no trigger fired
(`PaneInfo` NO_FIRING) has the same five bytes after its 8-byte timestamp: one window,
which the global window's coder writes as nothing, and the pane's one byte. Those are
checked and skipped, and the key and the value decoded with the KV's own coders; the
key's bytes are the raw bytes it was sent as. Any other element (more windows, another
pane) is decoded in full, as before, and its key encoded again: a deterministic key
coder (which a GroupByKey requires) gives those same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator

from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream

_TIMESTAMP_BYTES = 8
_GLOBAL_NO_FIRING = b'\x00\x00\x00\x01\x0f'  # one window (written as nothing), NO_FIRING
_HEAD = _TIMESTAMP_BYTES + len(_GLOBAL_NO_FIRING)


class GlobalKvChunks:
    """Reads the chunks of one windowed KV coder (see the module docstring)."""

    def __init__(self, windowed: coders.WindowedValueCoder) -> None:
        self._windowed = windowed.get_impl()
        self._key = windowed.key_coder().get_impl()
        self._value = windowed.value_coder().get_impl()
        # The map side only passes the bytes on: a length-prefixed part is skipped.
        self._skip_key = _skipper(windowed.key_coder())
        self._skip_value = _skipper(windowed.value_coder())

    @classmethod
    def of(cls, coder: coders.Coder, key_coder: coders.Coder) -> GlobalKvChunks | None:
        """A reader for chunks of `coder`, if its elements are KVs in the global window
        whose key coder is `key_coder` (the one the shuffle and the grouping encode
        keys with); else None."""
        if (isinstance(coder, coders.WindowedValueCoder)
                and isinstance(coder.window_coder, coders.GlobalWindowCoder)
                and coder.is_kv_coder() and coder.key_coder() == key_coder):
            return cls(coder)
        return None

    def keyed_raw(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key bytes, raw element bytes) of every element of `data`."""
        stream = create_InputStream(data)
        total = len(data)
        skip_key, skip_value = self._skip_key, self._skip_value
        start = 0
        while start < total:
            # Every windowed element has at least a timestamp, a window count and a pane.
            if stream.read(_HEAD)[_TIMESTAMP_BYTES:] == _GLOBAL_NO_FIRING:
                key_start = total - stream.size()
                skip_key(stream)
                key_end = total - stream.size()
                skip_value(stream)
                end = total - stream.size()
                key_bytes = data[key_start:key_end]
            else:
                (key, _), end = self._decoded(data, start)
                key_bytes = self._key.encode_nested(key)
                stream = _stream_at(data, end)
            yield key_bytes, data[start:end]
            start = end

    def keyed_values(self, data: bytes) -> Iterator[tuple[bytes, object, object]]:
        """(key bytes, key, value) of every element of `data`."""
        stream = create_InputStream(data)
        total = len(data)
        decode_key, decode_value = self._key.decode_from_stream, self._value.decode_from_stream
        start = 0
        while start < total:
            if stream.read(_HEAD)[_TIMESTAMP_BYTES:] == _GLOBAL_NO_FIRING:
                key_start = total - stream.size()
                key = decode_key(stream, True)
                key_bytes = data[key_start:total - stream.size()]
                value = decode_value(stream, True)
            else:
                (key, value), end = self._decoded(data, start)
                key_bytes = self._key.encode_nested(key)
                stream = _stream_at(data, end)
            yield key_bytes, key, value
            start = total - stream.size()

    def _decoded(self, data: bytes, start: int) -> tuple[tuple, int]:
        """The KV of the element at `start`, decoded in full, and where it ends."""
        rest = create_InputStream(data[start:])
        windowed = self._windowed.decode_from_stream(rest, True)
        return windowed.value, len(data) - rest.size()


def _stream_at(data: bytes, position: int):
    stream = create_InputStream(data)
    stream.read(position)
    return stream


def _skipper(coder: coders.Coder):
    """What moves a stream past one nested encoding of `coder`: reading its length
    prefix and its bytes, or decoding it."""
    if isinstance(coder, coders.LengthPrefixCoder):
        def skip(stream) -> None:
            stream.read(stream.read_var_int64())
        return skip
    decode = coder.get_impl().decode_from_stream

    def skip_decoding(stream) -> None:
        decode(stream, True)
    return skip_decoding
