"""One table from a stage's kind to how each driver builds it (design section 13).

As Beam's Dask runner keeps one table from transform to its translation, every
kind of stage `plan` makes is one row here: the method of the batch driver that
builds its RDD (None: the kind never runs in batch), the method of the
streaming driver that builds its RDD for one epoch, and whether its partitions
report to the streaming driver (a stage whose partitions report is finished
when they all reported +inf with nothing left; one that does not is finished
with its producers, or never, for a TestStream, whose events end it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class StageKind(NamedTuple):
    batch: str | None  # BatchDriver method: (stage) -> RDD | None
    streaming: str | None  # StreamingDriver method: (stage, epoch job) -> RDD | None
    reports: bool  # its partitions send PartitionReports
    finishes: bool  # it can finish before the pipeline does


STAGE_KINDS: dict[str, StageKind] = {
    # Runs in the SDK harness: ParDos, GroupByKey reduce sides, lifted combines, reads.
    'sdk': StageKind(batch='_sdk_stage', streaming='_sdk_stage', reports=True, finishes=True),
    # A runner-only round-robin shuffle.
    'reshuffle': StageKind(batch='_reshuffled', streaming='_reshuffled', reports=False,
                           finishes=True),
    # A runner-only source whose events drive the streaming driver's epochs.
    'test_stream': StageKind(batch=None, streaming='_test_stream_rdd', reports=False,
                             finishes=False),
    # A batch file sink's commit, run by the driver after its files are written.
    'commit_files': StageKind(batch='_committed_files', streaming=None, reports=False,
                              finishes=True),
}


def stage_builder(driver: object, kind: str, streaming: bool) -> Callable:
    """The bound method of `driver` that builds a stage of `kind`."""
    row = STAGE_KINDS[kind]
    name = row.streaming if streaming else row.batch
    if name is None:
        raise ValueError(f'A {kind!r} stage cannot run in {"streaming" if streaming else "batch"}')
    return getattr(driver, name)
