"""Bounded sources read in bulk (`translators.bounded_reads`).

Checked here:

* the plan: a `ReadFromText`'s process step and its source bundle boundary become one
  bulk read (and stay Beam's splittable DoFn with `stateless_chains=False`); a
  splittable DoFn of the user's keeps the harness;
* the reading stage driven in process (as `test_stateless_chain` drives a stage),
  planned with and without bulk reads, over random text files (empty lines, `\\r\\n`,
  no final newline, non-ASCII), random initial splits, bundle sizes and read slices
  (hypothesis): the same records with the same timestamps and windows, the same
  element counts, every record once across the slices' checkpoints;
* what a bulk read's slice leaves (its residual) is a residual of Beam's own form: the
  harness's splittable DoFn reads it on, and the other way round;
* a source that fails names its step, as Beam's DoFnRunner does.
"""

from __future__ import annotations

import collections
import contextlib
import uuid
from collections.abc import Iterator

import apache_beam as beam
import pytest
from apache_beam.io import iobase
from apache_beam.io.textio import ReadFromText
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.transforms import environments, window
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from beam_streams_runner.driver.lineage import worker_plan
from beam_streams_runner.driver.plan import build_plan
from beam_streams_runner.driver.progress import counted_outputs
from beam_streams_runner.errors import StageExecutionError
from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.translators.operator import OperatorServices
from beam_streams_runner.translators.par_do import FusedStageOperator
from beam_streams_runner.translators.read import (
    _PROCESS_SIZED_ELEMENTS,
    BOUNDED_READ_URN,
    SOURCE_BUNDLES_URN,
    ReadInEpochs,
    ReadToEnd,
    Residual,
)

pytestmark = pytest.mark.timeout(300)

_READER = 'SDFBoundedSourceReader/ParDo(SDFBoundedSourceDoFn)'


@contextlib.contextmanager
def _plans(path: str) -> Iterator[dict[bool, object]]:
    """{bulk reads (stateless_chains): plan} of `ReadFromText(path) | Map | Reshuffle`."""
    p = beam.Pipeline()
    _ = (p | 'Read' >> ReadFromText(path) | 'Upper' >> beam.Map(str.upper)
         | 'Out' >> beam.Reshuffle())
    p.visit(group_by_key_input_visitor(False))
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    plans = {bulk: build_plan(proto, stateless_chains=bulk) for bulk in (True, False)}
    (read_output,) = next(t for t in proto.components.transforms.values() if t.unique_name ==
                          f'Read/Read/{_READER}').outputs.values()
    for plan in plans.values():
        plan.read_output = read_output  # the records' PCollection, whose elements are counted
    try:
        yield plans
    finally:
        for plan in plans.values():
            plan.close()


def _read_stage(plan):
    (stage,) = [s for s in plan.stages if 'Upper' in s.step_names]
    return stage


def _urns(stage) -> list[str]:
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    return sorted(t.spec.urn for t in descriptor.transforms.values())


def _restrictions(path: str, chunk: int) -> list[WindowedValue]:
    """The stage's input: the text source's initial splits of about `chunk` bytes, as
    Beam's splittable DoFn expansion hands them on (element, restriction, size)."""
    source = ReadFromText(path)._source
    provider = iobase._SDFBoundedSourceRestrictionProvider(desired_chunk_size=chunk)
    return [WindowedValue(((source, (r, None)), provider.restriction_size(source, r)),
                          MIN_TIMESTAMP, (window.GlobalWindow(),))
            for r in provider.split(source, provider.initial_restriction(source))]


class _Run(collections.namedtuple('_Run', 'outputs counts slices')):
    """A task's outputs (Counter of (value, timestamp micros, windows)), its element
    counts and how many harness bundles (read slices) it ran."""


def _run(plan, elements: list[WindowedValue], bundle_size: int, policy=None) -> _Run:
    stage = _read_stage(plan)
    runtime = worker_plan(plan, f'test-{uuid.uuid4().hex}', 100, 1).runtime()
    (input_id, _), = stage.inputs.items()
    (output_id, _), = stage.outputs.items()
    encode = runtime.coder_impl(stage.input_coders[input_id]).encode_nested
    counted = counted_outputs([stage], [plan.read_output]).get(stage.name, ())
    services = OperatorServices(bundle_size=bundle_size, counted=counted,
                                element_counts={}, source=policy or _eager_slices())
    operator_ = FusedStageOperator(runtime, stage, services)
    slices = 0
    run_bundle = operator_._run_bundle

    def counting(*args, **kwargs):
        nonlocal slices
        slices += 1
        return run_bundle(*args, **kwargs)

    operator_._run_bundle = counting
    records = operator_.process_bundle([(input_id, b''.join(encode(e) for e in elements))])
    records += operator_.advance(MAX_WATERMARK)
    coder = runtime.coder_impl(stage.output_coders[output_id])
    outputs = collections.Counter(
        (out.value, out.timestamp.micros, tuple(out.windows))
        for _, chunk in records for out in coder.decode_all(chunk))
    return _Run(outputs, dict(services.element_counts), slices)


def _eager_slices() -> ReadToEnd:
    """Batch's policy with slices cut as soon as a default bundle was read (no minimum
    slice time), so that every run checkpoints its restrictions."""
    policy = ReadToEnd()
    policy.min_slice_s = 0.0
    return policy


def _write(path, lines: list[str], newline: str, final_newline: bool) -> list[str]:
    """Writes the lines; returns those a text read finds in the file (an empty last
    line without a newline is no line)."""
    text = newline.join(lines) + (newline if final_newline and lines else '')
    with open(path, 'w', encoding='utf-8', newline='') as f:
        f.write(text)
    found = text.split('\n')
    if found[-1] == '':
        found.pop()
    return [line.removesuffix('\r') for line in found]


# 1. The plan ---------------------------------------------------------------------------
def test_a_text_read_becomes_one_bulk_read(tmp_path):
    path = str(tmp_path / 'in.txt')
    _write(path, ['a', 'b'], '\n', True)
    with _plans(path) as plans:
        bulk, harness = (_urns(_read_stage(plans[flag])) for flag in (True, False))
    assert bulk.count(BOUNDED_READ_URN) == 1
    assert _PROCESS_SIZED_ELEMENTS not in bulk and SOURCE_BUNDLES_URN not in bulk
    assert BOUNDED_READ_URN not in harness
    assert harness.count(_PROCESS_SIZED_ELEMENTS) == 1 and harness.count(SOURCE_BUNDLES_URN) == 1


def test_a_users_splittable_dofn_keeps_the_harness():
    from beam_streams_runner.translators.bounded_reads import is_bounded_source_reader
    from tests.translators.test_read import _CharsByPosition

    p = beam.Pipeline()
    _ = p | beam.Create(['abc']) | beam.ParDo(_CharsByPosition()) | beam.Reshuffle()
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    plan = build_plan(proto)
    try:
        urns = [t.spec.urn for s in plan.stages if s.descriptor is not None
                for t in beam_fn_api_pb2.ProcessBundleDescriptor.FromString(
                    s.descriptor).transforms.values()]
    finally:
        plan.close()
    assert _PROCESS_SIZED_ELEMENTS in urns and BOUNDED_READ_URN not in urns
    assert not is_bounded_source_reader(proto.components.transforms[
        next(t for t, tr in proto.components.transforms.items()
             if tr.unique_name.endswith('ParDo(_CharsByPosition)'))])


# 2. The same records, bundles and slices -------------------------------------------------
_LINE = st.text(alphabet=st.sampled_from('ab z\u00e9\u4e2d\r'), max_size=12).filter(
    lambda line: not line.endswith('\r'))


@example(lines=[f'line {i}' for i in range(2600)], newline='\r\n', final_newline=False,
         chunk=1000, bundle_size=7)
@example(lines=[f'line {i}' for i in range(2600)], newline='\n', final_newline=True,
         chunk=1 << 20, bundle_size=2500)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_LINE, max_size=3000), newline=st.sampled_from(['\n', '\r\n']),
       final_newline=st.booleans(), chunk=st.sampled_from([64, 1000, 1 << 20]),
       bundle_size=st.sampled_from([1, 7, 1000, 2500]))
def test_bulk_reads_equal_beams_reader(tmp_path, lines, newline, final_newline, chunk,
                                       bundle_size):
    path = str(tmp_path / f'in-{uuid.uuid4().hex}.txt')
    lines = _write(path, lines, newline, final_newline)
    elements = _restrictions(path, chunk)
    with _plans(path) as plans:
        bulk = _run(plans[True], elements, bundle_size)
        harness = _run(plans[False], elements, bundle_size)
    assert bulk.outputs == harness.outputs
    expected = collections.Counter(line.upper() for line in lines)
    assert collections.Counter(value for value, _, _ in bulk.outputs.elements()) == expected
    assert bulk.counts == harness.counts
    # Slices end where the harness's do: past a default bundle of records.
    assert bulk.slices == harness.slices
    if len(lines) > 2000 and chunk > len(lines) * 7:
        assert bulk.slices > 1  # the one restriction was checkpointed


# 3. Residuals of either form --------------------------------------------------------------
@pytest.mark.parametrize('first', [True, False], ids=['bulk-then-harness', 'harness-then-bulk'])
def test_a_slices_residual_is_read_on_by_either_reader(tmp_path, first):
    path = str(tmp_path / 'in.txt')
    lines = [f'line {i}' for i in range(5000)]
    _write(path, lines, '\n', True)
    elements = _restrictions(path, 1 << 20)
    with _plans(path) as plans:
        policy = ReadInEpochs(bundle_time_ms=0)
        head = _run(plans[first], elements, 1000, policy)
        residuals: list[Residual] = policy.residuals
        assert len(residuals) == 1 and head.outputs
        stage = _read_stage(plans[not first])
        coder = worker_plan(plans[not first], 'decode', 100, 1).runtime().coder_impl(
            stage.input_coders[residuals[0].input_id])
        rest = _run(plans[not first], [coder.decode_nested(residuals[0].element)], 1000)
    values = collections.Counter(v for v, _, _ in (head.outputs + rest.outputs).elements())
    assert values == collections.Counter(line.upper() for line in lines)


# 4. Errors -----------------------------------------------------------------------------------
def test_a_failing_source_names_its_step(tmp_path):
    path = str(tmp_path / 'in.txt')
    _write(path, ['a'], '\n', True)
    elements = _restrictions(path, 1 << 20)
    with _plans(path) as plans, pytest.raises(StageExecutionError) as failed:
        (tmp_path / 'in.txt').unlink()
        _run(plans[True], elements, 1000)
    assert f"while running 'Read/Read/{_READER}" in str(failed.value)
