"""Reshuffle: redistribute elements evenly over the partitions.

Beam's `Reshuffle` (and the runner-inserted reshuffle between the initial split
of a splittable DoFn's restrictions and their processing, see `read`) is a
runner primitive here: elements keep their timestamps, windows and panes and
are dealt round-robin to the partitions, in chunks of at most `bundle_size`
elements (so each chunk becomes one bundle downstream). This is what spreads
`Create` over Spark's parallelism; a bounded read's split restrictions are cut into
one equal share per partition instead (`source_shares`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from beam_streams_runner.records import Record, chunks_by_target, decode_with_raw
from beam_streams_runner.translators.source_shares import cut_into_shares, is_source_restriction


class RoundRobinPartitioner:
    """Map side of Reshuffle."""

    def __init__(self, input_coder_impl, output_coder_impl, num_partitions: int,
                 bundle_size: int, start: int = 0) -> None:
        self._input_coder = input_coder_impl
        # Input and output PCollections may use different (but compatible) coders.
        self._transcode = None if input_coder_impl is output_coder_impl else output_coder_impl
        self._num_partitions = num_partitions
        self._bundle_size = bundle_size
        self._start = self._next = start

    def partition(self, tag: str, chunks: Iterable[bytes]) -> Iterator[tuple[int, Record]]:
        return chunks_by_target(
            self._dealt(chunks), self._num_partitions, self._bundle_size, tag)

    def _dealt(self, chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
        """(target partition, encoded element), targets in turn."""
        n = self._num_partitions
        transcode = self._transcode
        decoded = (pair for chunk in chunks for pair in decode_with_raw(self._input_coder, chunk))
        for value, raw in decoded:
            if self._next == self._start and is_source_restriction(value):
                # A source's split: a few restrictions, cut by weight (module doc).
                restrictions = [value] + [v for v, _ in decoded]
                encoder = transcode or self._input_coder
                for target, piece in cut_into_shares(restrictions, n, self._start):
                    yield target, encoder.encode_nested(piece)
                return
            if transcode is not None:
                raw = transcode.encode_nested(value)
            yield self._next % n, raw
            self._next += 1
