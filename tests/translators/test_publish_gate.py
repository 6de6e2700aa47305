"""The publish gate: a publishing stage's input waits for the cut covering it (no Spark).

Design section 12 ("Sinks publish after the cut"). Checked on the gate alone,
over a real `KeyedStateBackend` and Beam's windowed-value coder:

* nothing staged in epoch e is released before a cut after e (or later) is
  consistent; then it is released once, in arrival order, with e as its fence;
* staged chunks hold the watermark at their earliest element;
* a gate over a backend restored from its snapshot at any epoch (a reset, or a
  task landing in another worker) releases exactly what the live one would from
  there (hypothesis);
* a publishing step is planned as the first step of a stage of its own.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import environments, window
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.driver.plan import build_plan
from beam_streams_runner.records import MAX_WATERMARK, decode_with_raw
from beam_streams_runner.regions.publishing import is_publishing, publishing_steps
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.translators.publish_gate import PublishGate

CODER = coders.WindowedValueCoder(coders.VarIntCoder(), coders.GlobalWindowCoder()).get_impl()


class _Runtime:
    def coder_impl(self, coder_id: str):
        return CODER


@dataclasses.dataclass
class _Stage:
    inputs: dict
    input_coders: dict


STAGE = _Stage({'in-a': b'a', 'in-b': b'b'}, {'in-a': 'c', 'in-b': 'c'})


def chunk(*timestamped: tuple[int, int]) -> bytes:
    """The encoded elements (value, timestamp in seconds)."""
    return b''.join(CODER.encode_nested(WindowedValue(v, Timestamp(t), [window.GlobalWindow()]))
                    for v, t in timestamped)


def values(encoded: bytes) -> list[int]:
    return [value.value for value, _ in decode_with_raw(CODER, encoded)]


def gate(state: KeyedStateBackend, epoch: int, published_through: int) -> PublishGate:
    return PublishGate(_Runtime(), STAGE, state, epoch, published_through)


def test_staged_output_waits_for_the_cut_after_its_epoch_and_carries_that_epoch():
    state = KeyedStateBackend(track_changes=True)
    first = gate(state, 3, published_through=2)
    assert first.release() == []
    first.stage([('in-a', chunk((1, 50), (2, 40))), ('in-b', chunk((3, 60)))])
    assert first.waiting() == 2 and first.hold() == Timestamp(40).micros
    assert gate(state, 4, published_through=2).release() == []  # no cut after epoch 3 yet
    released = gate(state, 5, published_through=3).release()
    assert [(fence, input_id, values(c)) for fence, (input_id, c) in released] == [
        (3, 'in-a', [1, 2]), (3, 'in-b', [3])]
    later = gate(state, 6, published_through=5)
    assert later.release() == [] and later.waiting() == 0 and later.hold() == MAX_WATERMARK


# An epoch: which chunks arrive (each a list of (value, seconds)), and the epoch of the
# newest consistent cut at that time (at most the previous epoch).
epochs = st.lists(st.tuples(
    st.lists(st.lists(st.tuples(st.integers(0, 99), st.integers(0, 1000)), min_size=1,
                      max_size=3), max_size=3),
    st.integers(0, 3)), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(epochs, st.data())
def test_a_gate_restored_at_any_epoch_releases_what_the_live_one_does(script, data):
    """Every staged element comes out once, in arrival order, only when covered; a gate
    rebuilt from a snapshot taken after any epoch goes on exactly as the live one."""
    live_state = KeyedStateBackend(track_changes=True)
    restore_after = data.draw(st.integers(0, len(script) - 1))
    published, arrived, covered_through = [], [], -1
    restored_state = None
    restored_released = []
    for epoch, (arrivals, lag) in enumerate(script):
        covered_through = max(covered_through, epoch - 1 - lag)
        for state, out in ((live_state, published), (restored_state, restored_released)):
            if state is None:
                continue
            g = gate(state, epoch, covered_through)
            for fence, (_, encoded) in g.release():
                assert fence <= covered_through
                out.extend((fence, v) for v in values(encoded))
            g.stage([('in-a', chunk(*elements)) for elements in arrivals])
        arrived.extend((epoch, v) for elements in arrivals for v, _ in elements)
        if epoch == restore_after:
            restored_state = KeyedStateBackend(track_changes=True)
            restored_state.restore(live_state.snapshot())
            restored_released = list(published)
    final = len(script)
    for state, out in ((live_state, published), (restored_state, restored_released)):
        for fence, (_, encoded) in gate(state, final, final - 1).release():
            out.extend((fence, v) for v in values(encoded))
    assert published == arrived
    assert restored_released == arrived


def test_beams_file_sinks_and_marked_dofns_publish():
    class Marked(beam.DoFn):
        publishes_after_checkpoint = True

    assert is_publishing(Marked()) and not is_publishing(beam.DoFn())
    p = beam.Pipeline(options=PipelineOptions(['--streaming']))
    (p
     | beam.Create([1, 2])
     | beam.WindowInto(window.FixedWindows(5))
     | beam.Map(str)
     | fileio.WriteToFiles(path='/tmp/unused', shards=1))
    steps = publishing_steps(p)
    assert len(steps) == 1 and 'WriteToFiles' in next(iter(steps))
    plan = build_plan(p.to_runner_api(
        default_environment=environments.EmbeddedPythonEnvironment.default()),
        streaming=True, publishing=steps)
    try:
        publishing = [s for s in plan.stages if s.publishes]
        assert len(publishing) == 1
        assert publishing[0].step_names[0] == next(iter(steps))
    finally:
        plan.close()
