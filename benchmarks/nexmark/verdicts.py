"""Verdicts: whether a NEXMark run's output equals its reference, and why not.

Outputs are compared as multisets of canonical lines (`capture`). An output that is
empty on both sides is `empty`, never equal: nothing was compared. Where a difference
is a property of Beam's model rather than a fault, a named verdict says so, and only
after checking that the difference is exactly that one:

* `no (equal to the ms)`: elements and windows equal, output timestamps differ below
  1 ms (a reference that never encodes elements keeps end-of-window at end - 1 us).
* `no (unfired last panes)`, streaming Q3: its `AfterCount(30)` panes fire as a
  seller's elements arrive, and what arrived after a seller's last pane is never fired;
  the output lacks exactly such remainders of the batch output.
* `no (accumulating panes)`, streaming Q6 (`--corrected-q6`): a line per ACCUMULATING
  pane, the last of each seller being the batch line.
* `no (bids closed before their auction)`, streaming Q4, Q6, Q9: equal to the batch
  output over the same events without the bids whose window ends before their auction
  is created (`early_bids`), which Beam's streaming merging windows cannot join.
* Q12 (processing-time panes) is compared on its total bid count per bidder, against
  the generator when the reference runner fails on it.
"""

from __future__ import annotations

import ast
import collections
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.nexmark.capture import output_line
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.early_bids import WINNING_BIDS_QUERIES, bid_window_us, early_bids

PROCESSING_TIME_QUERIES = (12,)
# Queries whose streaming panes fire per count of arrived elements (Q3: AfterCount(30)).
AFTER_COUNT_QUERIES = (3,)
Q3_PANE_COUNT = 30
# Queries whose streaming output has a line per ACCUMULATING pane (Q6, `--corrected-q6`).
ACCUMULATING_PANE_QUERIES = (6,)
ORACLE = 'generator oracle'
EMPTY = 'empty'


def deterministic_lines(query: int, lines: Iterable[str]) -> list[str]:
    """The part of a query's output that does not depend on processing time, sorted.

    Q12 (processing-time trigger, discarding panes): the total bid count per bidder
    summed over all panes, as `bidder_id=N TAB bid_count=M`. Other queries: all lines.
    """
    if query not in PROCESSING_TIME_QUERIES:
        return sorted(lines)
    totals: collections.Counter[int] = collections.Counter()
    for line in lines:
        element = ast.literal_eval(line.split('\t', 1)[0])
        totals[element['bidder_id']] += element['bid_count']
    return sorted(f'bidder_id={b}\tbid_count={n}' for b, n in totals.items())


def oracle_lines(query: int, config: NexmarkConfig) -> list[str]:
    """Q12's deterministic part computed straight from the generator (no pipeline)."""
    from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Bid

    from benchmarks.nexmark.generator import events
    if query != 12:
        raise ValueError(f'no oracle for Q{query}')
    totals: collections.Counter[int] = collections.Counter(
        e.event.bidder for e in events(config) if isinstance(e.event, Bid))
    return sorted(f'bidder_id={b}\tbid_count={n}' for b, n in totals.items())


_TIMESTAMP = re.compile(r'Timestamp\((-?\d+)\.(\d{3})\d{3}\)')
# Beam's Timestamp repr leaves out the fraction of a whole second: Timestamp(5).
_WHOLE_SECONDS = re.compile(r'Timestamp\((-?\d+)\)')


def truncate_to_millis(lines: Iterable[str]) -> list[str]:
    """`lines` with every `Timestamp(s.uuuuuu)` cut to milliseconds, sorted.

    Runners that encode elements between steps (FnApiRunner, StreamsSparkRunner) carry
    timestamps in ms (Beam's WindowedValue coder), so an end-of-window timestamp becomes
    `end - 1 ms`; the BundleBasedDirectRunner never encodes and keeps `end - 1 us`.
    """
    return sorted(_TIMESTAMP.sub(r'Timestamp(\1.\g<2>000)',
                                 _WHOLE_SECONDS.sub(r'Timestamp(\1.000000)', line))
                  for line in lines)


@dataclass
class Comparison:
    """Result of comparing two sorted outputs as multisets of lines."""

    equal: bool
    only_in_tested: list[str] = field(default_factory=list)
    only_in_reference: list[str] = field(default_factory=list)

    def summary(self, limit: int = 3, width: int = 200) -> str:
        """The counts of differing lines, with up to `limit` examples of each side."""
        if self.equal:
            return 'equal'

        def examples(lines: list[str]) -> str:
            return ' | '.join(line if len(line) <= width else line[:width - 3] + '...'
                              for line in lines[:limit])
        return (f'{len(self.only_in_tested)} lines only in the tested run '
                f'(e.g. {examples(self.only_in_tested)}), {len(self.only_in_reference)} '
                f'only in the reference (e.g. {examples(self.only_in_reference)})')


def compare_outputs(tested: Sequence[str], reference: Sequence[str]) -> Comparison:
    """Compare two outputs line by line, as multisets (sorted lines equal)."""
    a, b = collections.Counter(tested), collections.Counter(reference)
    if a == b:
        return Comparison(True)
    return Comparison(False, sorted((a - b).elements()), sorted((b - a).elements()))



@dataclass
class RunResult:
    """What one (query, runner) run produced."""

    query: int
    runner: str
    events: int
    ok: bool
    output_count: int = 0
    error: str = ''
    lines: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def q3_full_join(config: NexmarkConfig) -> dict[str, int]:
    """Every pair Q3 can output (persons of OR/ID/CA with their category-10 auctions),
    as its canonical line in the global window at its end (ms), with the seller's id,
    from the generator."""
    from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Auction, Person
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import Timestamp

    from benchmarks.nexmark.generator import events
    persons: dict[int, Any] = {}
    auctions = []
    for e in events(config):
        x = e.event
        if isinstance(x, Person) and x.state in ('OR', 'ID', 'CA'):
            persons[x.id] = x
        elif isinstance(x, Auction) and x.category == 10:
            auctions.append(x)
    window = GlobalWindow()
    timestamp = Timestamp(micros=window.max_timestamp().micros // 1000 * 1000)
    return {output_line({'name': persons[a.seller].name, 'city': persons[a.seller].city,
                         'state': persons[a.seller].state, 'auction_id': a.id},
                        window, timestamp): a.seller
            for a in auctions if a.seller in persons}


def unfired_panes_verdict(tested: list[str], reference: list[str], config: NexmarkConfig
                          ) -> tuple[str, str] | None:
    """For a streaming Q3 that differs from batch: if it lacks only what each seller's
    unfired last pane held, ('no (unfired last panes)', how), else None.

    Q3 groups each seller's auctions and person under `Repeatedly(AfterCount(30))`. In
    batch all of a seller's elements arrive at once and fire as one pane; in streaming a
    pane fires whenever 30 more have arrived, and what arrived after a seller's last
    firing (fewer than 30 elements) is never fired: the global window ends only at the
    end of time. So the streaming output holds no pair outside the batch output, no
    duplicate, and per seller either all of its batch pairs but fewer than 30 (the
    auctions of its remainder), or none (its person was in the remainder: the join
    keeps fired auctions until the person comes).
    """
    join = q3_full_join(config)
    tested_set, reference_set = set(tested), set(reference)
    if (len(tested_set) != len(tested) or not tested_set <= reference_set
            or not reference_set <= join.keys()):
        return None
    kept = collections.Counter(join[line] for line in tested_set)
    missing = collections.Counter(join[line] for line in reference_set - tested_set)
    tails = {seller: n for seller, n in missing.items() if kept[seller]}
    if any(n >= Q3_PANE_COUNT for n in tails.values()):
        return None
    whole = {seller: n for seller, n in missing.items() if not kept[seller]}
    return 'no (unfired last panes)', (
        f'{len(tested)} of the {len(reference)} batch pairs and no other, no duplicate; '
        f'{len(tails)} sellers lack their last 1-{max(tails.values(), default=0)} auctions '
        f'({sum(tails.values())} pairs), {len(whole)} sellers lack all ({sum(whole.values())}'
        f' pairs: their person arrived after their last pane fired): Repeatedly(AfterCount'
        f'({Q3_PANE_COUNT})) fires a seller\'s pane each time {Q3_PANE_COUNT} more elements '
        'arrived; in batch all arrive at once and fire as one pane, in streaming what '
        'arrived after the last firing stays unfired (the global window never ends)')


def accumulating_panes_verdict(tested: list[str], reference: list[str]
                               ) -> tuple[str, str] | None:
    """For a streaming Q6 (`--corrected-q6`) whose output differs from a batch reference
    (one line per seller: its mean after all its winning bids): if, to the millisecond,
    every reference line is among the tested lines and the tested lines name no other
    seller, ('no (accumulating panes)', why); else None.

    Streaming fires `Repeatedly(AfterCount(1))` as the winning bids arrive, each
    ACCUMULATING pane giving the mean so far, so a seller has a line per pane and its last
    pane is the batch line; which other panes there are depends on arrival order.
    """
    def seller(line: str) -> Any:
        return ast.literal_eval(line.split('\t', 1)[0])['seller']

    tested, reference = truncate_to_millis(tested), truncate_to_millis(reference)
    try:
        by_seller = collections.Counter(seller(line) for line in reference)
        tested_sellers = {seller(line) for line in tested}
    except (ValueError, SyntaxError, KeyError, TypeError):
        return None
    if (any(n != 1 for n in by_seller.values()) or tested_sellers != set(by_seller)
            or not set(reference) <= set(tested)):
        return None
    return 'no (accumulating panes)', (
        f'every seller\'s batch line (its mean after all its winning bids) is one of its '
        f'streaming panes, and no other seller appears: {len(tested)} panes for '
        f'{len(by_seller)} sellers here, one line per seller in the batch reference; which '
        'earlier panes there are depends on the order the winning bids arrive in')


def equality_verdict(query: int, tested: RunResult, reference: RunResult | None,
                     config: NexmarkConfig, streaming: bool = False,
                     without_early_bids: RunResult | None = None) -> tuple[str, str]:
    """(`yes`/`no...`/`empty`/`failed: reason`, note) for `tested` against `reference`.

    Q12: compared on `deterministic_lines`; if the reference fails on it, against
    `oracle_lines` (the count per bidder straight from the generator). In streaming, a
    differing Q3 is checked with `unfired_panes_verdict`, Q6 with
    `accumulating_panes_verdict`, and Q4/Q6/Q9 against `without_early_bids` (the
    reference run over the events without the early bids) with `early_bids_verdict`.
    """
    if not tested.ok:
        return f'failed: {tested.error}', ''
    note = ''
    if reference is not None and reference.ok:
        ref_lines = deterministic_lines(query, reference.lines)
    elif query in PROCESSING_TIME_QUERIES:
        ref_lines = oracle_lines(query, config)
        reason = reference.error if reference is not None else 'no reference run'
        note = f'reference failed ({reason}); compared with the {ORACLE}'
    else:
        reason = reference.error if reference is not None else 'no reference run'
        return f'no reference: {reason}', ''
    if query in PROCESSING_TIME_QUERIES:
        note = '; '.join(p for p in (note, 'compared on the total count per bidder') if p)
    lines = deterministic_lines(query, tested.lines)
    if not lines and not ref_lines:
        return EMPTY, '; '.join(p for p in (note, 'no output on either side: nothing '
                                            'was compared') if p)
    comparison = compare_outputs(lines, ref_lines)
    if comparison.equal:
        return 'yes', note
    to_the_ms = compare_outputs(truncate_to_millis(lines), truncate_to_millis(ref_lines))
    if to_the_ms.equal:
        return 'no (equal to the ms)', '; '.join(
            p for p in (note, MS_NOTE, comparison.summary(1)) if p)
    explained = (_streaming_verdict(query, tested.lines, ref_lines, config,
                                    without_early_bids) if streaming else None)
    if explained is not None:
        return explained
    if len(to_the_ms.only_in_tested) < len(comparison.only_in_tested):
        # Sub-ms timestamps (a BundleBasedDirectRunner reference) differ on every
        # windowed line: show what differs to the millisecond.
        return 'no', '; '.join(p for p in (note, 'to the ms: ' + to_the_ms.summary()) if p)
    return 'no', '; '.join(p for p in (note, comparison.summary()) if p)


def _streaming_verdict(query: int, tested: list[str], reference: list[str],
                       config: NexmarkConfig, without_early_bids: RunResult | None
                       ) -> tuple[str, str] | None:
    """The named verdict explaining a streaming output that differs from batch, if one
    holds (module docstring), else None."""
    if query in AFTER_COUNT_QUERIES:
        return unfired_panes_verdict(tested, reference, config)
    if query in WINNING_BIDS_QUERIES:
        if without_early_bids is None or not without_early_bids.ok:
            return None
        return early_bids_verdict(query, tested, without_early_bids.lines, config)
    if query in ACCUMULATING_PANE_QUERIES:
        return accumulating_panes_verdict(tested, reference)
    return None


def early_bids_verdict(query: int, tested: list[str], without_early_bids: list[str],
                       config: NexmarkConfig) -> tuple[str, str] | None:
    """For a streaming Q4/Q6/Q9 that differs from batch: if it equals (to the ms; Q6 as
    accumulating panes) the batch output over the events without the early bids,
    ('no (bids closed before their auction)', why), else None."""
    if query in ACCUMULATING_PANE_QUERIES:
        if accumulating_panes_verdict(tested, without_early_bids) is None:
            return None
        how = 'as accumulating panes (each seller\'s last pane is its batch line)'
    elif compare_outputs(truncate_to_millis(tested),
                         truncate_to_millis(without_early_bids)).equal:
        how = 'to the ms'
    else:
        return None
    early = early_bids(config)
    return 'no (bids closed before their auction)', (
        f'equal, {how}, to the batch output over the same events without the '
        f'{early.count} bids whose window [t, t + {bid_window_us() / 1e6:.1f} s) ends '
        f'before their auction is created (the nearest {early.min_margin_s:.1f} s before '
        'it): Beam\'s merging AuctionOrBidWindowFn joins a bid to its auction only while '
        'the bid\'s window is open, and in streaming it closes once the watermark passes '
        'its end; the generator makes such bids where a timeline\'s first bids name '
        'auctions from the end of the previous timeline\'s block of ids')


MS_NOTE = ('elements and windows equal, timestamps differ below 1 ms: the reference keeps '
           'end-of-window timestamps at end - 1 us (it never encodes elements), the tested '
           'runner has end - 1 ms (Beam\'s WindowedValue coder carries ms, as on the '
           'DirectRunner)')


def first_line(text: str, limit: int = 160) -> str:
    """The line of an error message that names its cause, cut to `limit` characters."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    # Beam wraps worker errors; the root cause is usually the last line.
    line = lines[-1] if lines else ''
    return line if len(line) <= limit else line[:limit - 3] + '...'
