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

Its state lives in the partition's keyed-state backend (design sections 7 and
8), one value per pushed-back (element, main window) pair: the key is the pair's
gate sequence number `seq` (8 big-endian bytes, monotonic), the value what adding
it again needs (main input, encoded element, timestamp, user key, and per side
input in sorted order its side window and that window's max timestamp). The
side watermarks, gated inputs and next seq are the backend's partition value
`gate`. The graph is an index over those values (`KeyedStateBackend.derived`):
kept while the backend lives in a worker, rebuilt from the values, in seq order,
when a task lands in another worker, so releases, holds, pinned keys and sizes
are as before. A pair pushed back and released within one epoch is never
written. Persisting the whole graph as one value instead made every epoch cost
the whole backlog: NEXMark Q7 streaming at 100k events had 86k pushed-back
elements after 12 epochs, each commit pickled all of them (2.3 s) and each task
landing in another Python worker unpickled all of them (1.2 s).
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Mapping

from apache_beam import pvalue
from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.runners.portability.fn_api_runner.translations import PAR_DO_URNS
from apache_beam.runners.worker import bundle_processor
from apache_beam.utils import proto_utils
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.driver.plan import StagePlan
from beam_streams_runner.errors import StreamsSparkRunnerError, UnsupportedFeatureError
from beam_streams_runner.records import MAX_WATERMARK, Record, decode_with_raw
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.state.pending_states_graph import PendingStatesGraph
from beam_streams_runner.translators.stateless_chain import descriptor_steps, main_input
from beam_streams_runner.worker.runtime import WorkerRuntime

SideInputId = tuple[str, str]  # (ParDo transform id, side input tag)
PAIR = 'pair'  # the namespace of a pushed-back pair's value (its key: the seq)
GATE = 'gate'  # the partition value: side watermarks, gated inputs, next seq
_SEQ = struct.Struct('>Q')


class CorruptGateStateError(StreamsSparkRunnerError):
    """A side-input gate's checkpointed state does not fit the gate restoring it."""


class SideInputGate:
    """The pushed-back main-input elements of one partition of a streaming stage."""

    def __init__(self, runtime: WorkerRuntime, stage: StagePlan,
                 state: KeyedStateBackend) -> None:
        self._runtime = runtime
        self._stage = stage
        self._state = state
        self._sides: dict[SideInputId, tuple] = {}  # -> (window mapping fn, window coder)
        self.gated_inputs = self._find_sides()
        # Side inputs in sorted order, which every process agrees on: a persisted pair
        # holds its side windows in that order, its main input as an index.
        self._sides = dict(sorted(self._sides.items()))
        self._side_ids = list(self._sides)
        self._input_ids = sorted(self.gated_inputs)
        self._input_index = {input_id: i for i, input_id in enumerate(self._input_ids)}
        self._next_seq = state.get_meta(GATE, ((), (), 0))[2]
        self.graph: PendingStatesGraph = state.derived('pending_states_graph', self._rebuild)

    def _find_sides(self) -> set[str]:
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(self._stage.descriptor)
        context = pipeline_context.PipelineContext(descriptor)
        main_inputs: dict[str, str] = {}  # main-input PCollection -> reading ParDo
        for transform_id, transform in descriptor_steps(descriptor):
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
                main_inputs[main_input(transform)] = transform.unique_name
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
                requests = [
                    (side, coder_impl.encode(side_window), side_window.max_timestamp().micros)
                    for side, (mapping_fn, coder_impl) in self._sides.items()
                    for side_window in (mapping_fn(window),)]
                seq = self._next_seq
                # The single-window payload carries the main window: the graph's
                # main-window label is unused, None here as after a restore.
                if self.graph.add_element((input_id, single, seq), value.timestamp.micros,
                                          key, {None: requests}):
                    runnable.write(single)
                else:
                    self._next_seq += 1
                    self._state.put(_SEQ.pack(seq), PAIR, (
                        self._input_index[input_id], single, value.timestamp.micros, key,
                        *(part for _, side_window, max_timestamp in requests
                          for part in (side_window, max_timestamp))))
                    self._save_meta()
        return runnable.get()

    # Side watermarks (Algorithm 2) ------------------------------------------------------
    def on_side_watermarks(self, watermarks: Mapping[SideInputId, int]) -> list[Record]:
        """The pushed-back elements the new side watermarks release, as stage input."""
        released: dict[str, list[bytes]] = collections.defaultdict(list)
        moved = False
        for side, watermark in watermarks.items():
            moved = moved or watermark > self.graph.side_watermark(side)
            for (input_id, encoded, seq), _ in self.graph.on_side_watermark(side, watermark):
                released[input_id].append(encoded)
                self._state.delete_key(_SEQ.pack(seq))
        if moved:
            self._save_meta()
        return [(input_id, b''.join(parts)) for input_id, parts in released.items()]

    def hold(self) -> int:
        """The output watermark the pushed-back elements allow."""
        hold = self.graph.min_hold()
        return MAX_WATERMARK if hold is None else hold

    def pins(self, key: bytes) -> bool:
        """Whether the user key `key` has pushed-back elements (its state must stay)."""
        return self.graph.has_pending(key)

    def sizes(self) -> dict[str, int]:
        return self.graph.sizes()

    # State in the keyed-state backend (see the module docstring) -----------------------
    def _save_meta(self) -> None:
        self._state.put_meta(GATE, (
            tuple((side, self.graph.side_watermark(side)) for side in self._side_ids),
            tuple(self._input_ids), self._next_seq))

    def _rebuild(self, state: KeyedStateBackend) -> PendingStatesGraph:
        """The graph of the pairs `state` holds, added again in seq order under the side
        watermarks saved with them."""
        graph = PendingStatesGraph(self._sides)
        pairs = sorted(state.keys())  # seq order
        saved = state.get_meta(GATE)
        if saved is None:
            if pairs:
                raise CorruptGateStateError(
                    f'The side-input gate state has {len(pairs)} pushed-back elements '
                    'but no side watermarks: the checkpoint is corrupt.')
            return graph
        watermarks, input_ids, _ = saved
        sides = [side for side, _ in watermarks]
        if sides != self._side_ids or list(input_ids) != self._input_ids:
            raise CorruptGateStateError(
                f'The side-input gate state is for side inputs {sides} and main inputs '
                f'{list(input_ids)}, but the stage reads side inputs {self._side_ids} and '
                f'main inputs {self._input_ids}.')
        for side, watermark in watermarks:
            graph.on_side_watermark(side, watermark)  # an empty graph releases nothing
        side_ids = self._side_ids
        for name in pairs:
            seq = _SEQ.unpack(name)[0]
            value = state.get(name, PAIR)
            if graph.add_element(
                    (input_ids[value[0]], value[1], seq), value[2], value[3],
                    {None: list(zip(side_ids, value[4::2], value[5::2], strict=True))}):
                raise CorruptGateStateError(
                    f'Pushed-back element {seq} of the side-input gate state is runnable '
                    'under the side watermarks saved with it: the checkpoint is corrupt.')
        return graph
