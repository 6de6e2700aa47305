"""What the streaming driver and an epoch's tasks tell each other (design section 5).

The driver broadcasts an `EpochInfo` to every task of an epoch, deals a source
stage's tasks the residuals due (`DueResiduals`) and a side-input reader its
`SideInputsView`; every partition reports back a `PartitionReport` through a
`ReportsAccumulator`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from pyspark import AccumulatorParam

from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.state.versioned_state import Revision
from beam_streams_runner.stores.base import CheckpointStore
from beam_streams_runner.translators.read import Residual


@dataclasses.dataclass(frozen=True)
class EpochInfo:
    """What the driver tells every task of one epoch."""

    number: int
    processing_time: int  # micros: the driver's clock for this epoch
    holds: dict[str, int]  # stage -> watermark hold of residuals the driver kept back
    # Where the partitions' keyed state lives (see `worker.partition_cache`): the store,
    # the run's id (the workers' caches are per run), the entries' prefix, the revision
    # each partition loads (absent: the initial state) and those the retained
    # consistent cuts need (kept by the partitions' garbage collection).
    store: CheckpointStore
    store_id: str
    state_prefix: str
    bases: dict[tuple[str, int], Revision]
    keep: dict[tuple[str, int], tuple[Revision, ...]]
    # Publishing stage -> the epoch of its region's newest consistent cut (-1: none
    # yet); a publishing stage absent publishes at once (see `translators/publish_gate`).
    published_through: dict[str, int]
    bundle_time_ms: int
    read_budget_ms: int  # how long a source stage's task reads on (see `read.ReadInEpochs.read_on`)
    keyed_state_gc: bool = True


@dataclasses.dataclass(frozen=True)
class DueResiduals:
    """The SDF residuals due this epoch that the driver deals to one task of a source
    stage: `read_on` reads them, not the input loop, so that a restriction ahead of the
    others waits instead of reading a bundle every epoch."""

    residuals: tuple[Residual, ...]


class PartitionReport(NamedTuple):
    output_watermark: int
    residuals: list[Residual]
    next_processing_time: int | None
    sizes: dict[tuple[str, str], int]  # (Beam step, gauge name) -> live count here
    read_s: float = 0.0  # seconds a source stage's task spent reading (its input and on)
    # Streaming progress (see `driver.progress`): the watermark of what the partition reads
    # (what its channels sent; for a source, what its restrictions allow), the
    # elements of the counted PCollections, the bytes its state commits wrote.
    input_watermark: int = MAX_WATERMARK
    elements: dict[str, int] = {}  # noqa: RUF012 - never mutated (tasks pass their own)
    state_bytes: int = 0
    # The revision the partition's state commit wrote (None: a stage without state),
    # and whether its user code asked for a consistent cut (`regions.request_checkpoint`).
    revision: Revision | None = None
    checkpoint_requested: bool = False
    unpublished: int = 0  # chunks a publish gate keeps for a consistent cut
    # Where the task ran, and how it loaded its state: kind ('live': this process's
    # backend of the last task, 'hit': the host's live copy, 'catch-up' and 'snapshot':
    # from the store, 'initial') -> backends, and -> the milliseconds those loads took.
    host: str = ''
    state_loads: dict[str, int] = {}  # noqa: RUF012 - never mutated (tasks pass their own)
    state_load_ms: dict[str, float] = {}  # noqa: RUF012 - never mutated (tasks pass their own)


class ReportsAccumulator(AccumulatorParam):
    """Per-epoch reports keyed by (epoch, stage, partition): a re-run task replaces its own."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        value1.update(value2)
        return value1


class SideInputsView(NamedTuple):
    """What a stage reading side inputs gets in one epoch (see `side_input_gate`)."""

    state_bc: object  # broadcast of the state-API layout of everything seen so far
    watermarks: dict  # (ParDo, tag) -> the side input's watermark this epoch (micros)
