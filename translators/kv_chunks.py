"""Chunks of windowed KVs read without building WindowedValues.

Design section 3.5 (the shuffle of a GroupByKey or a stateful ParDo). A keyed
shuffle's map side needs each element's key bytes (to pick its partition) and its raw
bytes (to send on); the reduce side of a batch GroupByKey in the global window with the
default trigger needs each element's key bytes (to group by), its key and its value,
and nothing else. Beam's `WindowedValueCoder` first decodes the timestamp, the windows
and the pane into objects: 1.4 us an element of two small ints in the global window,
of which the KV is 0.3 us.

Beam writes an element as its timestamp (8 bytes), its window count (4 bytes), each
window (the global window as nothing; an interval window as its end, 8 bytes, and its
length, a varint), its pane (one byte, 0x0F, for an element no trigger fired), then the
key and the value. For an element in one window that no trigger fired, the reader
checks the count and the pane, skips the rest and goes straight to the KV: the map
side takes the key's bytes as they were sent (a length-prefixed key or value is skipped
by its length, unread), the reduce side decodes key and value with their own coders.
Any other element (more windows, another pane) is decoded in full, as before, and its
key encoded again: a deterministic key coder (which grouping by key requires) gives
those same bytes, so no element changes partition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream

_TIMESTAMP_BYTES = 8
_ONE_WINDOW = b'\x00\x00\x00\x01'
_COUNTED = _TIMESTAMP_BYTES + len(_ONE_WINDOW)
_NO_FIRING = 0x0F  # Beam's one-byte encoding of PaneInfo.NO_FIRING
_GLOBAL_NO_FIRING = _ONE_WINDOW + bytes([_NO_FIRING])  # after the timestamp
_INTERVAL_END_BYTES = 8


class KvChunks:
    """Reads the chunks of one windowed KV coder (see the module docstring)."""

    def __init__(self, windowed: coders.WindowedValueCoder) -> None:
        self._windowed = windowed.get_impl()
        self._key = windowed.key_coder().get_impl()
        self._value = windowed.value_coder().get_impl()
        # The map side only passes the bytes on: a length-prefixed part is skipped.
        self._skip_key = _skipper(windowed.key_coder())
        self._skip_value = _skipper(windowed.value_coder())
        global_window = isinstance(windowed.window_coder, coders.GlobalWindowCoder)
        self._at_kv: Callable = _at_global_kv if global_window else _at_interval_kv

    @classmethod
    def of(cls, coder: coders.Coder, key_coder: coders.Coder) -> KvChunks | None:
        """A reader for chunks of `coder`, if its elements are KVs in the global window
        or in interval windows whose key coder is `key_coder` (the one the shuffle and
        the grouping encode keys with); else None."""
        if (isinstance(coder, coders.WindowedValueCoder)
                and isinstance(coder.window_coder,
                               (coders.GlobalWindowCoder, coders.IntervalWindowCoder))
                and coder.is_kv_coder() and coder.key_coder() == key_coder):
            return cls(coder)
        return None

    def keyed_raw(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key bytes, raw element bytes) of every element of `data`."""
        stream = create_InputStream(data)
        total = len(data)
        at_kv, skip_key, skip_value = self._at_kv, self._skip_key, self._skip_value
        start = 0
        while start < total:
            if at_kv(stream):
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
        """(key bytes, key, value) of every element of `data`, whatever its window."""
        stream = create_InputStream(data)
        total = len(data)
        at_kv = self._at_kv
        decode_key, decode_value = self._key.decode_from_stream, self._value.decode_from_stream
        start = 0
        while start < total:
            if at_kv(stream):
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


def _at_global_kv(stream) -> bool:
    """Reads an element's head up to its KV; False if it is not in one global window
    with no firing (the stream is then somewhere in that element: read it again)."""
    # Every windowed element has at least a timestamp, a window count and a pane.
    return stream.read(_COUNTED + 1)[_TIMESTAMP_BYTES:] == _GLOBAL_NO_FIRING


def _at_interval_kv(stream) -> bool:
    """`_at_global_kv` for one interval window (its end and its length skipped)."""
    if stream.read(_COUNTED)[_TIMESTAMP_BYTES:] != _ONE_WINDOW:
        return False
    stream.read(_INTERVAL_END_BYTES)
    stream.read_var_int64()
    return stream.read_byte() == _NO_FIRING


def _stream_at(data: bytes, position: int):
    stream = create_InputStream(data)
    stream.read(position)
    return stream


def _skipper(coder: coders.Coder) -> Callable:
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
