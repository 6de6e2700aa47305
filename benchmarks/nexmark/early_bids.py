"""Bids whose window closes before their auction exists: why streaming Q4, Q6 and Q9
differ from batch over the same events.

Beam's `WinningBids` (the join under Q4, Q6 and Q9) puts each bid in a window
[t, t + 2 * expected duration) (33.3 s) and each auction in [created, expires), and its
merging `AuctionOrBidWindowFn` merges a bid's window into its auction's window when the
bid starts before the auction ends. In batch every window of a key is merged at once.
In streaming a window exists only until the watermark passes its end: a bid whose
window has ended is fired alone (no auction: no output) and forgotten, so an auction
created later never sees it. Beam's own streaming runner does the same (the tests run
one case on Beam's DirectRunner and on this runner).

The NEXMark generator makes such bids. Its parallel timelines each hold a block of
event ids and all start at the base time; a bid picks its auction among the ones
created just before its event id (the hot auction of the last 100, or one of the last
100 in flight), so a bid early in timeline g + 1 names an auction from the end of
timeline g's block, which is created in event time about one timeline's length later.
Once the events span more than 33 s of event time, some of those bids' windows end
before their auction is created.

A bid's window can have closed when its auction arrives only if it ended by then:
the source's watermark never passes an event it has not emitted, so at the auction's
arrival it is at most the auction's time. `early_bids` finds those bids;
`ExcludeEarlyBids` drops them from a batch pipeline's events, which gives what
streaming computes when every such window has closed, as it has when the watermark
keeps within the smallest margin (`EarlyBids.min_margin_s`) of event time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Bid
from apache_beam.testing.benchmarks.nexmark.queries import winning_bids

from benchmarks.nexmark.config import FIRST_AUCTION_ID, NexmarkConfig
from benchmarks.nexmark.generator import event_kind, events, last_base0_auction_id

# The queries built on Beam's WinningBids.
WINNING_BIDS_QUERIES = (4, 6, 9)


def bid_window_us() -> int:
    """The length of a bid's window in Beam's WinningBids, in microseconds."""
    return 2 * winning_bids.WinningBids().auction_or_bid_windowFn.expected_duration


def auction_times_us(config: NexmarkConfig) -> dict[int, int]:
    """Auction id -> creation time (event time, us) of every auction of `config`,
    from the timelines' clocks alone (no event is generated)."""
    times = {}
    for generator_config in config.generator_configs():
        for count in range(generator_config.max_events):
            number = generator_config.next_adjusted_event_number(count)
            event_id = generator_config.first_event_id + number
            if event_kind(event_id) == 'auction':
                auction = last_base0_auction_id(event_id) + FIRST_AUCTION_ID
                times[auction] = generator_config.timestamp_for_event(number) * 1000
    return times


@dataclass(frozen=True)
class EarlyBids:
    """The bids of a config whose window ends before their auction is created."""

    count: int
    # The smallest (auction created - bid window end) over them, in seconds.
    min_margin_s: float


def is_early(bid: Any, auction_times: dict[int, int], window_us: int) -> bool:
    """Whether `bid`'s window ends no later than its auction's creation."""
    created = auction_times.get(bid.auction)
    return created is not None and bid.date_time.micros + window_us <= created


@functools.lru_cache(maxsize=8)
def early_bids(config: NexmarkConfig) -> EarlyBids:
    """Count the early bids of `config` and their smallest margin (generates every
    event: remembered per config)."""
    times = auction_times_us(config)
    window = bid_window_us()
    count, margin = 0, None
    for e in events(config):
        bid = e.event
        if isinstance(bid, Bid) and is_early(bid, times, window):
            count += 1
            gap = times[bid.auction] - bid.date_time.micros - window
            margin = gap if margin is None else min(margin, gap)
    return EarlyBids(count, (margin or 0) / 1e6)


class ExcludeEarlyBids(beam.DoFn):
    """Drops from NEXMark events the bids whose window ends before their auction is
    created (`is_early`)."""

    def __init__(self, config: NexmarkConfig) -> None:
        self._config = config

    def setup(self) -> None:
        self._times = auction_times_us(self._config)
        self._window = bid_window_us()

    def process(self, event: Any) -> Any:
        if not (isinstance(event, Bid) and is_early(event, self._times, self._window)):
            yield event
