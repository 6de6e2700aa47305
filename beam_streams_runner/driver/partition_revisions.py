"""Which revision of its keyed state each stateful partition loads next (design 8, 12).

A partition's task of epoch e commits its backends' delta as revision (e, attempt)
and reports it; the revision of the attempt that succeeded is the base the next
epoch's task loads, so a late write of another attempt is never read (fencing).
As a consistent-region member, a cut records every partition's base; a reset puts
the bases back, so the next epoch's tasks load the cut's state and write their
deltas on top of it (epoch numbers go on: the aborted lineage is never loaded
again). The bases of the cuts still retained travel with every epoch (`keep`), so
that the partitions' garbage collection keeps them loadable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set

from beam_streams_runner.regions.hooks import MemberBase
from beam_streams_runner.state.versioned_state import Revision

Partition = tuple[str, int]  # (stage name, partition index)


class PartitionRevisions(MemberBase):
    """The base revision of every stateful partition, and those of the retained cuts."""

    name = 'partitions'

    def __init__(self) -> None:
        self.bases: dict[Partition, Revision] = {}
        self._retained: dict[tuple[frozenset[str], int], dict[Partition, Revision]] = {}

    def advance(self, committed: Iterable[tuple[Partition, Revision | None]]) -> None:
        """The revisions the partitions of a successful epoch committed."""
        for partition, revision in committed:
            if revision is not None:
                self.bases[partition] = revision

    def keep(self) -> dict[Partition, tuple[Revision, ...]]:
        """Per partition, the revisions retained cuts need."""
        kept: dict[Partition, set[Revision]] = {}
        for bases in self._retained.values():
            for partition, revision in bases.items():
                kept.setdefault(partition, set()).add(revision)
        return {partition: tuple(sorted(revisions)) for partition, revisions in kept.items()}

    # Hooks ---------------------------------------------------------------------------
    def checkpoint(self, sequence_id: int, stages: Set[str]) -> dict[Partition, Revision]:
        part = {p: r for p, r in self.bases.items() if p[0] in stages}
        self._retained[(frozenset(stages), sequence_id)] = part
        return part

    def reset(self, sequence_id: int, stages: Set[str],
              part: Mapping[Partition, Revision] | None) -> None:
        self.reset_to_initial_state(stages)
        self.bases.update(part or {})
        self._retained[(frozenset(stages), sequence_id)] = dict(part or {})

    def reset_to_initial_state(self, stages: Set[str]) -> None:
        for partition in [p for p in self.bases if p[0] in stages]:
            del self.bases[partition]

    def retire_checkpoint(self, sequence_id: int, stages: Set[str]) -> None:
        self._retained.pop((frozenset(stages), sequence_id), None)
