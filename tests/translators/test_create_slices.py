"""A long `Create` read in slices, one per partition (`create_slices`): the slices cover
the values once and in order (hypothesis), the plan swaps only a long Create's FlatMap,
the impulses are Beam's with a slice in them, and pipelines give the DirectRunner's
results."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.runners.portability.fn_api_runner.execution import ENCODED_IMPULSE_VALUE
from apache_beam.transforms import environments
from hypothesis import given
from hypothesis import strategies as st

from beam_streams_runner.driver.plan import build_plan
from beam_streams_runner.translators.chain_steps import dofn_info
from beam_streams_runner.translators.create_slices import (
    SLICED_FROM,
    CreateSlices,
    impulse_records,
)
from beam_streams_runner.translators.impulse import impulse_rdd

pytestmark = pytest.mark.timeout(300)
_IMPULSE = coders.WindowedValueCoder(coders.BytesCoder(), coders.GlobalWindowCoder()).get_impl()


@given(values=st.lists(st.binary(max_size=3), max_size=50), count=st.integers(1, 9))
def test_the_slices_hold_every_value_once_in_order(values, count):
    fn = CreateSlices(values)
    slices = [fn.process(f'{index}/{count}'.encode()) for index in range(count)]
    assert [value for part in slices for value in part] == values
    assert max(map(len, slices)) - min(map(len, slices)) <= 1
    assert fn.process(b'') == values  # Beam's own impulse: all of them


def test_impulses_are_beams_with_their_slice():
    beams = _IMPULSE.decode_nested(ENCODED_IMPULSE_VALUE)
    records = impulse_records('in', 3)
    assert [input_id for input_id, _ in records] == ['in'] * 3
    for index, (_, encoded) in enumerate(records):
        impulse = _IMPULSE.decode_nested(encoded)
        assert impulse.value == f'{index}/3'.encode()
        assert (impulse.timestamp, impulse.windows, impulse.pane_info) == (
            beams.timestamp, beams.windows, beams.pane_info)


def _impulse_stages(build) -> list[tuple[bool, list[str]]]:
    """(impulse_slices, DoFn class names) of each stage reading an Impulse."""
    p = beam.Pipeline()
    build(p)
    p.visit(group_by_key_input_visitor(False))
    plan = build_plan(p.to_runner_api(
        default_environment=environments.EmbeddedPythonEnvironment.default()),
        stateless_chains=False)
    try:
        stages = []
        for stage in plan.stages:
            if stage.descriptor is None or not any(
                    buffer.startswith(b'impulse') for buffer in stage.inputs.values()):
                continue
            descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
            names = []
            for transform in descriptor.transforms.values():
                if transform.spec.urn == 'beam:transform:pardo:v1':
                    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
                    info = dofn_info(payload.do_fn)
                    names.append(type(info[0]).__name__ if info else '?')
            stages.append((stage.impulse_slices, names))
        return stages
    finally:
        plan.close()


def test_only_a_long_creates_flatmap_is_swapped():
    long = _impulse_stages(lambda p: p | beam.Create(range(SLICED_FROM)))
    assert long == [(True, ['CreateSlices'])]
    short = _impulse_stages(lambda p: p | beam.Create(range(SLICED_FROM - 1)))
    assert short == [(False, ['CallableWrapperDoFn'])]
    # Another step reading an Impulse is left alone.
    other = _impulse_stages(lambda p: p | beam.Impulse() | beam.FlatMap(lambda _: range(5000)))
    assert other == [(False, ['CallableWrapperDoFn'])]


def test_each_partition_gets_one_impulse(spark_session):
    parts = impulse_rdd(spark_session.sparkContext, 'in', 3).glom().collect()
    assert [[_IMPULSE.decode_nested(encoded).value for _, encoded in part]
            for part in parts] == [[b'0/3'], [b'1/3'], [b'2/3']]


def test_long_creates_give_the_direct_runners_results(assert_same_as_direct):
    def build(p):
        return {
            'ints': p | 'Ints' >> beam.Create(range(3 * SLICED_FROM)) | beam.Map(lambda x: x * 2),
            'kept': p | 'Kept' >> beam.Create([f'w{i}' for i in range(SLICED_FROM + 7)],
                                              reshuffle=False),
            'short': p | 'Short' >> beam.Create(['a', 'b']),
        }
    out = assert_same_as_direct(build)
    assert len(out['ints']) == 3 * SLICED_FROM and len(out['kept']) == SLICED_FROM + 7


def test_a_sliced_creates_reshuffle_moves_nothing(spark_session, tmp_path):
    """In batch the slices are spread over the partitions already: the Create's own
    Reshuffle passes them on without a shuffle; a short Create's still shuffles."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_streams_runner.driver.batch import BatchDriver
    from beam_streams_runner.runner import plan_pipeline

    p = beam.Pipeline(options=PipelineOptions([]))
    _ = p | 'Long' >> beam.Create(range(2 * SLICED_FROM)) | 'L' >> beam.Map(lambda x: x)
    _ = p | 'Short' >> beam.Create(['a', 'b']) | 'S' >> beam.Map(lambda x: x)
    _, plan, _ = plan_pipeline(p, p.options)
    try:
        driver = BatchDriver(spark_session.sparkContext, plan, bundle_size=1000,
                             num_partitions=2)
        driver.run()
        shuffled = {
            stage.step_names[0].split('/')[0]: 'partitionBy' in
            driver._stage_rdds[stage.name].toDebugString().decode()
            for stage in plan.stages if stage.kind == 'reshuffle'}
    finally:
        plan.close()
    assert shuffled == {'Long': False, 'Short': True}
