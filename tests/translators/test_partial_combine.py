"""The lifted Combine's partial combine lasts a whole task, not a bundle (`partial_combine`).

Driven directly (a fused stage `Map -> Precombine` after a Reshuffle, fed chunk by
chunk, each chunk one harness bundle): the stage's output, what goes into the shuffle,
has at most one accumulator per key and task, and the accumulators add up to the
plain per-key sums, for any input and bundle cut (hypothesis). Through the runner: a
`ReadFromText` cut into many source bundles sends at most one accumulator per key and
read task into the shuffle (counted by a CombineFn that counts the accumulators it
merges), in batch; in streaming the partial combine still ends with every epoch.
"""

from __future__ import annotations

import collections
import itertools
import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.testing import test_stream
from apache_beam.transforms import environments, window
from apache_beam.transforms.window import GlobalWindows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.driver.lineage import worker_plan
from beam_streams_runner.driver.plan import build_plan
from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.translators.operator import OperatorServices
from beam_streams_runner.translators.par_do import FusedStageOperator
from beam_streams_runner.translators.partial_combine import TaskPartialCombine

pytestmark = pytest.mark.timeout(300)


def _plain_sum(values):
    return sum(values)


@pytest.fixture(scope='module')
def planned():
    """The runtime and the stages (by combine name) of two
    `Reshuffle -> Map -> CombinePerKey/Precombine` stages in one batch plan: `Sum`
    (Beam bounds its partial combine at 1,000,000 keys) and `PlainSum` (100,000)."""
    p = beam.Pipeline()
    pairs = p | beam.Create([('k', 1)])
    for name, fn in (('Sum', sum), ('PlainSum', _plain_sum)):
        _ = (pairs
             | f'Reshuffle{name}' >> beam.Reshuffle()
             | f'Identity{name}' >> beam.Map(lambda kv: kv)
             | name >> beam.CombinePerKey(fn))
    p.visit(group_by_key_input_visitor(False))
    plan = build_plan(p.to_runner_api(
        default_environment=environments.EmbeddedPythonEnvironment.default()))
    runtime = worker_plan(plan, f'test-{uuid.uuid4().hex}', 100, 1).runtime()
    stages = {name: s for s in plan.stages for name in ('Sum', 'PlainSum')
              if f'{name}/Precombine' in s.step_names}
    yield runtime, stages
    plan.close()


@pytest.fixture
def precombine_stage(planned):
    """(runtime, stage) of the `Sum` stage."""
    runtime, stages = planned
    return runtime, stages['Sum']


def _encode(runtime, stage, pairs) -> tuple[str, bytes]:
    (input_id, _), = stage.inputs.items()
    coder = runtime.coder_impl(stage.input_coders[input_id])
    return input_id, b''.join(
        coder.encode_nested(GlobalWindows.windowed_value(pair)) for pair in pairs)


def _run_task(runtime, stage, bundles, bundle_size: int = 100) -> list[tuple]:
    """One task: every bundle, then the end of its input; the (key, accumulator)
    elements the stage sent to the shuffle."""
    operator = FusedStageOperator(runtime, stage, OperatorServices(bundle_size=bundle_size))
    records = []
    for bundle in bundles:
        if bundle:
            records += operator.process_bundle([_encode(runtime, stage, bundle)])
    records += operator.advance(MAX_WATERMARK)
    records += operator.finish_task()
    (output_id, _), = stage.outputs.items()
    coder = runtime.coder_impl(stage.output_coders[output_id])
    return [windowed.value for _, chunk in records for windowed in coder.decode_all(chunk)]


def _sums(accumulators) -> dict:
    # CombinePerKey(sum)'s accumulator is a list of partial sums.
    sums: dict = collections.defaultdict(int)
    for key, accumulator in accumulators:
        sums[key] += sum(accumulator)
    return dict(sums)


def test_one_accumulator_per_key_per_task_whatever_the_bundles(precombine_stage):
    runtime, stage = precombine_stage
    pairs = [(f'w{i % 50}', i) for i in range(2000)]
    bundles = [pairs[start:start + 10] for start in range(0, len(pairs), 10)]  # 200 bundles
    out = _run_task(runtime, stage, bundles)
    assert len(out) == 50  # one per key, not one per key and bundle (~200 x 10)
    assert _sums(out) == _sums((k, [v]) for k, v in pairs)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(st.sampled_from('abcdefghij'), st.integers(-1000, 1000)),
                      max_size=300),
       cuts=st.lists(st.integers(0, 300), max_size=20),
       bundle_size=st.integers(1, 50))
def test_partial_sums_add_up_to_the_per_key_sums(precombine_stage, pairs, cuts, bundle_size):
    runtime, stage = precombine_stage
    bounds = sorted({0, len(pairs), *(c for c in cuts if c < len(pairs))})
    bundles = [pairs[a:b] for a, b in itertools.pairwise(bounds)]
    out = _run_task(runtime, stage, bundles, bundle_size)
    expected: dict = collections.defaultdict(int)
    for key, value in pairs:
        expected[key] += value
    assert _sums(out) == dict(expected)
    assert len(out) == len(expected)  # at most one accumulator per key in the task


def test_an_abandoned_task_leaves_nothing_to_the_next(precombine_stage):
    runtime, stage = precombine_stage
    abandoned = FusedStageOperator(runtime, stage, OperatorServices(bundle_size=100))
    abandoned.process_bundle([_encode(runtime, stage, [('a', 100), ('z', 1)])])
    held = [op for processors in runtime.processors.cached_bundle_processors.values()
            for processor in processors for op in processor.ops.values()
            if isinstance(op, TaskPartialCombine) and op.holder is not None]
    assert held  # the processor went back to the cache holding the task's table
    # The next task on the same processor: its own output only.
    out = _run_task(runtime, stage, [[('a', 1), ('b', 2)], [('a', 3)]])
    assert _sums(out) == {'a': 4, 'b': 2}


def test_past_beams_bound_keys_go_out_early_and_nothing_is_lost(planned):
    # Beam's partial combine keeps at most 100,000 keys for most CombineFns; past it a
    # tenth of them goes out in the current bundle's output, which must reach the
    # shuffle too.
    runtime, stages = planned
    keys = 100_000 + 5_000
    bundles = [[(f'k{k}', 1) for k in range(start, min(start + 5_000, keys))]
               for start in range(0, keys, 5_000)]
    bundles.append([('k0', 1), (f'k{keys - 1}', 1)])
    out = _run_task(runtime, stages['PlainSum'], bundles, bundle_size=10_000)
    sums = _sums(out)
    assert len(sums) == keys and sum(sums.values()) == keys + 2
    assert sums['k0'] == sums[f'k{keys - 1}'] == 2
    assert len(out) > keys  # some went out early (and came back later)


class _CountPartials(beam.CombineFn):
    """Sums values; also counts the accumulators merged after the shuffle, i.e. how many
    partial accumulators the partial combines sent for the key."""

    def create_accumulator(self):
        return 0, 1

    def add_input(self, accumulator, value):
        return accumulator[0] + value, accumulator[1]

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        return sum(a[0] for a in accumulators), sum(a[1] for a in accumulators)

    def extract_output(self, accumulator):
        return accumulator


def _count_words(p, path):
    return (p
            | beam.io.ReadFromText(path)
            | beam.FlatMap(str.split)
            | beam.Map(lambda word: (word, 1))
            | beam.CombinePerKey(_CountPartials()))


def test_a_read_of_many_source_bundles_shuffles_one_accumulator_per_key_and_task(
        tmp_path, spark_session, spark_args):
    path = tmp_path / 'words.txt'
    words = [f'w{i}' for i in range(20)]
    path.write_text('\n'.join(' '.join(words) for _ in range(300)) + '\n')
    out = str(tmp_path / 'out')
    # 300 lines in source bundles of 5: each key is in 60 source bundles.
    with beam.Pipeline(runner=StreamsSparkRunner(),
                       options=PipelineOptions([*spark_args, '--bundle_size=5'])) as p:
        _ = (_count_words(p, str(path))
             | beam.MapTuple(lambda word, counted: f'{word} {counted[0]} {counted[1]}')
             | beam.io.WriteToText(out))
    lines = [line.split() for f in tmp_path.glob('out*') for line in f.read_text().split('\n')
             if line]
    assert sorted(word for word, _, _ in lines) == sorted(words)
    assert all(int(count) == 300 for _, count, _ in lines)
    read_tasks = spark_session.sparkContext.defaultParallelism
    assert all(int(partials) <= read_tasks for _, _, partials in lines), lines


def test_streaming_partial_combines_end_with_every_epoch(same_as_direct_streaming):
    # Every epoch's partial accumulators reach the shuffle in that epoch: the windows
    # fire on time with all their elements, and a late pane has the late element.
    def build(p):
        events = (test_stream.TestStream()
                  .add_elements([window.TimestampedValue(('a', 1), 1),
                                 window.TimestampedValue(('b', 2), 2),
                                 window.TimestampedValue(('a', 3), 3)])
                  .advance_watermark_to(5)
                  .add_elements([window.TimestampedValue(('a', 4), 7),
                                 window.TimestampedValue(('b', 5), 12)])
                  .advance_watermark_to(11)
                  .add_elements([window.TimestampedValue(('a', 10), 8)])
                  .advance_watermark_to_infinity())
        return (p
                | events
                | beam.WindowInto(window.FixedWindows(10), allowed_lateness=20)
                | beam.CombinePerKey(sum))

    lines = same_as_direct_streaming(build)
    assert len(lines) >= 3


class _FailingCompact(beam.CombineFn):
    def create_accumulator(self):
        return 0

    def add_input(self, accumulator, value):
        return accumulator + value

    def merge_accumulators(self, accumulators):
        return sum(accumulators)

    def compact(self, accumulator):
        raise ValueError('compact failed on purpose')

    def extract_output(self, accumulator):
        return accumulator


def test_a_failure_while_emitting_names_the_stage(spark_session, spark_args):
    # The partial combine's last accumulators are compacted at the task's end, outside
    # any harness bundle: the user's error still comes with the stage's steps.
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(spark_args))
    _ = (p
         | beam.Create([('a', 1), ('b', 2)])
         | 'Sum' >> beam.CombinePerKey(_FailingCompact()))
    with pytest.raises(Exception, match='compact failed on purpose') as raised:
        p.run().wait_until_finish()
    assert 'Sum/Precombine' in str(raised.value)


def _windowed_combines(p, path):
    """Per-key combines over sliding windows, fed by a stateless chain: a CombineFn
    with its own accumulator (mean), one wrapping a callable (max) and a count whose
    output timestamp is the earliest input's (the per-element timestamp path)."""
    pairs = (p
             | beam.io.ReadFromText(path)
             | beam.Map(lambda line: line.split(','))
             | beam.Map(lambda f: window.TimestampedValue((f[0], int(f[1])), int(f[2])))
             | beam.WindowInto(window.SlidingWindows(10, 5)))
    earliest = (pairs
                | 'Earliest' >> beam.WindowInto(
                    window.SlidingWindows(10, 5),
                    timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
                | 'Count' >> beam.combiners.Count.PerKey())
    combined = [pairs | 'Mean' >> beam.combiners.Mean.PerKey(),
                pairs | 'Max' >> beam.CombinePerKey(max), earliest]

    def line(tag):
        def format_(kv, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam):
            return f'{tag} {kv[0]} {kv[1]} {w.start} {t}'
        return format_
    return [c | f'Format{i}' >> beam.Map(line(i)) for i, c in enumerate(combined)]


def test_a_chain_hands_its_partial_combine_whole_batches_as_elements_would(
        tmp_path, spark_session, spark_args):
    # The chain in front of each partial combine hands it batches (`add_batch`); with
    # the chains off the same combines get one element at a time (`process`): the
    # outputs, windows and timestamps are the same.
    rows = [f'k{i % 7},{(i * 37) % 101},{i % 60}' for i in range(3000)]
    path = tmp_path / 'rows.csv'
    path.write_text('\n'.join(rows) + '\n')
    outputs = {}
    for label, extra in (('chains', []), ('elements', ['--no_stateless_chains'])):
        out = str(tmp_path / label)
        with beam.Pipeline(runner=StreamsSparkRunner(),
                           options=PipelineOptions([*spark_args, *extra])) as p:
            _ = (_windowed_combines(p, str(path)) | beam.Flatten()
                 | beam.io.WriteToText(out))
        outputs[label] = sorted(line for f in tmp_path.glob(f'{label}*')
                                for line in f.read_text().splitlines())
    assert outputs['chains'] and outputs['chains'] == outputs['elements']
    assert {line.split()[0] for line in outputs['chains']} == {'0', '1', '2'}


def test_a_chains_sums_are_beams_sums_to_the_last_bit(tmp_path, spark_session, spark_args):
    # `CombinePerKey(sum)` fed batches keeps one running total per key; Beam's
    # CombineFn compacts buffers of values with `sum`. Floats of very different sizes
    # (where the order of additions shows) and ints give the same totals either way.
    rows = [f'k{i % 5},{(-1) ** i * 10.0 ** (i % 17 - 8) * (i + 0.1)}' for i in range(2000)]
    rows += [f'i{i % 3},{i}' for i in range(500)]
    path = tmp_path / 'rows.csv'
    path.write_text('\n'.join(rows) + '\n')
    outputs = {}
    for label, extra in (('chains', []), ('elements', ['--no_stateless_chains'])):
        out = str(tmp_path / label)

        def parse(line):
            key, value = line.split(',')
            return key, (float(value) if key.startswith('k') else int(value))

        with beam.Pipeline(runner=StreamsSparkRunner(),
                           options=PipelineOptions([*spark_args, *extra])) as p:
            _ = (p | beam.io.ReadFromText(str(path)) | beam.Map(parse)
                 | beam.CombinePerKey(sum) | beam.MapTuple(lambda k, v: f'{k} {v!r}')
                 | beam.io.WriteToText(out))
        outputs[label] = sorted(line for f in tmp_path.glob(f'{label}*')
                                for line in f.read_text().splitlines())
    assert len(outputs['chains']) == 8 and outputs['chains'] == outputs['elements']
    assert f'i0 {sum(range(0, 500, 3))}' in outputs['chains']
