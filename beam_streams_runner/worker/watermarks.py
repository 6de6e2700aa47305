"""The one owner of a partition's watermarks (design sections 4 and 5).

A partition's input watermark is the minimum over its input channels: every
upstream partition of every input is a channel, and sends its watermark after
the data it produced (a `Punctuation` in streaming; the end of a bounded input,
+inf, in batch). Its output watermark is the input watermark held back by
named holds: the keyed state of its operators (trigger holds, timers), the
residuals of its sources, the driver's hold for the residuals it kept back, the
side-input gate's pushed-back elements and the publish gate's staged output.
Operators are told their input watermark; only this class computes minima.
"""

from __future__ import annotations

from collections.abc import Hashable

from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK

# The holds of a partition, in the order its operators run: a hold applies to the
# operators after it (a GroupByKey's trigger holds hold the fused steps after it).
GROUPING = 'grouping'
TIMERS = 'timers'
RESIDUALS = 'residuals'
DRIVER = 'driver'
SIDE_INPUT_GATE = 'side_input_gate'
PUBLISH_GATE = 'publish_gate'


class PartitionWatermarks:
    """A partition's input channels and named holds."""

    def __init__(self) -> None:
        self._channels: dict[Hashable, int] = {}
        self._holds: dict[str, int] = {}

    def hear(self, channel: Hashable, watermark: int) -> None:
        """`channel` promises no more data before `watermark` (micros)."""
        self._channels[channel] = max(watermark, self._channels.get(channel, MIN_WATERMARK))

    def input(self) -> int:
        """The minimum over the channels heard; +inf when none was (a partition fed
        only by residuals the driver dealt it: their watermarks are holds)."""
        return min(self._channels.values()) if self._channels else MAX_WATERMARK

    def hold(self, name: str, watermark: int | None) -> None:
        """Sets the hold `name` (None or MAX_WATERMARK releases it)."""
        if watermark is None or watermark >= MAX_WATERMARK:
            self._holds.pop(name, None)
        else:
            self._holds[name] = watermark

    def held(self, *names: str) -> int:
        """The input watermark held back by the holds `names` only."""
        return min([self.input(), *(self._holds[n] for n in names if n in self._holds)])

    def output(self) -> int:
        """The input watermark held back by every hold."""
        return min([self.input(), *self._holds.values()])
