"""TestStream: a source whose events drive the streaming driver's epochs.

Design section 5. Beam's `TestStream` is a runner primitive here: the driver
decodes its events (Beam's own `Event.from_runner_api`) and turns each one into
one epoch, in order, so that a pipeline sees exactly the interleaving the test
wrote: an `ElementEvent` puts its timestamped elements (global window, no pane
fired yet) into the epoch's input of that output tag; a `WatermarkEvent` moves
the watermark of that output tag; a `ProcessingTimeEvent` moves the driver's
processing-time clock. Once the events run out, every output's watermark goes
to +inf, as on Beam's direct runner.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.testing import test_stream
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN, WindowedValue

from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK, Record


class TestStreamStep(NamedTuple):
    """One epoch's worth of a TestStream: its records and its watermarks."""

    records: list[Record]  # (output buffer id, chunk)
    watermarks: dict[bytes, int]  # output buffer id -> watermark (micros)
    advance_processing_time_by: int  # micros


class TestStreamEvents:
    """The events of one TestStream transform, as epoch steps."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, payload: bytes, context, outputs: Mapping[str, tuple[bytes, object]]
                 ) -> None:
        """`outputs`: output tag ('None' for the main one) -> (buffer id, windowed coder impl)."""
        proto = beam_runner_api_pb2.TestStreamPayload.FromString(payload)
        coder = context.coders.get_by_id(proto.coder_id)
        self._events = [test_stream.Event.from_runner_api(e, coder) for e in proto.events]
        self._outputs = dict(outputs)
        self._watermarks = {buffer: MIN_WATERMARK for buffer, _ in self._outputs.values()}

    def steps(self) -> Iterator[TestStreamStep]:
        for event in self._events:
            records: list[Record] = []
            advance = 0
            if isinstance(event, test_stream.ElementEvent):
                buffer, coder = self._outputs[_tag(event.tag)]
                chunk = b''.join(
                    coder.encode_nested(WindowedValue(
                        tv.value, tv.timestamp, (GlobalWindow(),), PANE_INFO_UNKNOWN))
                    for tv in event.timestamped_values)
                if chunk:
                    records.append((buffer, chunk))
            elif isinstance(event, test_stream.WatermarkEvent):
                buffer, _ = self._outputs[_tag(event.tag)]
                self._watermarks[buffer] = max(
                    self._watermarks[buffer], min(event.new_watermark.micros, MAX_WATERMARK))
            elif isinstance(event, test_stream.ProcessingTimeEvent):
                advance = event.advance_by.micros
            yield TestStreamStep(records, dict(self._watermarks), advance)
        self._watermarks = {buffer: MAX_WATERMARK for buffer in self._watermarks}
        yield TestStreamStep([], dict(self._watermarks), 0)


def _tag(tag) -> str:
    return 'None' if tag is None else tag
