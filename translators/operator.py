"""The operator contract shared by the batch and streaming drivers (design section 4).

An operator partition receives, in order, bundles and the advances of its input
watermark and processing time:

* `process_bundle(bundle)`: a bundle is a list of `(input id, chunk)` pairs,
  chunks of Beam-encoded windowed values (see `records`). It returns the
  output records `(buffer id, chunk)`.
* `advance(watermark, processing_time)`: the input watermark (the minimum over
  the partition's input channels, which `worker.watermarks.PartitionWatermarks`
  owns) reached `watermark`, and the clock `processing_time` (None: the clock
  is not driven, as in batch, where the input's end runs processing time out
  too). The operator fires due timers and windows in timestamp order,
  garbage-collects expired keyed state, and returns its output records;
  `hold()` then tells how far its state holds the output watermark back.
* `finish_task()`: the end of the partition's run (the task in batch, the epoch
  in streaming).

What an operator needs from the runtime it is handed (`OperatorServices`), as
Flink hands its operators their keyed-state backend and timer service: the
keyed-state backend of its partition (stateful operators), the side inputs it
reads, how a stage reading a source reads on (`translators.read`), where it
counts elements for streaming progress. Operators never ask which driver runs
them. Consistent-region markers (`on_marker` and the StateHandler hooks of IBM
Streams) join this contract with the consistent-region issue; the backend's
snapshot and restore are their checkpoint.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping

from beam_streams_runner.records import MAX_WATERMARK, Record
from beam_streams_runner.state.backend import KeyedStateBackend, never_pinned
from beam_streams_runner.translators.read import ReadToEnd, SourcePolicy
from beam_streams_runner.worker.element_counts import CountedOutput

Bundle = list[tuple[str, bytes]]


@dataclasses.dataclass
class OperatorServices:
    """What the runtime hands an operator partition."""

    bundle_size: int = 0
    # The partition's keyed state (stateful ParDo: user state and timers).
    state: KeyedStateBackend | None = None
    side_inputs: Mapping[bytes, bytes] = dataclasses.field(default_factory=dict)
    # How a stage reading a source reads on (batch: to the end; streaming: per epoch).
    source: SourcePolicy = dataclasses.field(default_factory=ReadToEnd)
    # Streaming progress: the outputs whose elements to count, and where.
    counted: tuple[CountedOutput, ...] = ()
    element_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    # Keys whose state must stay (they have pushed-back elements in a side-input gate).
    pinned: Callable[[bytes], bool] = never_pinned
    # Off only for comparison benchmarks (--no_keyed_state_gc): expired keys stay.
    keyed_state_gc: bool = True
    # Batch: the data outputs feeding a GroupByKey in the global window, by DATA_OUTPUT
    # transform id, with their key coder impl: a chain's batches leave them grouped by
    # key (`keyed_outputs`).
    keyed_outputs: Mapping[str, object] = dataclasses.field(default_factory=dict)


class Operator(abc.ABC):
    """One partition of a Beam primitive (or of a fused chain of them)."""

    @abc.abstractmethod
    def process_bundle(self, bundle: Bundle) -> list[Record]:
        """Processes one bundle; returns its outputs."""

    def advance(self, watermark: int, processing_time: int | None = None) -> list[Record]:
        """The input watermark reached `watermark` (and the clock `processing_time`):
        fires what became due."""
        return []

    def hold(self) -> int:
        """How far the operator's state holds its output watermark (MAX_WATERMARK: not)."""
        return MAX_WATERMARK

    def next_processing_time(self) -> int | None:
        """When the operator's earliest processing-time timer fires, or None."""
        return None

    def finish_task(self) -> list[Record]:
        """The end of this partition's run (the task in batch, the epoch in streaming):
        returns what the operator held over the run's bundles for the runner's own
        sake (partial combines), which must not outlive it."""
        return []
