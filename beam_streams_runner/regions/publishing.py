"""Sinks that publish after the cut: which steps, and the fence they write under.

Design section 12 ("Sinks publish after the cut"). With consistent regions on, a
step whose DoFn publishes (renames staged files into place, writes to an
external store) runs only on what a committed cut covers: its input waits in the
stage's `PublishGate` (translators/publish_gate.py), in the partition's keyed
state, until the cut after the epoch that produced it is consistent. A reset
discards what waited after the cut and the replay produces it again; what was
released before a failure is released again after it, so publishing must be
idempotent, and the fence says in which order: every element released carries
the epoch it waited from (`current_fence()`), increasing with the data, so that a
write from an old task attempt or a dead driver never overwrites a newer one.

A DoFn publishes when its class sets `publishes_after_checkpoint = True` (the
runner's `io.WriteToRedis`, or a user's own sink), or when it is one of Beam's
file-sink finalize steps, which rename the written shards into place and delete
what an earlier pane left there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from apache_beam import Pipeline
from apache_beam.io import fileio, iobase
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.transforms.core import ParDo

PUBLISHES_AFTER_CHECKPOINT = 'publishes_after_checkpoint'

# Beam's file sinks in streaming: the steps that make written shards visible.
_BEAM_PUBLISHING_DOFNS = (
    iobase._PreFinalizeWindowedBundleDoFn,  # WriteToText & co. on an unbounded input
    fileio._MoveTempFilesIntoFinalDestinationFn,  # fileio.WriteToFiles
)

_fence = threading.local()


def is_publishing(dofn: object) -> bool:
    """Whether `dofn` publishes: its input must wait for the cut covering it."""
    return (isinstance(dofn, _BEAM_PUBLISHING_DOFNS)
            or bool(getattr(type(dofn), PUBLISHES_AFTER_CHECKPOINT, False)))


def publishing_steps(pipeline: Pipeline) -> frozenset[str]:
    """The full labels (the runner-API unique names) of the steps of `pipeline` whose
    DoFn publishes."""
    found: set[str] = set()

    class _Visitor(PipelineVisitor):
        def visit_transform(self, applied: AppliedPTransform) -> None:
            transform = applied.transform
            if isinstance(transform, ParDo) and is_publishing(transform.fn):
                found.add(applied.full_label)

    pipeline.visit(_Visitor())
    return frozenset(found)


def current_fence() -> int | None:
    """The epoch the elements being published waited from (None: not behind a gate,
    e.g. consistent regions off, a batch run or another runner)."""
    return getattr(_fence, 'epoch', None)


@contextlib.contextmanager
def fenced(epoch: int) -> Iterator[None]:
    """Publishes what runs inside under the fence `epoch`."""
    previous = current_fence()
    _fence.epoch = epoch
    try:
        yield
    finally:
        _fence.epoch = previous

