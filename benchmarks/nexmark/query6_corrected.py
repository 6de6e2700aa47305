"""Beam's NEXMark Q6 with its one bug corrected (opt-in: the launcher's `--corrected-q6`).

Beam 2.77's `query6.MovingMeanSellingPriceFn.add_input` sorts the winning bids by
`(-bid.date_time, -bid.price)`, and a `Timestamp` has no unary minus: the query fails on
every runner with `TypeError: bad operand type for unary -: 'Timestamp'`. Here the sort
key negates `bid.date_time.micros` instead (the same order); everything else is Beam's
`query6.load`, step for step, with Beam's labels.

Q6 fires `Repeatedly(AfterCount(1))` with ACCUMULATING panes in the global window. A
batch run fires once per seller, after all of its winning bids: the mean of the seller's
last 10. In streaming every firing emits the mean so far, so a seller has one line per
pane and which panes there are depends on how the winning bids arrive; the last pane
equals the batch line (see `launcher.accumulating_panes_verdict`).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.benchmarks.nexmark.queries import nexmark_query_util, winning_bids
from apache_beam.testing.benchmarks.nexmark.queries.nexmark_query_util import ResultNames
from apache_beam.testing.benchmarks.nexmark.queries.query6 import MovingMeanSellingPriceFn
from apache_beam.transforms import trigger, window


class CorrectedMovingMeanSellingPriceFn(MovingMeanSellingPriceFn):
    """Beam's combiner, with an `add_input` that sorts by the bid time in micros."""

    def add_input(self, accumulator, element):
        accumulator.append(element)
        new_accu = sorted(accumulator, key=lambda bid: (-bid.date_time.micros, -bid.price))
        if len(new_accu) > self.max_num_bids:
            del new_accu[self.max_num_bids]
        return new_accu


def load(events, metadata=None, pipeline_options=None):
    """Beam's `query6.load` with `CorrectedMovingMeanSellingPriceFn`."""
    return (
        events
        | beam.Filter(nexmark_query_util.auction_or_bid)
        | winning_bids.WinningBids()
        | beam.Map(lambda auc_bid: (auc_bid.auction.seller, auc_bid.bid))
        | beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
            allowed_lateness=0)
        | beam.CombinePerKey(CorrectedMovingMeanSellingPriceFn(10))
        | beam.Map(lambda t: {ResultNames.SELLER: t[0], ResultNames.PRICE: t[1]}))
