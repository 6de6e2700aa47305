"""Reading chunks of windowed KVs in the global window without WindowedValues
(`global_kvs`): the same keys, values and raw bytes as Beam's full decoding, for any
mix of elements the fast path takes and elements it decodes in full."""

from __future__ import annotations

import pytest
from apache_beam import coders
from apache_beam.coders.coders import GlobalWindowCoder, IntervalWindowCoder, LengthPrefixCoder
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.translators import global_kvs
from beam_streams_runner.translators.global_kvs import GlobalKvChunks

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


def _windowed_coder(name: str) -> coders.WindowedValueCoder:
    key, value = _KV_CODERS[name][:2]
    return coders.WindowedValueCoder(coders.TupleCoder([key, value]), GlobalWindowCoder())


@st.composite
def _elements(draw):
    name = draw(st.sampled_from(sorted(_KV_CODERS)))
    _, _, keys, values = _KV_CODERS[name]
    element = st.builds(
        lambda k, v, micros, pane, windows: WindowedValue(
            (k, v), Timestamp(micros=micros), (GlobalWindow(),) * windows, pane),
        keys, values, st.integers(-2**62, 2**62),
        st.one_of(st.just(PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0)),
                  st.sampled_from(_OTHER_PANES)),
        st.sampled_from([1, 1, 1, 2]))
    return name, draw(st.lists(element, max_size=40))


@settings(max_examples=300, deadline=None)
@given(_elements())
def test_keys_values_and_raw_bytes_are_beams(named_elements):
    name, elements = named_elements
    windowed = _windowed_coder(name)
    impl, key_impl = windowed.get_impl(), windowed.key_coder().get_impl()
    raws = [impl.encode_nested(e) for e in elements]
    data = b''.join(raws)
    reader = GlobalKvChunks.of(windowed, windowed.key_coder())
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
    assert element[8:13] == global_kvs._GLOBAL_NO_FIRING == b'\x00\x00\x00\x01\x0f'


@pytest.mark.parametrize('windowed, key_coder', [
    (coders.WindowedValueCoder(coders.TupleCoder([coders.VarIntCoder()] * 2),
                               IntervalWindowCoder()), coders.VarIntCoder()),
    (_windowed_coder('str-bytes'), coders.FastPrimitivesCoder()),
    (coders.WindowedValueCoder(coders.VarIntCoder(), GlobalWindowCoder()), coders.VarIntCoder()),
])
def test_only_kvs_in_the_global_window_with_the_shuffles_key_coder(windowed, key_coder):
    assert GlobalKvChunks.of(windowed, key_coder) is None
