"""Beam's timers, read from the SDK harness's timer streams without building `Timer`s.

Design section 7: a stateful ParDo's timers go into its keyed-state backend's
timer queues as their Beam encoding (fired as they are), identified by
(encoded user key, timer family, encoded dynamic tag and windows), so that equal
ids are equal timers and setting one again replaces it (Beam's semantics).
"""

from __future__ import annotations

from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream

from beam_streams_runner.records import MAX_WATERMARK

_TIME_SHIFT = 1 << 63  # Beam's timestamp encoding flips the sign bit


def latest_due(watermark: int) -> int:
    """The latest firing timestamp (micros) of an event-time timer that input watermark
    `watermark` (micros) makes due.

    Beam keeps a timer's timestamp in milliseconds (its encoding, and `Timer`s set
    directly, cut the microseconds off), while elements and watermarks keep
    microseconds. A timer at t ms stands for an instant in [t, t + 1) ms: a window
    [0, 1) s keeps its end-of-window timer at 0.999 s and may still receive an
    element at 0.9995 s while the watermark is at 0.999 s. So the timer fires once
    the watermark passes the whole millisecond (as Beam's Java runners compare,
    watermarks in milliseconds: t < watermark's milliseconds). At the end of the input
    (+inf) every timer is due."""
    if watermark >= MAX_WATERMARK:
        return watermark
    return watermark // 1000 * 1000 - 1


class TimerReader:
    """Reads a stream of timers in Beam's encoding (`TimerCoderImpl`: user key, dynamic
    timer tag, windows, clear bit, then unless cleared the firing and hold timestamps
    and the pane) into its parts, without building Beam's `Timer`s."""

    def __init__(self, key_coder_impl, window_coder: coders.Coder) -> None:
        self._key = key_coder_impl
        self._tag = coders.StrUtf8Coder().get_impl()
        self._windows = coders.TupleSequenceCoder(window_coder).get_impl()
        self._pane = coders.PaneInfoCoder().get_impl()

    def read(self, data: bytes):
        """(encoded user key, encoded tag and windows, firing micros or None if the timer
        is cleared, hold micros, the timer's whole encoding) of each timer."""
        stream = create_InputStream(data)
        total = len(data)
        key_impl, tag_impl, windows_impl, pane_impl = (
            self._key, self._tag, self._windows, self._pane)
        while stream.size():
            start = total - stream.size()
            key_impl.decode_from_stream(stream, True)
            key_end = total - stream.size()
            tag_impl.decode_from_stream(stream, True)
            windows_impl.decode_from_stream(stream, True)
            id_end = total - stream.size()
            if stream.read_byte():  # the clear bit
                yield data[start:key_end], data[key_end:id_end], None, None, None
                continue
            fire = _read_timestamp(stream)
            hold = _read_timestamp(stream)
            pane_impl.decode_from_stream(stream, True)
            yield (data[start:key_end], data[key_end:id_end], fire, hold,
                   data[start:total - stream.size()])


def _read_timestamp(stream) -> int:
    """Micros of a timestamp in Beam's encoding (`TimestampCoderImpl`: milliseconds as a
    big-endian int64 with the sign bit flipped)."""
    millis = stream.read_bigendian_int64()
    return (millis + _TIME_SHIFT if millis < 0 else millis - _TIME_SHIFT) * 1000
