"""Streaming side inputs: main-input elements wait for their side-input windows.

Design section 6 (Li et al., PVLDB 11(12) 2018, section 4.2). In streaming a
side input is itself a stream whose windows fill over time. A ParDo reading
side inputs starts its own stage (`plan.annotate_side_input_consumers_as_roots`),
so its main-input elements cross the stage boundary, where this gate checks
each (element, main window) against the partition's `PendingStatesGraph`: the
side window each side input maps the main window to (Beam's own
`WindowMappingFn` of the side input) must be ready, else the pair is pushed
back; side-watermark advances release exactly the pairs that became runnable,
in arrival order. Pushed-back elements hold the stage's output watermark.

A side window is ready when the side input's watermark has passed its end, as
on Beam's Python DirectRunner (`_SideInputsContainer`): the view a DoFn reads is
then complete for that window (an empty window reads the view's default, which
the SDK harness supplies). This is what makes file sinks correct in streaming:
their finalize step reads all the written shards through a global-window side
input, which is ready only once the written shards are complete.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from apache_beam import pvalue
from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.internal import pickler
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.runners.portability.fn_api_runner.translations import PAR_DO_URNS
from apache_beam.runners.worker import bundle_processor
from apache_beam.utils import proto_utils
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.errors import UnsupportedFeatureError
from beam_streams_runner.operators import MAX_WATERMARK
from beam_streams_runner.plan import StagePlan
from beam_streams_runner.records import Record, decode_with_raw
from beam_streams_runner.state.pending_states_graph import PendingStatesGraph
from beam_streams_runner.worker_runtime import WorkerRuntime

SideInputId = tuple[str, str]  # (ParDo transform id, side input tag)
_STATE_KEY = b'psg'


class SideInputGate:
    """The pushed-back main-input elements of one partition of a streaming stage."""

    def __init__(self, runtime: WorkerRuntime, stage: StagePlan) -> None:
        self._runtime = runtime
        self._stage = stage
        self._sides: dict[SideInputId, tuple] = {}  # -> (window mapping fn, window coder)
        self.gated_inputs = self._find_sides()
        self.graph = PendingStatesGraph(self._sides)
        self._dirty = False

    def _find_sides(self) -> set[str]:
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(self._stage.descriptor)
        context = pipeline_context.PipelineContext(descriptor)
        main_inputs: dict[str, str] = {}  # main-input PCollection -> reading ParDo
        for transform_id, transform in descriptor.transforms.items():
            if transform.spec.urn not in PAR_DO_URNS:
                continue
            payload = proto_utils.parse_Bytes(
                transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
            for tag, spec in payload.side_inputs.items():
                side_pcoll = descriptor.pcollections[transform.inputs[tag]]
                window_fn = context.windowing_strategies.get_by_id(
                    side_pcoll.windowing_strategy_id).windowfn
                self._sides[(transform_id, tag)] = (
                    pvalue.SideInputData.from_runner_api(spec, context).window_mapping_fn,
                    window_fn.get_window_coder().get_impl())
            if payload.side_inputs:
                for tag, pcoll in transform.inputs.items():
                    if tag not in payload.side_inputs:
                        main_inputs[pcoll] = transform.unique_name
        fed = {pcoll: transform_id
               for transform_id, transform in descriptor.transforms.items()
               if transform.spec.urn == bundle_processor.DATA_INPUT_URN
               for pcoll in transform.outputs.values()}
        missing = sorted(name for pcoll, name in main_inputs.items() if pcoll not in fed)
        if missing:
            raise UnsupportedFeatureError(
                f'Steps {missing} read side inputs in streaming, but their main input is '
                'produced inside the same fused stage, where it cannot wait for the side '
                'inputs. Please report this pipeline shape.')
        return {fed[pcoll] for pcoll in main_inputs}

    # Main-input elements (Algorithm 1) ----------------------------------------------
    def admit(self, input_id: str, chunk: bytes) -> bytes:
        """The elements of `chunk` that may run now; the others are pushed back."""
        if input_id not in self.gated_inputs:
            return chunk
        if not self.graph and all(self.graph.side_watermark(side) >= MAX_WATERMARK
                                  for side in self._sides):
            return chunk  # every side input is complete: nothing can wait
        coder = self._runtime.coder_impl(self._stage.input_coders[input_id])
        key_coder_id = self._stage.key_coders.get(input_id)
        key_coder = self._runtime.coder_impl(key_coder_id) if key_coder_id else None
        runnable = create_OutputStream()
        for value, raw in decode_with_raw(coder, chunk):
            # A stateful ParDo's key keeps its state while it has pushed-back elements.
            key = key_coder.encode_nested(value.value[0]) if key_coder is not None else None
            windows = value.windows
            for window in windows:
                single = raw if len(windows) == 1 else coder.encode_nested(
                    WindowedValue(value.value, value.timestamp, (window,), value.pane_info))
                requests = {window: [
                    (side, coder_impl.encode(side_window), side_window.max_timestamp().micros)
                    for side, (mapping_fn, coder_impl) in self._sides.items()
                    for side_window in (mapping_fn(window),)]}
                if self.graph.add_element((input_id, single), value.timestamp.micros, key,
                                          requests):
                    runnable.write(single)
                else:
                    self._dirty = True
        return runnable.get()

    # Side watermarks (Algorithm 2) ------------------------------------------------------
    def on_side_watermarks(self, watermarks: Mapping[SideInputId, int]) -> list[Record]:
        """The pushed-back elements the new side watermarks release, as stage input."""
        released: dict[str, list[bytes]] = collections.defaultdict(list)
        for side, watermark in watermarks.items():
            if watermark > self.graph.side_watermark(side):
                self._dirty = True
            for (input_id, encoded), _ in self.graph.on_side_watermark(side, watermark):
                released[input_id].append(encoded)
        return [(input_id, b''.join(parts)) for input_id, parts in released.items()]

    def hold(self) -> int:
        """The output watermark the pushed-back elements allow."""
        hold = self.graph.min_hold()
        return MAX_WATERMARK if hold is None else hold

    # Versioned state (design section 8): the graph is one value ---------------------------
    def state_delta(self) -> tuple[dict[bytes, bytes], set[bytes]]:
        if not self._dirty:
            return {}, set()
        self._dirty = False
        return {_STATE_KEY: pickler.dumps(self.graph, enable_trace=False)}, set()

    def restore_state(self, state: Mapping[bytes, bytes]) -> None:
        if _STATE_KEY in state:
            self.graph = pickler.loads(state[_STATE_KEY], enable_trace=False)
