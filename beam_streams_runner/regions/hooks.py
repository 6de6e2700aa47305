"""The hooks through which a consistent-region controller reaches what it checkpoints.

Design sections 4 and 12, with the IBM Streams names (`StateHandler`). Whatever
holds state of a region implements `RegionMember`: the driver's source positions
(restrictions, watermark-estimator states, the TestStream's progress), its
side-input buffers, the revisions of every stateful partition's keyed-state
backend, and the sinks that publish after a cut. The controller calls nothing
else: it never sees residuals, backends or files.

A member answers for the stages of one region at a time (`stages`), so that
regions reset independently and autonomous stages are never touched.

On epochs (section 12) the drain is the epoch boundary: `drain` is called after an
epoch's Spark job finished, when nothing is in flight. `checkpoint` returns the
member's part of the commit record, a picklable value that must not change
afterwards (a frozen copy: the next epochs run while a non-blocking checkpoint
writes it). `reset` puts the member back to such a value;
`reset_to_initial_state` to before the first epoch.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any, Protocol


class RegionMember(Protocol):
    """Something of a consistent region that the controller checkpoints and resets."""

    name: str  # its key in the commit record

    def drain(self, stages: Set[str]) -> None:
        """Called at a cut, after the epoch's job: nothing of `stages` is in flight."""

    def checkpoint(self, sequence_id: int, stages: Set[str]) -> Any:
        """This member's state of `stages` at the cut: picklable, never changed later."""

    def prepare_for_non_blocking_checkpoint(self, sequence_id: int, stages: Set[str]) -> None:
        """Called before `checkpoint` when the record is written while epochs go on."""

    def reset(self, sequence_id: int, stages: Set[str], part: Any) -> None:
        """Back to `part` (what `checkpoint` returned at `sequence_id`) for `stages`."""

    def reset_to_initial_state(self, stages: Set[str]) -> None:
        """Back to before the first epoch for `stages`."""

    def region_checkpointed(self, sequence_id: int, stages: Set[str]) -> None:
        """The cut `sequence_id` is consistent (its commit record is durable)."""

    def retire_checkpoint(self, sequence_id: int, stages: Set[str]) -> None:
        """The cut `sequence_id` will never be reset to again."""


class MemberBase:
    """Hooks that do nothing, for members that need only some of them."""

    name = ''

    def drain(self, stages: Set[str]) -> None:
        pass

    def prepare_for_non_blocking_checkpoint(self, sequence_id: int, stages: Set[str]) -> None:
        pass

    def region_checkpointed(self, sequence_id: int, stages: Set[str]) -> None:
        pass

    def retire_checkpoint(self, sequence_id: int, stages: Set[str]) -> None:
        pass
