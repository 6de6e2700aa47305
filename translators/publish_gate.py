"""Sinks publish after the cut: a publishing stage's input waits for the cut covering it.

Design section 12 ("Sinks publish after the cut"). A step that publishes (see
`regions.publishing`: Beam's file-sink finalize steps, the runner's
`io.WriteToRedis`, a user's DoFn marked `publishes_after_checkpoint`) starts its
own stage (`plan.annotate_publishing_steps_as_roots`). With consistent regions
on, every chunk of records that reaches that stage in epoch e is staged here, in
the partition's keyed-state backend, and released, in arrival order, in the first
epoch after the region's cut after e (or a later one) is consistent, under the
fence e (`regions.publishing.fenced`).

So what a sink publishes is always covered by a consistent cut: a reset to that
cut never takes it back, and what was staged after the cut is discarded by the
reset and produced again by the replay. What was released before a failure is
released again after it (its cut is the one reset to), so publishing steps are
idempotent: Beam's finalize renames skip files already in place, WriteToRedis
compares fences. Staged chunks hold the stage's output watermark at their
earliest element, so that a step reading the sink's output as a side input (the
file sinks' FinalizeWrite) waits for what was published.

State: one value per staged chunk under its sequence number (8 big-endian
bytes), (input index, chunk, earliest timestamp, epoch); the next sequence
number is the backend's partition value `publish`. The index of what waits
(`KeyedStateBackend.derived`) is rebuilt from the values when a task lands in
another worker.
"""

from __future__ import annotations

import struct

from sortedcontainers import SortedDict

from beam_streams_runner.driver.plan import StagePlan
from beam_streams_runner.records import MAX_WATERMARK, Record, decode_with_raw
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.worker.runtime import WorkerRuntime

STAGED = 'staged'  # the namespace of a staged chunk's value (its key: the seq)
PUBLISH = 'publish'  # the partition value: the next seq
_SEQ = struct.Struct('>Q')


class PublishGate:
    """The staged input of one partition of a publishing stage (see the module docstring)."""

    def __init__(self, runtime: WorkerRuntime, stage: StagePlan, state: KeyedStateBackend,
                 epoch: int, published_through: int) -> None:
        self._runtime = runtime
        self._stage = stage
        self._state = state
        self._epoch = epoch
        self._published_through = published_through
        self._inputs = sorted(stage.inputs)
        self._next_seq = state.get_meta(PUBLISH, 0)
        # seq -> (epoch staged, earliest timestamp) of every chunk waiting.
        self._waiting: SortedDict = state.derived('publish_gate', self._rebuild)

    def stage(self, records: list[Record]) -> None:
        """Keeps the epoch's `records` until a consistent cut covers them."""
        for input_id, chunk in records:
            if not chunk:
                continue
            coder = self._runtime.coder_impl(self._stage.input_coders[input_id])
            earliest = min(value.timestamp.micros for value, _ in decode_with_raw(coder, chunk))
            seq = self._next_seq
            self._next_seq += 1
            self._state.put(_SEQ.pack(seq), STAGED, (
                self._inputs.index(input_id), bytes(chunk), earliest, self._epoch))
            self._waiting[seq] = (self._epoch, earliest)
        self._state.put_meta(PUBLISH, self._next_seq)

    def release(self) -> list[tuple[int, Record]]:
        """The staged records a consistent cut now covers, in arrival order, each with the
        epoch it was staged in (its fence); they leave the state."""
        released = []
        for seq, (epoch, _) in list(self._waiting.items()):
            if epoch > self._published_through:
                break  # staged in epoch order: nothing later is covered either
            key = _SEQ.pack(seq)
            index, chunk, _, _ = self._state.get(key, STAGED)
            released.append((epoch, (self._inputs[index], chunk)))
            self._state.delete_key(key)
            del self._waiting[seq]
        return released

    def hold(self) -> int:
        """The output watermark what waits allows."""
        return min((earliest for _, earliest in self._waiting.values()), default=MAX_WATERMARK)

    def waiting(self) -> int:
        """How many chunks wait for a cut."""
        return len(self._waiting)

    def _rebuild(self, state: KeyedStateBackend) -> SortedDict:
        waiting = SortedDict()
        for key in state.keys():
            _, _, earliest, epoch = state.get(key, STAGED)
            waiting[_SEQ.unpack(key)[0]] = (epoch, earliest)
        return waiting
