"""The side inputs of a streaming run, kept by the driver (design sections 5, 6, 12).

Each epoch, every side buffer a stage reads is collected by a Spark job of its
own (once per epoch, before its readers run): its data is added to what came
before and its watermark taken from its producers' punctuations. Each reading
stage gets a broadcast of the Beam state-API layout of everything seen so far,
rebuilt only when a buffer it reads grew. As a consistent-region member, a cut
records the buffers produced by the region's stages; a reset puts them back (and
drops the broadcasts built from the discarded data).
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import Any

from pyspark import SparkContext
from pyspark.broadcast import Broadcast
from pyspark.rdd import RDD

from beam_streams_runner.driver.plan import PipelinePlan, StagePlan
from beam_streams_runner.records import MAX_WATERMARK, Punctuation
from beam_streams_runner.regions.hooks import MemberBase
from beam_streams_runner.translators.side_inputs import side_input_state
from beam_streams_runner.worker.epoch_info import SideInputsView


class SideInputBuffers(MemberBase):
    """Everything each side buffer produced so far, its watermark, and the broadcasts."""

    name = 'side_inputs'

    def __init__(self, sc: SparkContext, plan: PipelinePlan) -> None:
        self._sc = sc
        self._plan = plan
        self._chunks: dict[bytes, list[bytes]] = {}
        self._watermarks: dict[bytes, int] = {}
        self._states: dict[str, Broadcast] = {}

    def view(self, stage: StagePlan, epoch: int, collected: dict[bytes, bool],
             buffer: Callable[[bytes], RDD]) -> SideInputsView:
        """This epoch's side inputs of `stage`; `collected` (per epoch) notes the buffers
        collected so far and whether they brought data."""
        changed = False
        for buffer_id, _ in stage.side_inputs.values():
            if buffer_id not in collected:
                name = buffer_id.decode('utf-8', 'replace')
                self._sc.setJobDescription(f'Beam streaming epoch {epoch}: side input {name}')
                records = buffer(buffer_id).values().collect()
                data = [r for r in records if not isinstance(r, Punctuation)]
                self._chunks.setdefault(buffer_id, []).extend(data)
                self._watermarks[buffer_id] = min(
                    (r.watermark for r in records if isinstance(r, Punctuation)),
                    default=MAX_WATERMARK)
                collected[buffer_id] = bool(data)
            changed = changed or collected[buffer_id]
        state_bc = self._states.get(stage.name)
        if state_bc is None or changed:
            if state_bc is not None:
                state_bc.destroy()
            state_bc = self._sc.broadcast(side_input_state(self._plan, stage, self._chunks))
            self._states[stage.name] = state_bc
        return SideInputsView(state_bc, {
            side_input: self._watermarks[buffer_id]
            for side_input, (buffer_id, _) in stage.side_inputs.items()})

    def close(self) -> None:
        for broadcast in self._states.values():
            broadcast.destroy()
        self._states.clear()

    # Hooks ---------------------------------------------------------------------------
    def _buffers_of(self, stages: Set[str]) -> list[bytes]:
        return [b for b in {*self._chunks, *self._watermarks}
                if any(p.name in stages for p in self._plan.producers(b))]

    def checkpoint(self, sequence_id: int, stages: Set[str]) -> dict[str, Any]:
        buffers = self._buffers_of(stages)
        return {'chunks': {b: list(self._chunks.get(b, ())) for b in buffers},
                'watermarks': {b: self._watermarks[b] for b in buffers
                               if b in self._watermarks}}

    def reset(self, sequence_id: int, stages: Set[str], part: dict[str, Any] | None) -> None:
        self.reset_to_initial_state(stages)
        if part:
            self._chunks.update({b: list(c) for b, c in part['chunks'].items()})
            self._watermarks.update(part['watermarks'])

    def reset_to_initial_state(self, stages: Set[str]) -> None:
        for buffer_id in self._buffers_of(stages):
            self._chunks.pop(buffer_id, None)
            self._watermarks.pop(buffer_id, None)
        # Rebuilt from the restored buffers when next read.
        self.close()
