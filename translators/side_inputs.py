"""Side-input views: a PCollection materialized once and broadcast to its readers.

Design section 5 (batch): the side input's PCollection is computed by an earlier
Spark job, collected on the driver as encoded chunks and laid out the way the
SDK harness asks for it over Beam's state protocol (iterable views keyed by
window; multimap views keyed by window and key, plus their key lists), using
Beam's own layout code (`FnApiRunnerExecutionContext.commit_side_inputs_to_state`).
The result, a map from encoded `StateKey` to encoded values, is a Spark
broadcast variable read by `PartitionStateHandler` in every task of the
consuming stage. Every view kind (singleton, iterable, list, dict, multimap) is
one of these two access patterns; window mapping is done by the harness.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner.execution import ListBuffer
from apache_beam.runners.portability.fn_api_runner.worker_handlers import StateServicer

from beam_streams_runner.driver.plan import PipelinePlan, StagePlan


class _RecordingStateServicer(StateServicer):
    """Keeps what Beam's side-input layout code writes, per encoded StateKey."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[bytes, list[bytes]] = collections.defaultdict(list)

    def append_raw(self, state_key, data):
        self.entries[state_key.SerializeToString()].append(data)
        return super().append_raw(state_key, data)


def side_input_state(
    plan: PipelinePlan,
    stage: StagePlan,
    chunks_by_buffer: Mapping[bytes, list[bytes]],
) -> dict[bytes, bytes]:
    """The state-API view of every side input `stage` reads."""
    context = plan.execution_context
    manager = context.worker_handler_manager
    recorder = _RecordingStateServicer()
    original = manager.state_servicer
    manager.state_servicer = recorder
    try:
        for side_input_id, (buffer_id, access_pattern) in stage.side_inputs.items():
            buffer = ListBuffer(coder_impl=None)
            for chunk in chunks_by_buffer.get(buffer_id, ()):
                buffer.append(chunk)
            context.pcoll_buffers[buffer_id] = buffer
            context.commit_side_inputs_to_state({
                side_input_id: (
                    buffer_id,
                    beam_runner_api_pb2.FunctionSpec.FromString(access_pattern)),
            })
            del context.pcoll_buffers[buffer_id]
    finally:
        manager.state_servicer = original
    return {key: b''.join(parts) for key, parts in recorder.entries.items()}
