"""Reading chunks of windowed KVs without WindowedValues (`kv_chunks`): the same keys,
values and raw bytes as Beam's full decoding, in the global window and in interval
windows, for any mix of elements the fast path takes and elements it decodes in full."""

from __future__ import annotations

import pytest
from apache_beam import coders
from apache_beam.coders.coders import GlobalWindowCoder, IntervalWindowCoder, LengthPrefixCoder
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.translators import kv_chunks
from beam_streams_runner.translators.kv_chunks import KvChunks

_KV_CODERS = {
    'varint-fastprimitives': (coders.VarIntCoder(), coders.FastPrimitivesCoder(),
                              st.integers(-2**40, 2**40),
                              st.one_of(st.integers(), st.text(max_size=8),
                                        st.tuples(st.integers(), st.booleans()))),
    'str-bytes': (coders.StrUtf8Coder(), coders.BytesCoder(), st.text(max_size=12),
                  st.binary(max_size=20)),
    'fastprimitives': (coders.FastPrimitivesCoder(), coders.FastPrimitivesCoder(),
                       st.one_of(st.integers(), st.text(max_size=6)),
                       st.one_of(st.none(), st.floats(allow_nan=False), st.text())),
    # What the runner's plans mostly carry: length-prefixed parts, skipped unread.
    'length-prefixed': (LengthPrefixCoder(coders.FastPrimitivesCoder()),
                        LengthPrefixCoder(coders.FastPrimitivesCoder()),
                        st.one_of(st.integers(), st.text(max_size=6)),
                        st.one_of(st.integers(), st.binary(max_size=300))),
}
_OTHER_PANES = [PaneInfo(True, False, PaneInfoTiming.EARLY, 0, -1),
                PaneInfo(False, True, PaneInfoTiming.ON_TIME, 3, 0),
                PaneInfo(True, True, PaneInfoTiming.LATE, 200, 150)]


def _windowed_coder(name: str, interval: bool = False) -> coders.WindowedValueCoder:
    key, value = _KV_CODERS[name][:2]
    return coders.WindowedValueCoder(coders.TupleCoder([key, value]),
                                     IntervalWindowCoder() if interval else GlobalWindowCoder())


# Interval windows as Beam encodes them: ends in millis, whole-milli lengths.
_INTERVALS = st.builds(lambda end_ms, length_ms: IntervalWindow(
    Timestamp(micros=(end_ms - length_ms) * 1000), Timestamp(micros=end_ms * 1000)),
    st.integers(-2**40, 2**40), st.integers(0, 2**34))


@st.composite
def _elements(draw):
    name = draw(st.sampled_from(sorted(_KV_CODERS)))
    interval = draw(st.booleans())
    _, _, keys, values = _KV_CODERS[name]
    windows = (st.lists(_INTERVALS, min_size=1, max_size=3) if interval
               else st.sampled_from([1, 1, 1, 2]).map(lambda n: [GlobalWindow()] * n))
    element = st.builds(
        lambda k, v, micros, pane, in_windows: WindowedValue(
            (k, v), Timestamp(micros=micros), tuple(in_windows), pane),
        keys, values, st.integers(-2**62, 2**62),
        st.one_of(st.just(PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0)),
                  st.sampled_from(_OTHER_PANES)),
        windows)
    return name, interval, draw(st.lists(element, max_size=40))


@settings(max_examples=300, deadline=None)
@given(_elements())
def test_keys_values_and_raw_bytes_are_beams(named_elements):
    name, interval, elements = named_elements
    windowed = _windowed_coder(name, interval)
    impl, key_impl = windowed.get_impl(), windowed.key_coder().get_impl()
    raws = [impl.encode_nested(e) for e in elements]
    data = b''.join(raws)
    reader = KvChunks.of(windowed, windowed.key_coder())
    assert reader is not None
    assert list(reader.keyed_raw(data)) == [
        (key_impl.encode_nested(e.value[0]), raw) for e, raw in zip(elements, raws, strict=True)]
    assert list(reader.keyed_values(data)) == [
        (key_impl.encode_nested(e.value[0]), *e.value) for e in elements]


def test_the_common_element_takes_the_fast_path():
    # An element no trigger fired, in the one global window: the five bytes after its
    # timestamp are the ones the reader skips (else every element would take the slow
    # path and the test above could not tell).
    windowed = _windowed_coder('str-bytes')
    element = windowed.get_impl().encode_nested(
        WindowedValue(('k', b'v'), Timestamp(micros=7), (GlobalWindow(),)))
    assert element[8:13] == kv_chunks._GLOBAL_NO_FIRING == b'\x00\x00\x00\x01\x0f'
    interval = _windowed_coder('str-bytes', interval=True).get_impl().encode_nested(
        WindowedValue(('k', b'v'), Timestamp(micros=7),
                      (IntervalWindow(Timestamp(micros=0), Timestamp(micros=5000)),)))
    assert interval[8:12] == kv_chunks._ONE_WINDOW
    assert interval[12 + 8 + 1] == kv_chunks._NO_FIRING  # end, a one-byte length, pane


@pytest.mark.parametrize('windowed, key_coder', [
    (coders.WindowedValueCoder(coders.TupleCoder([coders.VarIntCoder()] * 2),
                               coders.PickleCoder()), coders.VarIntCoder()),
    (_windowed_coder('str-bytes'), coders.FastPrimitivesCoder()),
    (coders.WindowedValueCoder(coders.VarIntCoder(), GlobalWindowCoder()), coders.VarIntCoder()),
])
def test_only_kvs_in_global_or_interval_windows_with_the_shuffles_key_coder(windowed, key_coder):
    assert KvChunks.of(windowed, key_coder) is None


@pytest.mark.parametrize('interval', [False, True])
def test_one_window_no_firing_elements_are_never_decoded_in_full(monkeypatch, interval):
    windowed = _windowed_coder('length-prefixed', interval)
    windows = ((IntervalWindow(Timestamp(micros=-3000), Timestamp(micros=9_000_000)),)
               if interval else (GlobalWindow(),))
    elements = [WindowedValue((f'k{i % 3}', i), Timestamp(micros=i), windows)
                for i in range(50)]
    data = b''.join(windowed.get_impl().encode_nested(e) for e in elements)
    reader = KvChunks.of(windowed, windowed.key_coder())

    def decoded_in_full(*_):
        raise AssertionError('the fast path was not taken')
    monkeypatch.setattr(reader, '_decoded', decoded_in_full)
    assert [k for k, _ in reader.keyed_raw(data)] == [
        windowed.key_coder().encode(e.value[0]) for e in elements]
    assert [(k, v) for _, k, v in reader.keyed_values(data)] == [e.value for e in elements]
