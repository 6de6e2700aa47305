"""A batch stage's output kept grouped by key for a GroupByKey in the global window
(`keyed_outputs`), and its panes handed on unencoded (`grouped_inputs`): which coders
allow it, the same partitions, groups and panes as Beam's encoded path for any mix of
both forms (hypothesis), and pipelines on Spark that take it, or do not, giving the
DirectRunner's results."""

from __future__ import annotations

import uuid

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.coders.coders import GlobalWindowCoder, LengthPrefixCoder
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.transforms import environments, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.driver.lineage import worker_plan
from beam_streams_runner.driver.plan import build_plan
from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.translators.group_by_key import (
    GroupByKeyOperator,
    GroupingCoders,
    KeyPartitioner,
)
from beam_streams_runner.translators.grouped_inputs import GroupedPanes
from beam_streams_runner.translators.keyed_outputs import (
    KeyedOutputBatches,
    KeyedValues,
    faithful,
    groupable,
)
from beam_streams_runner.translators.kv_chunks import KvChunks
from beam_streams_runner.worker.batch_tasks import _keyed_outputs

pytestmark = pytest.mark.timeout(300)

_FAST = coders.FastPrimitivesCoder()
_DETERMINISTIC = coders.DeterministicFastPrimitivesCoderV2(_FAST, 'GroupByKey')


class _Doubling(coders.Coder):
    """A user's coder whose decoding is not what was encoded."""

    def encode(self, value):
        return _FAST.encode(value * 2)

    def decode(self, encoded):
        return _FAST.decode(encoded)

    def is_deterministic(self):
        return True


@pytest.mark.parametrize('coder, expected', [
    (coders.VarIntCoder(), True),
    (coders.StrUtf8Coder(), True),
    (_FAST, True),
    (_DETERMINISTIC, True),
    (LengthPrefixCoder(_DETERMINISTIC), True),
    (coders.TupleCoder([coders.VarIntCoder(), LengthPrefixCoder(_FAST)]), True),
    (_Doubling(), False),
    (coders.FastPrimitivesCoder(fallback_coder=_Doubling()), False),
    (coders.TupleCoder([coders.VarIntCoder(), _Doubling()]), False),
    (coders.DeterministicFastPrimitivesCoderV2(
        coders.FastPrimitivesCoder(fallback_coder=_Doubling()), 'x'), False),
])
def test_only_coders_that_give_back_what_they_encode_are_faithful(coder, expected):
    assert faithful(coder) is expected


def test_only_default_windowing_with_the_groupings_key_coder_is_groupable():
    key = LengthPrefixCoder(_DETERMINISTIC)
    kvs = coders.WindowedValueCoder(coders.TupleCoder([key, LengthPrefixCoder(_FAST)]),
                                    GlobalWindowCoder())
    assert groupable(kvs, key, Windowing(window.GlobalWindows()))
    assert not groupable(kvs, key, Windowing(window.FixedWindows(10)))
    assert not groupable(kvs, LengthPrefixCoder(_FAST), Windowing(window.GlobalWindows()))
    custom = coders.WindowedValueCoder(coders.TupleCoder([key, _Doubling()]),
                                       GlobalWindowCoder())
    assert not groupable(custom, key, Windowing(window.GlobalWindows()))


# Both forms against Beam's encoded path -----------------------------------------------
_KEY = LengthPrefixCoder(_DETERMINISTIC)
_WINDOWED = coders.WindowedValueCoder(
    coders.TupleCoder([_KEY, LengthPrefixCoder(_FAST)]), GlobalWindowCoder())
_OUTPUT = coders.WindowedValueCoder(
    coders.TupleCoder([_KEY, coders.IterableCoder(LengthPrefixCoder(_FAST))]),
    GlobalWindowCoder())
# 1, 1.0 and True are equal Python keys with different encodings: separate groups.
_KEYS = st.one_of(st.integers(-3, 3), st.sampled_from([1.0, True, 'a', 'b', (1, 'a')]))
_VALUES = st.one_of(st.integers(), st.text(max_size=5), st.none(), st.tuples(st.integers()))


def _reduced(batches, keyed_batches, partitions: int, hands_panes: bool = False
             ) -> dict[int, list]:
    """What each reduce partition groups when the batches whose index is in
    `keyed_batches` leave their stage as `KeyedValues` and the others encoded; its
    panes encoded or (`hands_panes`) handed on, as (key, key type, values, timestamp,
    windows, pane info)."""
    impl = _WINDOWED.get_impl()
    chunks = []
    for index, batch in enumerate(batches):
        if index in keyed_batches:
            output = KeyedOutputBatches('out', _KEY.get_impl())
            output.add_batch(batch, [WindowedValue(None, 0, [window.GlobalWindow()])] * len(batch))
            taken = output.take()
            if taken is not None:
                chunks.append(taken)
        elif batch:
            chunks.append(b''.join(impl.encode_nested(
                WindowedValue(kv, 0, [window.GlobalWindow()])) for kv in batch))
    partitioner = KeyPartitioner(impl, _KEY.get_impl(), partitions, 3,
                                 KvChunks.of(_WINDOWED, _KEY))
    by_target: dict[int, list] = {}
    for target, record in partitioner.partition('in', chunks):
        by_target.setdefault(target, []).append(record)
    reduced = {}
    coders_ = GroupingCoders(impl, _OUTPUT.get_impl(), _KEY.get_impl(), _FAST.get_impl())
    for target, records in by_target.items():
        operator = GroupByKeyOperator(coders_, Windowing(window.GlobalWindows()), 'out', 4,
                                      KvChunks.of(_WINDOWED, _KEY), hands_panes)
        operator.process_bundle(records)
        panes = []
        for _, chunk in operator.advance(MAX_WATERMARK):
            if hands_panes:
                assert type(chunk) is GroupedPanes and 0 < len(chunk) <= 4
                panes.extend(chunk)
            else:
                panes.extend(_OUTPUT.get_impl().decode_all(chunk))
        reduced[target] = sorted(
            (repr(pane.value[0]), type(pane.value[0]).__name__, list(pane.value[1]),
             pane.timestamp, pane.windows, pane.pane_info) for pane in panes)
    return reduced


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(_KEYS, _VALUES), max_size=12), max_size=6),
       keyed=st.sets(st.integers(0, 5)), partitions=st.integers(1, 4))
def test_keyed_batches_reach_the_partitions_and_groups_of_encoded_ones(
        batches, keyed, partitions):
    beams = _reduced(batches, set(), partitions)
    mixed = _reduced(batches, keyed, partitions)
    assert mixed.keys() == beams.keys()
    for target, groups in beams.items():
        if keyed >= set(range(len(batches))):
            assert mixed[target] == groups  # all grouped: values in arrival order too
        else:
            assert [(k, t, sorted(map(repr, vs))) for k, t, vs, *_ in mixed[target]] == [
                (k, t, sorted(map(repr, vs))) for k, t, vs, *_ in groups]


@settings(max_examples=100, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(_KEYS, _VALUES), max_size=12), max_size=6),
       keyed=st.sets(st.integers(0, 5)), partitions=st.integers(1, 3))
def test_handed_panes_are_what_beams_coders_give_back(batches, keyed, partitions):
    assert (_reduced(batches, keyed, partitions, hands_panes=True)
            == _reduced(batches, keyed, partitions))


def test_only_panes_in_the_global_window_are_handed_on():
    coders_ = GroupingCoders(_WINDOWED.get_impl(), _OUTPUT.get_impl(), _KEY.get_impl(),
                             _FAST.get_impl())
    with pytest.raises(ValueError, match='global window'):
        GroupByKeyOperator(coders_, Windowing(window.FixedWindows(5)), 'out', 4,
                           hands_panes=True)


def test_a_kept_batch_is_taken_once():
    output = KeyedOutputBatches('out', _KEY.get_impl())
    assert output.take() is None
    output.add_batch([('a', 1), ('b', 2), ('a', 3)], [None] * 3)
    taken = output.take()
    assert isinstance(taken, KeyedValues)
    assert sorted(taken.values()) == [('a', [1, 3]), ('b', [2])]
    assert output.take() is None


# The plan and pipelines on Spark ------------------------------------------------------
def _grouping_stage_outputs(build) -> dict:
    p = beam.Pipeline()
    build(p)
    p.visit(group_by_key_input_visitor(False))
    plan = build_plan(p.to_runner_api(
        default_environment=environments.EmbeddedPythonEnvironment.default()))
    try:
        wplan = worker_plan(plan, f'test-{uuid.uuid4().hex}', 100, 1)
        runtime = wplan.runtime()
        return {stage.name: _keyed_outputs(runtime, wplan, stage) for stage in plan.stages
                if stage.kind == 'sdk'}
    finally:
        plan.close()


def test_a_chain_feeding_a_global_groupbykey_keeps_its_output_grouped():
    def build(p):
        _ = (p | beam.Create([1, 2]) | beam.FlatMap(lambda x: [(x, x)]) | beam.GroupByKey())
    assert any(_grouping_stage_outputs(build).values())


def test_windowed_groupings_and_user_coders_keep_beams_encoding():
    def windowed(p):
        _ = (p | beam.Create([1, 2]) | beam.Map(lambda x: window.TimestampedValue((x, x), x))
             | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey())

    def custom(p):
        _ = (p | beam.Create([1, 2]) | beam.Map(lambda x: (x, x)).with_output_types(
            beam.typehints.KV[int, _Doubled]) | beam.GroupByKey())
    assert not any(_grouping_stage_outputs(windowed).values())
    assert not any(_grouping_stage_outputs(custom).values())


class _Doubled(int):
    pass


class _AsText(coders.Coder):
    """A user's coder (faithful, but unknown to the runner: Beam's encoding stays)."""

    def encode(self, value):
        return str(int(value)).encode()

    def decode(self, encoded):
        return _Doubled(int(encoded))

    def is_deterministic(self):
        return True


beam.coders.registry.register_coder(_Doubled, _AsText)


def _pairs(seed: int) -> list[tuple]:
    return [(i % 7 if i % 3 else str(i % 5), i) for i in range(seed * 50, seed * 50 + 50)]


def test_groupbykey_results_with_kept_groups_are_the_direct_runners(assert_same_as_direct):
    def build(p):
        pairs = p | beam.Create(range(40)) | beam.FlatMap(_pairs)
        grouped = pairs | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
        # The same PCollection also read element by element: both forms in one shuffle.
        flattened = ((pairs, p | 'More' >> beam.Create([(1, -1), ('2', -2)]))
                     | beam.Flatten() | 'Group both' >> beam.GroupByKey()
                     | 'Sum' >> beam.MapTuple(lambda k, vs: (k, sum(vs), len(vs))))
        custom = (p | 'Seeds' >> beam.Create([1, 2, 3])
                  | beam.Map(lambda x: (x % 2, _Doubled(x))).with_output_types(
                      beam.typehints.KV[int, _Doubled])
                  | 'Group custom' >> beam.GroupByKey()
                  | 'Sort' >> beam.MapTuple(lambda k, vs: (k, sorted(map(int, vs)))))
        # Panes handed to steps outside a chain: a side input, two readers.
        groups = pairs | 'Group again' >> beam.GroupByKey()
        total = p | 'Total' >> beam.Create([1000])
        side = groups | 'With side' >> beam.Map(
            lambda kv, n: (kv[0], len(kv[1]) + n), n=beam.pvalue.AsSingleton(total))
        first = groups | 'First' >> beam.MapTuple(lambda k, vs: (k, min(vs)))
        last = groups | 'Last' >> beam.MapTuple(lambda k, vs: (k, max(vs)))
        return {'grouped': grouped, 'flattened': flattened, 'custom': custom, 'side': side,
                'first': first, 'last': last}
    out = assert_same_as_direct(build)
    assert out['custom'] == ['(0, [2])', '(1, [1, 3])']
