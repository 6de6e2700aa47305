"""The bounded NEXMark source: generated events, split by event-number ranges.

`NexmarkSource` is a Beam `BoundedSource` over positions [0, num_events) of
the generator (`generator.event_at`: event n depends only on the config and n),
so every split generates its events independently and identically on every
runner. It splits into at least `MIN_SPLITS` ranges whatever the desired bundle
size, so that a small benchmark is still read in parallel. `ReadNexmarkEvents`
reads it and yields Beam's Python NEXMark model objects (Person, Auction, Bid)
timestamped with their event time, which is what Beam's Python queries expect.
The unbounded (streaming) source comes with the streaming issue.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
from apache_beam.io import iobase
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.transforms.window import TimestampedValue

from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import events

MIN_SPLITS = 16


class NexmarkSource(iobase.BoundedSource):
    def __init__(self, config: NexmarkConfig) -> None:
        self.config = config

    def _average_event_bytes(self) -> int:
        c = self.config
        # Person:auction:bid = 1:3:46.
        return (c.avg_person_byte_size + 3 * c.avg_auction_byte_size
                + 46 * c.avg_bid_byte_size) // 50

    def estimate_size(self) -> int:
        return self.config.max_events * self._average_event_bytes()

    def split(self, desired_bundle_size: int, start_position: int | None = None,
              stop_position: int | None = None) -> Iterator[iobase.SourceBundle]:
        start = 0 if start_position is None else start_position
        stop = self.config.max_events if stop_position is None else stop_position
        by_size = max(1, desired_bundle_size // self._average_event_bytes())
        step = max(1, min(by_size, -(-(stop - start) // MIN_SPLITS)))
        for begin in range(start, stop, step):
            end = min(begin + step, stop)
            yield iobase.SourceBundle(
                weight=end - begin, source=self, start_position=begin, stop_position=end)

    def get_range_tracker(self, start_position: int | None,
                          stop_position: int | None) -> OffsetRangeTracker:
        start = 0 if start_position is None else start_position
        stop = self.config.max_events if stop_position is None else stop_position
        return OffsetRangeTracker(start, stop)

    def read(self, range_tracker: OffsetRangeTracker) -> Iterator[TimestampedValue]:
        position = range_tracker.start_position()
        for event in events(self.config, position, range_tracker.stop_position()):
            if not range_tracker.try_claim(event.position):
                return
            yield event.timestamped_value()


class ReadNexmarkEvents(beam.PTransform):
    """The NEXMark events of `config`, as timestamped Beam model objects."""

    def __init__(self, config: NexmarkConfig) -> None:
        super().__init__()
        self._config = config

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return pbegin | 'ReadNexmark' >> beam.io.Read(NexmarkSource(self._config))
