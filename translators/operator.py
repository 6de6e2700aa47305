"""The operator contract shared by the batch and streaming drivers (design section 4).

An operator partition receives, in order, bundles and punctuations:

* `process_bundle(bundle)`: a bundle is a list of `(input id, chunk)` pairs,
  chunks of Beam-encoded windowed values (see `records`). It returns the
  output records `(buffer id, chunk)`.
* `on_watermark(channel, watermark)`: the input watermark of the operator is the
  minimum over its input channels (every upstream partition of every input is a
  channel). When it advances, the operator fires due timers and windows in
  timestamp order, garbage-collects expired keyed state, and returns its output
  records; `output_watermark()` then tells what it may promise downstream:
  min(input watermark, its holds).

The batch driver sends, per partition, the bundles of every channel and then the
watermark +inf on every channel; the streaming driver sends them epoch by epoch.
Operators never ask which driver runs them. Consistent-region markers
(`on_marker` and the StateHandler hooks of IBM Streams) join this contract with
the consistent-region issue.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterable

from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK, Record

Bundle = list[tuple[str, bytes]]


class ChannelWatermarks:
    """One watermark per input channel; the input watermark is their minimum."""

    def __init__(self, channels: Iterable[Hashable]) -> None:
        self._by_channel = {channel: MIN_WATERMARK for channel in channels}

    def advance(self, channel: Hashable, watermark: int) -> bool:
        """Records `watermark` on `channel`; True if the minimum moved."""
        before = self.current()
        if watermark > self._by_channel.get(channel, MIN_WATERMARK):
            self._by_channel[channel] = watermark
        return self.current() > before

    def current(self) -> int:
        return min(self._by_channel.values()) if self._by_channel else MAX_WATERMARK


class Operator(abc.ABC):
    """One partition of a Beam primitive (or of a fused chain of them)."""

    def __init__(self, channels: Iterable[Hashable]) -> None:
        self.watermarks = ChannelWatermarks(channels)

    @abc.abstractmethod
    def process_bundle(self, bundle: Bundle) -> list[Record]:
        """Processes one bundle; returns its outputs."""

    def on_watermark(self, channel: Hashable, watermark: int) -> list[Record]:
        """Advances one input channel; fires what became due."""
        if self.watermarks.advance(channel, watermark):
            return self.on_input_watermark(self.watermarks.current())
        return []

    def on_input_watermark(self, watermark: int) -> list[Record]:
        """Called when the input watermark (minimum over channels) advances."""
        return []

    def finish_task(self) -> list[Record]:
        """The end of this partition's run (the task in batch, the epoch in streaming):
        returns what the operator held over the run's bundles for the runner's own
        sake (partial combines), which must not outlive it."""
        return []

    def output_watermark(self) -> int:
        return self.watermarks.current()
