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
8) in chunks: the pairs one gate pushes back for the same side windows, main
input and user key go into one `PushedBackChunk` (their encoded elements one
after the other, with their seqs and ends), one value keyed by its first pair's
gate sequence number `seq` (8 big-endian bytes, monotonic). The Pending States
Graph holds one element per chunk, at the chunk's earliest timestamp; a release
reads the chunks back and gives their pairs in seq order. The side watermarks,
gated inputs, next seq and the number of pushed-back pairs are the backend's
partition value `gate`. The graph is an index over those values
(`KeyedStateBackend.derived`): kept while the backend lives in a worker,
rebuilt from the chunks, in seq order, when a task lands in another worker, so
releases, holds, pinned keys and sizes are as before. A gate is built every
epoch, so a chunk holds one epoch's pairs and is written once; a chunk pushed
back and released within one epoch is never written. One value per pair made
every epoch cost the whole backlog instead: NEXMark Q7 (every bid of a 10-s
window waits for the window's maximum) spent half its worker time with 1-s
checkpoints indexing and re-adding 100k pairs whenever a task landed in another
Python worker; the whole graph as one value, before that, pickled and unpickled
the backlog every epoch.
"""

from __future__ import annotations

import array
import collections
import heapq
import itertools
import struct
from collections.abc import Iterator, Mapping

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
CHUNK = 'chunk'  # the namespace of a pushed-back chunk's value (its key: its first seq)
GATE = 'gate'  # the partition value: side watermarks, gated inputs, next seq, pairs
_SEQ = struct.Struct('>Q')


class CorruptGateStateError(StreamsSparkRunnerError):
    """A side-input gate's checkpointed state does not fit the gate restoring it."""


class PushedBackChunk:
    """Pairs pushed back for the same side windows, main input and user key, in seq
    order: their encoded elements back to back, each one's seq and end offset."""

    __slots__ = ('data', 'ends', 'input_index', 'key', 'min_timestamp', 'requests', 'seqs')

    def __init__(self, input_index: int, key: bytes | None, requests: tuple,
                 timestamp: int) -> None:
        self.input_index = input_index
        self.key = key
        self.requests = requests  # per side input in sorted order: (side window, max ts)
        self.min_timestamp = timestamp
        self.seqs = array.array('Q')
        self.ends = array.array('Q')
        self.data = bytearray()

    def append(self, seq: int, encoded: bytes, timestamp: int) -> None:
        self.seqs.append(seq)
        self.data += encoded
        self.ends.append(len(self.data))
        self.min_timestamp = min(self.min_timestamp, timestamp)

    def __len__(self) -> int:
        return len(self.seqs)

    def pairs(self) -> Iterator[tuple[int, bytes]]:
        """(seq, encoded element) of each pair."""
        start = 0
        for seq, end in zip(self.seqs, self.ends, strict=True):
            yield seq, bytes(self.data[start:end])
            start = end


def in_arrival_order(chunks: list[PushedBackChunk]) -> bytes:
    """The encoded elements of `chunks` in seq order (back to back when their seq ranges
    follow each other, as one side window's chunks of successive epochs do)."""
    if all(before.seqs[-1] < after.seqs[0] for before, after in itertools.pairwise(chunks)):
        return b''.join(chunk.data for chunk in chunks)
    return b''.join(encoded for _, encoded in heapq.merge(*(c.pairs() for c in chunks)))


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
        _, _, self._next_seq, self._pairs = state.get_meta(GATE, ((), (), 0, 0))
        self.graph: PendingStatesGraph = state.derived('pending_states_graph', self._rebuild)
        # The chunks this gate filled, by what their pairs wait for, with their graph ids.
        self._open: dict[tuple, tuple[PushedBackChunk, int, bytes]] = {}
        self._requests: dict = {}  # main window -> its side windows, per side input

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
        input_index = self._input_index[input_id]
        runnable = create_OutputStream()
        pushed_back = self._pairs
        readiness: dict[tuple, bool] = {}  # side windows -> ready (fixed within a call)
        for value, raw in decode_with_raw(coder, chunk):
            # A stateful ParDo's key keeps its state while it has pushed-back elements.
            key = key_coder.encode_nested(value.value[0]) if key_coder is not None else None
            windows = value.windows
            timestamp = value.timestamp.micros
            for window in windows:
                single = raw if len(windows) == 1 else coder.encode_nested(
                    WindowedValue(value.value, value.timestamp, (window,), value.pane_info))
                requests = self._requests.get(window) or self._map(window)
                opened = self._open.get((input_index, key, requests))
                if opened is None:
                    ready = readiness.get(requests)
                    if ready is None:
                        ready = readiness[requests] = self._ready(requests)
                    if ready:
                        runnable.write(single)
                        continue
                    opened = self._open_chunk(input_index, key, requests, timestamp)
                target, element_id, name = opened
                if timestamp < target.min_timestamp:
                    self.graph.lower_hold(element_id, timestamp)
                target.append(self._next_seq, single, timestamp)
                # In place: a gate kept over more than one commit must write it again.
                self._state.mark_changed(name)
                self._next_seq += 1
                self._pairs += 1
        if self._pairs != pushed_back:
            self._save_meta()
        return runnable.get()

    def _map(self, window) -> tuple:
        """The side window (encoded) and its max timestamp, per side input, for `window`."""
        requests = self._requests[window] = tuple(
            (coder_impl.encode(side_window), side_window.max_timestamp().micros)
            for mapping_fn, coder_impl in self._sides.values()
            for side_window in (mapping_fn(window),))
        return requests

    def _ready(self, requests: tuple) -> bool:
        return all(self.graph.is_ready(side, side_window, max_timestamp) for side, (
            side_window, max_timestamp) in zip(self._side_ids, requests, strict=True))

    def _open_chunk(self, input_index: int, key: bytes | None, requests: tuple,
                    timestamp: int) -> tuple[PushedBackChunk, int, bytes]:
        """A new chunk for pairs waiting for `requests`, in the graph and the state."""
        name = _SEQ.pack(self._next_seq)
        chunk = PushedBackChunk(input_index, key, requests, timestamp)
        self._push_back(self.graph, chunk, self._next_seq)
        self._state.put(name, CHUNK, chunk)
        opened = self._open[(input_index, key, requests)] = (
            chunk, self.graph.last_pushed_back, name)
        return opened

    def _push_back(self, graph: PendingStatesGraph, chunk: PushedBackChunk, seq: int) -> None:
        if graph.add_element(seq, chunk.min_timestamp, chunk.key, {None: [
                (side, side_window, max_timestamp) for side, (side_window, max_timestamp)
                in zip(self._side_ids, chunk.requests, strict=True)]}):
            raise CorruptGateStateError(
                f'Pushed-back chunk {seq} of the side-input gate state is runnable under '
                'the side watermarks saved with it: the checkpoint is corrupt.')

    # Side watermarks (Algorithm 2) ------------------------------------------------------
    def on_side_watermarks(self, watermarks: Mapping[SideInputId, int]) -> list[Record]:
        """The pushed-back elements the new side watermarks release, as stage input."""
        released: dict[int, list[PushedBackChunk]] = collections.defaultdict(list)
        moved = False
        for side, watermark in watermarks.items():
            moved = moved or watermark > self.graph.side_watermark(side)
            for seq, _ in self.graph.on_side_watermark(side, watermark):
                name = _SEQ.pack(seq)
                chunk = self._state.get(name, CHUNK)
                released[chunk.input_index].append(chunk)
                self._pairs -= len(chunk)
                self._state.delete_key(name)
        if released:
            self._open.clear()  # a released chunk takes no more pairs
        if moved:
            self._save_meta()
        return [(self._input_ids[index], in_arrival_order(sorted(
                    chunks, key=lambda chunk: chunk.seqs[0])))
                for index, chunks in sorted(released.items())]

    def hold(self) -> int:
        """The output watermark the pushed-back elements allow."""
        hold = self.graph.min_hold()
        return MAX_WATERMARK if hold is None else hold

    def pins(self, key: bytes) -> bool:
        """Whether the user key `key` has pushed-back elements (its state must stay)."""
        return self.graph.has_pending(key)

    def sizes(self) -> dict[str, int]:
        """Pushed-back (element, main window) pairs and the side windows they wait for."""
        return {'elements': self._pairs,
                'side_windows': self.graph.sizes()['side_windows']}

    # State in the keyed-state backend (see the module docstring) -----------------------
    def _save_meta(self) -> None:
        self._state.put_meta(GATE, (
            tuple((side, self.graph.side_watermark(side)) for side in self._side_ids),
            tuple(self._input_ids), self._next_seq, self._pairs))

    def _rebuild(self, state: KeyedStateBackend) -> PendingStatesGraph:
        """The graph of the chunks `state` holds, added again in seq order under the side
        watermarks saved with them."""
        graph = PendingStatesGraph(self._sides)
        names = sorted(state.keys())  # seq order
        saved = state.get_meta(GATE)
        if saved is None:
            if names:
                raise CorruptGateStateError(
                    f'The side-input gate state has {len(names)} chunks of pushed-back '
                    'elements but no side watermarks: the checkpoint is corrupt.')
            return graph
        watermarks, input_ids, _, _ = saved
        sides = [side for side, _ in watermarks]
        if sides != self._side_ids or list(input_ids) != self._input_ids:
            raise CorruptGateStateError(
                f'The side-input gate state is for side inputs {sides} and main inputs '
                f'{list(input_ids)}, but the stage reads side inputs {self._side_ids} and '
                f'main inputs {self._input_ids}.')
        for side, watermark in watermarks:
            graph.on_side_watermark(side, watermark)  # an empty graph releases nothing
        for name in names:
            self._push_back(graph, state.get(name, CHUNK), _SEQ.unpack(name)[0])
        return graph
