"""A bounded read's initial split cut into one equal share per partition.

Design section 4 (reads: initial splitting over partitions). Beam splits a
`BoundedSource` into chunks of `Read.get_desired_chunk_size` (a 12 MB text file:
four chunks of 3.4, 3.4, 3.4 and 1.5 MB), sized for a runner that balances them
dynamically. Spark runs one task per partition and does not, so dealing those chunks
round-robin left one of two tasks reading 58% of the file. The runner's reshuffle
between split and read (`reshuffle`) cuts them instead, as Spark's own `textFile`
does: in order, each partition takes the next `total / partitions` of the
restrictions' weight (bytes for files), a restriction that straddles a share's end
being split there by its source's own static split (`BoundedSource.split` over the
restriction's positions, what Beam's initial split calls; the range tracker then
gives a text line to exactly one piece). A source that does not split there (a
compressed file, a source that ignores the positions) goes whole to the share it
starts in.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from apache_beam.io import iobase
from apache_beam.utils.windowed_value import WindowedValue

# A share is full once less than this fraction of it is left: no sliver pieces.
_SLACK = 0.01


def is_source_restriction(value: object) -> bool:
    """Whether `value` is a sized bounded-source restriction as Beam's split-and-size
    step gives it: `WindowedValue(((element, (restriction, state)), size))`."""
    if not isinstance(value, WindowedValue):
        return False
    try:
        (_, (restriction, _)), _ = value.value
    except (TypeError, ValueError):
        return False
    return isinstance(restriction, iobase._SDFBoundedSourceRestriction)


def cut_into_shares(restrictions: Sequence[WindowedValue], num_shares: int,
                    first: int = 0) -> Iterator[tuple[int, WindowedValue]]:
    """(share, sized restriction) for every piece of `restrictions` (see the module
    doc); shares counted from `first`, modulo `num_shares`."""
    total = sum(max(0.0, float(r.value[1])) for r in restrictions)
    if total <= 0:
        for offset, r in enumerate(restrictions):
            yield (first + offset) % num_shares, r
        return
    share = total / num_shares
    last = first + num_shares - 1
    target, room = first, share
    for sized in restrictions:
        (element, (restriction, state)), size = sized.value
        while size > room * (1 + _SLACK) and target < last:
            parts = _split_off(restriction, room)
            if parts is None:
                break
            primary, restriction = parts
            yield target % num_shares, _sized(sized, element, primary, state)
            target, room = target + 1, share
            size = restriction.weight()
        yield target % num_shares, _sized(sized, element, restriction, state)
        room -= size
        if room <= share * _SLACK and target < last:
            target, room = target + 1, share


def _split_off(restriction, weight: float):
    """(the first `weight` of `restriction`, the rest), cut where its source's own split
    cuts; None where the source does not cut it there."""
    bundle = restriction._source_bundle  # Beam's wrapper keeps its positions private
    try:
        first = next(iter(bundle.source.split(max(1, int(weight)), bundle.start_position,
                                              bundle.stop_position)), None)
    except Exception:  # noqa: BLE001 - a source that cannot split here keeps it whole
        return None
    if (first is None or first.start_position != bundle.start_position
            or first.stop_position in (bundle.start_position, bundle.stop_position)):
        return None
    source = bundle.source
    return (iobase._SDFBoundedSourceRestriction(iobase.SourceBundle(
                first.weight, source, bundle.start_position, first.stop_position)),
            iobase._SDFBoundedSourceRestriction(iobase.SourceBundle(
                bundle.weight - first.weight, source, first.stop_position,
                bundle.stop_position)))


def _sized(like: WindowedValue, element, restriction, state) -> WindowedValue:
    return like.with_value(((element, (restriction, state)), restriction.weight()))
