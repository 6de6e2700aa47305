"""Reshuffle: redistribute elements evenly over the partitions.

Beam's `Reshuffle` (and the runner-inserted reshuffle between the initial split
of a splittable DoFn's restrictions and their processing, see `read`) is a
runner primitive here: elements keep their timestamps, windows and panes and
are dealt round-robin to the partitions, in chunks of at most `bundle_size`
elements (so each chunk becomes one bundle downstream). This is what spreads
`Create` and source splits over Spark's parallelism.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from beam_streams_runner.records import Record, decode_with_raw


class RoundRobinPartitioner:
    """Map side of Reshuffle."""

    def __init__(self, input_coder_impl, output_coder_impl, num_partitions: int,
                 bundle_size: int, start: int = 0) -> None:
        self._input_coder = input_coder_impl
        # Input and output PCollections may use different (but compatible) coders.
        self._transcode = None if input_coder_impl is output_coder_impl else output_coder_impl
        self._num_partitions = num_partitions
        self._bundle_size = bundle_size
        self._next = start

    def partition(self, tag: str, chunks: Iterable[bytes]) -> Iterator[tuple[int, Record]]:
        # The per-element loop is inlined: it runs for every element reshuffled.
        n = self._num_partitions
        limit = self._bundle_size
        pending: list[list[bytes]] = [[] for _ in range(n)]
        transcode = self._transcode
        target = self._next % n
        for chunk in chunks:
            for value, raw in decode_with_raw(self._input_coder, chunk):
                if transcode is not None:
                    raw = transcode.encode_nested(value)
                parts = pending[target]
                parts.append(raw)
                if len(parts) >= limit:
                    yield target, (tag, b''.join(parts))
                    pending[target] = []
                target = target + 1 if target + 1 < n else 0
        self._next = target
        for index, parts in enumerate(pending):
            if parts:
                yield index, (tag, b''.join(parts))
