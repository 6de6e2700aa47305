"""The side-input gate's versioned state: pushed-back pairs in chunks (no Spark).

Design section 8. The gate keeps the (element, main window) pairs it pushes back
for the same side windows, main input and user key in one `PushedBackChunk`, a
value of its `KeyedStateBackend` (key: the chunk's first seq, namespace `CHUNK`),
and its side watermarks, main inputs, next seq and pair count as the backend's
meta `GATE`; so the backend's `take_delta` writes the chunks filled since the
last call under b'k' + seq, deletes the persisted chunks released since, and
writes the small b'm' value (the partition's meta). A gate built over a restored
backend rebuilds its Pending States Graph from those values
(`KeyedStateBackend.derived`).
Checked here, on the gate of a real stage (two side inputs with other windows
than the main input's sliding windows, so one element is several pairs),
stateless and stateful (keys pin their state while pushed back):

* a delta holds the chunks an epoch pushed back or released, not all, one per
  side windows and key;
* a gate over a backend restored from the deltas every epoch (also through
  `PartitionStateCache` with two workers) admits and releases the same
  elements in the same order as one live gate, with the same holds, pinned keys
  and sizes, and its backend hands out the same deltas (hypothesis);
* a checkpoint that does not fit the gate is reported, not silently rebuilt.
"""

from __future__ import annotations

import random

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate, window
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.state.versioned_state import Revision
from beam_streams_runner.stores import LocalDirectoryStore
from beam_streams_runner.translators.side_input_gate import (
    CHUNK,
    GATE,
    CorruptGateStateError,
    SideInputGate,
)
from beam_streams_runner.worker import partition_cache
from beam_streams_runner.worker.partition_cache import PartitionStateCache

MAIN_WINDOWS = window.SlidingWindows(10, 5)
KEYS = 'abcd'


class _Stateful(beam.DoFn):
    SEEN = userstate.BagStateSpec('seen', coders.VarIntCoder())

    def process(self, kv, a, b, seen=beam.DoFn.StateParam(SEEN)):
        seen.add(kv[1])
        yield kv


class GateStage:
    """Builds gates of one stage and encodes main-input elements for them."""

    def __init__(self, runtime, stage) -> None:
        self.runtime = runtime
        self.stage = stage
        self.input_id, = SideInputGate(runtime, stage, KeyedStateBackend()).gated_inputs
        self.coder = runtime.coder_impl(stage.input_coders[self.input_id])
        self.sides = sorted(stage.side_inputs)  # side A: FixedWindows(5), B: FixedWindows(20)

    def make(self, state: KeyedStateBackend) -> SideInputGate:
        return SideInputGate(self.runtime, self.stage, state)

    def encode(self, elements) -> bytes:
        """(key, value, timestamp in seconds) -> one chunk of the main input."""
        return b''.join(
            self.coder.encode_nested(WindowedValue(
                (key, value), Timestamp(t),
                tuple(MAIN_WINDOWS.assign(TimestampedValue(None, t)))))
            for key, value, t in elements)

    def decode(self, chunk: bytes) -> list:
        return [(v.value, v.timestamp.micros, tuple(v.windows))
                for v in self.coder.decode_all(chunk)]


@pytest.fixture(scope='module', params=['stateless', 'stateful'])
def gate_stage(request, streaming_stage):
    p = beam.Pipeline(options=PipelineOptions(['--streaming']))
    source = (p | beam.Impulse()
              | beam.Map(lambda _: ('a', 0)).with_output_types(tuple[str, int]))
    side_a = (source | 'A' >> beam.WindowInto(window.FixedWindows(5)) | beam.Values()
              | beam.CombineGlobally(sum).without_defaults())
    side_b = source | 'B' >> beam.WindowInto(window.FixedWindows(20))
    main = source | 'Main' >> beam.WindowInto(MAIN_WINDOWS)
    sides = {'a': beam.pvalue.AsSingleton(side_a), 'b': beam.pvalue.AsList(side_b)}
    if request.param == 'stateful':
        _ = main | beam.ParDo(_Stateful(), **sides)
    else:
        _ = main | beam.Map(lambda kv, a, b: kv, **sides)
    runtime, stage = streaming_stage(p, lambda s: s.side_inputs)
    assert bool(stage.key_coders) == (request.param == 'stateful')
    return GateStage(runtime, stage)


def seconds(t: float) -> int:
    return Timestamp(t).micros


def apply_delta(state: dict[bytes, bytes], delta: tuple[dict, set]) -> None:
    dirty, deleted = delta
    assert not dirty.keys() & deleted
    state.update(dirty)
    for key in deleted:
        del state[key]  # only persisted pairs are deleted


def run_epoch(gs: GateStage, gate: SideInputGate, epoch) -> tuple:
    """One epoch as `partition_epoch.PartitionEpoch.feed` drives the gate: side
    watermarks first, then the main-input chunks. Returns everything the gate shows."""
    watermarks, chunks = epoch
    released = gate.on_side_watermarks(dict(zip(gs.sides, watermarks, strict=True)))
    released = [(input_id, gs.decode(chunk)) for input_id, chunk in released]
    admitted = [gs.decode(gate.admit(gs.input_id, gs.encode(chunk))) for chunk in chunks]
    key_coder = gs.stage.key_coders.get(gs.input_id)
    keys = ([gs.runtime.coder_impl(key_coder).encode_nested(key) for key in KEYS]
            if key_coder else [None])
    return (released, admitted, gate.hold(), gate.sizes(),
            [gate.pins(key) for key in keys])


def restored(state: dict[bytes, bytes]) -> KeyedStateBackend:
    """A fresh backend restored from `state` (a task in another worker)."""
    backend = KeyedStateBackend(track_changes=True)
    backend.restore(dict(state))
    return backend


def replay(gs: GateStage, epochs, releases: list | None = None) -> list[dict[bytes, bytes]]:
    """Runs `epochs` through gates over one live backend (a new gate each epoch, as a
    task that hits the cache builds it) and, each epoch, through a gate over a fresh
    backend restored from the deltas so far; both must agree. Returns the state per
    epoch; adds each epoch's released elements to `releases`."""
    live = restored({})
    state: dict[bytes, bytes] = {}
    states = []
    for number, epoch in enumerate(epochs):
        backend = restored(state)
        fresh, gate = gs.make(backend), gs.make(live)
        assert fresh.sizes() == gate.sizes(), f'epoch {number}'
        assert fresh.hold() == gate.hold(), f'epoch {number}'
        shown = run_epoch(gs, gate, epoch)
        assert run_epoch(gs, fresh, epoch) == shown, f'epoch {number}'
        if releases is not None:
            releases.append([element for _, elements in shown[0] for element in elements])
        delta = live.take_delta()
        assert backend.take_delta() == delta, f'epoch {number}'
        apply_delta(state, delta)
        states.append(dict(state))
    return states


def chunks(state: dict[bytes, bytes]) -> list:
    """The persisted chunks of `state` (b'k' + seq), in seq order."""
    return [restored({name: value}).get(name[1:], CHUNK)
            for name, value in sorted(state.items()) if name[:1] == b'k']


def pairs(state: dict[bytes, bytes]) -> int:
    return sum(len(chunk) for chunk in chunks(state))


def gate_meta(meta: bytes):
    """The gate's own partition value in the backend's b'm' (side watermarks, main
    inputs, next seq), or None."""
    return restored({b'm': meta}).get_meta(GATE)


def with_gate_meta(meta: bytes, value) -> bytes:
    """The backend's b'm' with the gate's partition value replaced by `value`."""
    backend = restored({b'm': meta})
    backend.put_meta(GATE, value)
    return backend.snapshot()[b'm']


# Delta sizes ------------------------------------------------------------------------

def test_a_delta_holds_what_the_epoch_pushed_back_and_released(gate_stage):
    gs = gate_stage
    keys = len(KEYS) if gs.stage.key_coders else 1  # a stateful ParDo's chunks are per key
    backend = restored({})
    gate = gs.make(backend)
    no_advance = [MIN_WATERMARK, MIN_WATERMARK]
    # Epoch 0: 500 elements in [0, 50) s, two main windows each: 1000 pairs, in one
    # chunk per main window [-5, 5) ... [45, 55) (each maps to other side windows).
    run_epoch(gs, gate, (no_advance, [[(KEYS[i % 4], i, i / 10) for i in range(500)]]))
    dirty, deleted = backend.take_delta()
    assert len(chunks(dirty)) == 11 * keys and len(dirty) == 11 * keys + 1 and not deleted
    assert pairs(dirty) == 1000 and gate_meta(dirty[b'm'])[2:] == (1000, 1000)
    assert all(list(chunk.seqs) == sorted(chunk.seqs) for chunk in chunks(dirty))
    state = dict(dirty)
    # Epoch 1: three more elements write six pairs in the chunks of their two main
    # windows and the next seq, nothing else.
    run_epoch(gs, gate, (no_advance, [[('a', 1, 60), ('b', 2, 61), ('c', 3, 62)]]))
    dirty, deleted = backend.take_delta()
    assert len(chunks(dirty)) == 2 * min(keys, 3) and pairs(dirty) == 6 and not deleted
    assert gate_meta(dirty[b'm'])[2:] == (1006, 1006)
    apply_delta(state, (dirty, deleted))
    # Epoch 2: nothing happened: no chunk is written, the partition value is unchanged.
    run_epoch(gs, gate, (no_advance, []))
    dirty, deleted = backend.take_delta()
    assert dirty == {b'm': state[b'm']} and not deleted
    # Epoch 3: side A's windows [0, 5) and [5, 10) and side B's [0, 20) are complete.
    # A main window maps to the side window holding its max timestamp, so the main
    # windows [-5, 5) and [0, 10) run: 50 + 100 pairs, their chunks deleted; b'm' has
    # the new side watermarks.
    released, *_ = run_epoch(gs, gate, ([seconds(10), seconds(20)], []))
    (_, elements), = released
    dirty, deleted = backend.take_delta()
    assert dirty.keys() == {b'm'}
    assert [w for _, w in gate_meta(dirty[b'm'])[0]] == [seconds(10), seconds(20)]
    assert len(elements) == 150 and len(deleted) == 2 * keys
    assert sorted(encoded for chunk in chunks({name: state[name] for name in deleted})
                  for _, encoded in chunk.pairs()) == sorted(
        gs.coder.encode_nested(WindowedValue(value, Timestamp(micros=t), windows))
        for value, t, windows in elements)
    values = [value for (_, value), _, _ in elements]
    assert values == sorted(values)  # in arrival order
    apply_delta(state, (dirty, deleted))
    assert pairs(state) == 1006 - len(elements) == gate_meta(state[b'm'])[3]
    # Epoch 4: pushed back and released within the epoch: neither written nor deleted.
    gate.admit(gs.input_id, gs.encode([('d', 4, 70)]))
    released = gate.on_side_watermarks({side: MAX_WATERMARK for side in gs.sides})
    dirty, deleted = backend.take_delta()
    assert dirty.keys() == {b'm'} and len(deleted) == len(chunks(state))
    apply_delta(state, (dirty, deleted))
    assert state.keys() == {b'm'}
    assert gate.hold() == MAX_WATERMARK and not gate.graph and gate.sizes()['elements'] == 0


def test_released_pairs_come_out_in_arrival_order_after_a_restore(gate_stage):
    gs = gate_stage
    elements = [(KEYS[i % 4], i, (i * 37) % 100 / 2) for i in range(300)]
    epochs = [([MIN_WATERMARK, MIN_WATERMARK], [elements[i:i + 50]])
              for i in range(0, 300, 50)]
    # Side B (20 s windows) then side A (5 s windows) advance in steps, so releases
    # need both, and some come from each side's advance.
    epochs += [([seconds(a), seconds(b)], [])
                for a, b in [(0, 20), (10, 20), (25, 20), (25, 40), (45, 60), (60, 60)]]
    epochs.append(([MAX_WATERMARK, MAX_WATERMARK], []))
    releases: list = []
    states = replay(gs, epochs, releases)
    assert pairs(states[5]) == 600
    assert states[-1].keys() == {b'm'}
    # Every pair comes out once, each epoch's in the order the elements arrived
    # (their values), though the chunks they were kept in interleave.
    assert sorted(value for released in releases for (_, value), _, _ in released) == sorted(
        2 * list(range(300)))
    for released in releases:
        values = [value for (_, value), _, _ in released]
        assert values == sorted(values)


@pytest.mark.parametrize('live_state', ['process', 'host'])
def test_restored_through_the_partition_cache_in_two_workers(gate_stage, tmp_path, monkeypatch,
                                                             live_state):
    """Each epoch loads the gate in one of two workers at random (its own live gate, or
    from the host's copy, or a catch-up from the store when each worker keeps its copies
    in its own memory), runs it and commits; it must match one live gate, and each
    epoch's delta file holds what the epoch touched, not the backlog."""
    monkeypatch.setenv(partition_cache.LIVE_STATE_ENV, live_state)
    monkeypatch.setattr(partition_cache, 'host_state_root', lambda: str(tmp_path / 'host'))
    gs = gate_stage
    rng = random.Random(7)
    workers: list[dict] = [{}, {}]
    state_dir = str(tmp_path / 'store')
    name = 'stage-1/gate-0'
    epochs = [([MIN_WATERMARK, MIN_WATERMARK],
               [[(KEYS[i % 4], i, i / 100) for i in range(2000)]])]
    for number in range(1, 12):
        watermark = [seconds(2 * number), seconds(4 * number)]
        epochs.append((watermark, [[(KEYS[i % 4], i, 20 + number + i / 10)
                                    for i in range(5)]]))
    live = restored({})
    sizes, kinds = [], []
    for number, epoch in enumerate(epochs):
        monkeypatch.setattr(PartitionStateCache, '_caches', rng.choice(workers))
        cache = PartitionStateCache.cache(store := LocalDirectoryStore(state_dir), state_dir)
        before = dict(cache.stats)
        backend = PartitionStateCache.load(store, state_dir, name, Revision(number - 1),
                                           lambda: KeyedStateBackend(track_changes=True))
        kinds.append(next(kind for kind, count in cache.stats.items()
                          if count > before.get(kind, 0)))
        live_gate = gs.make(live)
        assert (run_epoch(gs, gs.make(backend), epoch)
                == run_epoch(gs, live_gate, epoch)), f'epoch {number}'
        PartitionStateCache.commit(store, state_dir, name, Revision(number),
                                   Revision(number - 1), backend)
        sizes.append(len(store.get_chunked(name, b'd' + number.to_bytes(8, 'big') + bytes(2))))
    assert live_gate.graph, 'some elements are still pushed back at the end'
    print(f'\nloads: {kinds}\ndelta bytes per epoch: {sizes}')
    if live_state == 'process':
        assert 'catch-up' in kinds
    else:
        assert 'hit' in kinds and not {'catch-up', 'snapshot'} & set(kinds), kinds
    # Epoch 0 pushed back 4000 pairs; later epochs push back 10 and release a few
    # hundred (deletes are keys only).
    assert max(sizes[1:]) * 5 < sizes[0], sizes


EPOCHS = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60)), max_size=6),
        st.integers(0, 8),  # side A's watermark advance, seconds
        st.integers(0, 15),  # side B's
    ),
    min_size=1, max_size=10)


@settings(max_examples=25, deadline=None)
@given(steps=EPOCHS)
def test_a_gate_restored_every_epoch_equals_the_live_one(gate_stage, steps):
    epochs, a, b, value = [], 0, 0, 0
    for elements, advance_a, advance_b in steps:
        a += advance_a
        b += advance_b
        chunk = []
        for key, t in elements:
            value += 1
            chunk.append((KEYS[key], value, t))
        epochs.append(([seconds(a), seconds(b)], [chunk]))
    epochs.append(([MAX_WATERMARK, MAX_WATERMARK], []))
    states = replay(gate_stage, epochs)
    assert states[-1].keys() <= {b'm'}


# Checkpoints that do not fit ------------------------------------------------------

def test_a_pair_runnable_under_the_saved_watermarks_is_a_corrupt_checkpoint(gate_stage):
    gs = gate_stage
    backend = restored({})
    gate = gs.make(backend)
    gate.admit(gs.input_id, gs.encode([('a', 1, 3)]))
    state = backend.take_delta()[0]
    gate.on_side_watermarks({side: MAX_WATERMARK for side in gs.sides})
    state[b'm'] = backend.take_delta()[0][b'm']  # the release's delete got lost
    with pytest.raises(CorruptGateStateError, match='runnable'):
        gs.make(restored(state))
    del state[b'm']
    with pytest.raises(CorruptGateStateError, match='no side watermarks'):
        gs.make(restored(state))


def test_a_checkpoint_of_other_side_inputs_is_reported(gate_stage):
    gs = gate_stage
    backend = restored({})
    gs.make(backend).on_side_watermarks({gs.sides[0]: seconds(5)})
    state = backend.take_delta()[0]
    watermarks, input_ids, next_seq, pushed_back = gate_meta(state[b'm'])
    state[b'm'] = with_gate_meta(state[b'm'],
                                 (watermarks[:1], input_ids, next_seq, pushed_back))
    with pytest.raises(CorruptGateStateError, match='side inputs'):
        gs.make(restored(state))
