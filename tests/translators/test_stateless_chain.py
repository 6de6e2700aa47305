"""Stateless chains: runs of fused Map/FlatMap/Filter/WindowInto steps as one operation.

`translators.stateless_chain` (its steps in `translators.chain_steps`) rewrites a
stage's descriptor at plan time so that each maximal linear run of chainable steps runs
as one `StatelessChainOperation`. Checked here:

* the plan: such a run becomes exactly one chain transform (and none with
  `stateless_chains=False`); a step with side inputs or extra arguments joins it; a
  stateful DoFn, a DoFn with `finish_bundle` and a Map taking a DoFn parameter stay
  harness steps; a PCollection another consumer also reads (a second branch, a side
  input) ends a run;
* the stage driven in process (as `test_partial_combine` does: a `Reshuffle` before
  the chain so the stage starts at a data input, another after it so it ends at a
  data output), planned with and without chains, for random chains of steps from a
  menu (extra arguments and global and windowed side inputs among them), random inputs
  (timestamps, one or several windows, panes) and bundle cuts (hypothesis): the same
  outputs with the same timestamps, windows and panes, the same user counters under
  the same steps, the same per-step element counts, and
  when a step raises, the same error naming the same step (also when what fails comes
  after the chain's last step, such as encoding the stage's output: the last step is
  named, as Beam's DoFnRunner names it);
* element counts for streaming progress (`counted_outputs`, `count_elements`) of a
  chain's steps equal those of the harness steps, also past a chain's batch size.

The steps on their own (wrappers seen through, a FlatMap's batches, windows in integer
micros) are `test_chain_steps`'s.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import re
import uuid
from collections.abc import Callable, Iterator
from typing import NamedTuple
from unittest import mock

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.metrics import Metrics
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms import environments, userstate, window
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_streams_runner.driver.lineage import worker_plan
from beam_streams_runner.driver.plan import build_plan
from beam_streams_runner.driver.progress import counted_outputs
from beam_streams_runner.errors import StageExecutionError
from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.translators import chain_steps
from beam_streams_runner.translators.operator import OperatorServices
from beam_streams_runner.translators.par_do import FusedStageOperator
from beam_streams_runner.translators.side_inputs import side_input_state
from beam_streams_runner.translators.stateless_chain import STATELESS_CHAIN_URN

pytestmark = pytest.mark.timeout(300)

_STEP = re.compile(r"while running '([^']*)'")


# Planning and driving a stage ----------------------------------------------------------
@contextlib.contextmanager
def _plans(build: Callable[[beam.PCollection], object], global_input: bool = True
           ) -> Iterator[dict[bool, object]]:
    """{stateless_chains: plan} of one pipeline: `Create | [WindowInto(FixedWindows)] |
    'Shuffle' >> Reshuffle()` and then `build(pcoll)`. Both plans come from the same
    pipeline proto, so transform and PCollection ids are the same in both."""
    p = beam.Pipeline()
    start = p | beam.Create([0])
    if not global_input:
        # An interval-window input coder: the stage's input may then carry elements
        # in several windows at once.
        start = start | 'InputWindows' >> beam.WindowInto(window.FixedWindows(10))
    build(start | 'Shuffle' >> beam.Reshuffle())
    p.visit(group_by_key_input_visitor(False))
    proto = p.to_runner_api(
        default_environment=environments.EmbeddedPythonEnvironment.default())
    plans = {chains: build_plan(proto, stateless_chains=chains) for chains in (True, False)}
    try:
        yield plans
    finally:
        for plan in plans.values():
            plan.close()


def _stage(plan, step_name: str):
    # `step_names` are the user's steps, also where the descriptor has a chain.
    (stage,) = [s for s in plan.stages if step_name in s.step_names]
    return stage


def _descriptor(stage) -> beam_fn_api_pb2.ProcessBundleDescriptor:
    return beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)


def _chains(plan) -> list[dict[str, str]]:
    """Every chain transform of the plan, as {step id: step name} of the steps in it."""
    chains = []
    for stage in plan.stages:
        if stage.descriptor is None:
            continue
        for transform in _descriptor(stage).transforms.values():
            if transform.spec.urn == STATELESS_CHAIN_URN:
                steps = beam_runner_api_pb2.Components.FromString(
                    transform.spec.payload).transforms
                chains.append({tid: step.unique_name for tid, step in steps.items()})
    return chains


def _harness_steps(plan) -> set[str]:
    """The names of the transforms the plan's descriptors keep as they are."""
    return {transform.unique_name for stage in plan.stages if stage.descriptor is not None
            for transform in _descriptor(stage).transforms.values()
            if transform.spec.urn != STATELESS_CHAIN_URN}


def _chain_of(plan, step_name: str) -> list[str]:
    (chain,) = [sorted(c.values()) for c in _chains(plan) if step_name in c.values()]
    return chain


class _Run(NamedTuple):
    """What one task of a stage did, or the first line of its error."""

    outputs: collections.Counter | None  # of (value, timestamp micros, windows, pane)
    counters: dict | None  # user counters, {MetricKey: value}
    counts: dict[str, int] | None  # element counts, {PCollection: elements}
    error: str | None


def _run(plan, stage, elements: list[WindowedValue], bundles: list[int],
         counted_pcollections=()) -> _Run:
    """One task of `stage`: `elements` cut into bundles of the sizes `bundles`, each one
    harness bundle of a FusedStageOperator, then the end of its input; the elements of
    `counted_pcollections` counted as streaming progress counts them."""
    runtime = worker_plan(plan, f'test-{uuid.uuid4().hex}', 100, 1).runtime()
    (input_id, _), = stage.inputs.items()
    (output_id, _), = stage.outputs.items()
    encode = runtime.coder_impl(stage.input_coders[input_id]).encode_nested
    counted = counted_outputs([stage], counted_pcollections).get(stage.name, ())
    services = OperatorServices(bundle_size=100, counted=counted, element_counts={},
                                side_inputs=_side_input_state(plan, runtime, stage))
    operator_ = FusedStageOperator(runtime, stage, services)
    records = []
    position = 0
    try:
        for size in bundles:
            chunk = elements[position:position + size]
            position += size
            if chunk:
                records += operator_.process_bundle(
                    [(input_id, b''.join(encode(e) for e in chunk))])
        records += operator_.advance(MAX_WATERMARK)
        records += operator_.finish_task()
    except StageExecutionError as error:
        return _Run(None, None, None, str(error).split('\n', 1)[0])
    coder = runtime.coder_impl(stage.output_coders[output_id])
    outputs = collections.Counter(
        (out.value, out.timestamp.micros, tuple(sorted(out.windows, key=repr)), out.pane_info)
        for _, chunk in records for out in coder.decode_all(chunk))
    totals = operator_.metrics.take()
    counters = dict(totals.parts[0]) if totals is not None else {}
    return _Run(outputs, counters, dict(services.element_counts), None)


def _side_input_state(plan, runtime, stage) -> dict[bytes, bytes]:
    """The side inputs `stage` reads (menu steps' `SIDE_OF`), laid out as the driver
    lays them out, from `SIDE_ELEMENTS` encoded as the stages making them encode."""
    chunks = {}
    for (step, _), (buffer_id, _) in stage.side_inputs.items():
        (coder_id,) = [producer.output_coders[name] for producer in plan.stages
                       for name, buffer in producer.outputs.items() if buffer == buffer_id]
        encode = runtime.coder_impl(coder_id).encode_nested
        elements = SIDE_ELEMENTS[SIDE_OF[step.split('_', 1)[1]]]
        chunks[buffer_id] = [b''.join(encode(e) for e in elements)]
    return side_input_state(plan, stage, chunks)


def _step_pcollections(stage, step_names) -> dict[str, str]:
    """{output PCollection: step name} of the named steps, read from the unchained
    descriptor."""
    return {pcollection: transform.unique_name
            for transform in _descriptor(stage).transforms.values()
            if transform.unique_name in step_names
            for pcollection in transform.outputs.values()}


# 1. The plan ---------------------------------------------------------------------------
class _Stateful(beam.DoFn):
    COUNT = userstate.CombiningValueStateSpec('count', coders.VarIntCoder(), sum)

    def process(self, element, count=beam.DoFn.StateParam(COUNT)):
        count.add(1)
        yield element


class _FinishBundle(beam.DoFn):
    def process(self, element):
        yield element

    def finish_bundle(self):
        pass


def _plus_one(x):
    return x + 1


def test_a_run_of_stateless_steps_becomes_one_chain():
    def build(pcoll):
        return (pcoll
                | 'M' >> beam.Map(_plus_one)
                | 'F' >> beam.Filter(lambda x: x % 2)
                | 'W' >> beam.WindowInto(window.FixedWindows(10))
                | 'FM' >> beam.FlatMap(lambda x: [x, x])
                | 'Out' >> beam.Reshuffle())

    with _plans(build) as plans:
        stage = _stage(plans[True], 'M')
        chained = [t for t in _descriptor(stage).transforms.values()
                   if t.spec.urn == STATELESS_CHAIN_URN]
        assert len(chained) == 1
        steps = beam_runner_api_pb2.Components.FromString(chained[0].spec.payload).transforms
        assert sorted(s.unique_name for s in steps.values()) == ['F', 'FM', 'M', 'W']
        # The chain reads the stage's input and writes its output, and replaces its steps.
        names = {t.unique_name for t in _descriptor(stage).transforms.values()}
        assert not names & {'M', 'F', 'W', 'FM'}
        (chain,) = chained
        assert chain.inputs['in'] == steps['M'].inputs['None']
        assert chain.outputs['out'] == steps['FM'].outputs['None']
        assert stage.step_names == ['M', 'F', 'W', 'FM']  # the user's steps still

        unchained = _stage(plans[False], 'M')
        assert not _chains(plans[False])
        assert {'M', 'F', 'W', 'FM'} <= {t.unique_name
                                          for t in _descriptor(unchained).transforms.values()}


def test_a_global_combines_key_with_void_joins_the_chain():
    # Beam names CombineGlobally's KeyWithVoid DoFn by a URN of its own, not a pickled
    # DoFn: it is as plain as any, and the chain then hands the partial combine whole
    # batches.
    def build(pcoll):
        return pcoll | 'M' >> beam.Map(_plus_one) | 'Sum' >> beam.CombineGlobally(sum)

    with _plans(build) as plans:
        assert _chain_of(plans[True], 'M') == ['M', 'Sum/KeyWithVoid']
        assert 'Sum/KeyWithVoid' in _harness_steps(plans[False])


def test_steps_that_need_the_harness_stay_harness_steps():
    def build(pcoll):
        side = pcoll | 'Side' >> beam.Map(_plus_one)
        pairs = pcoll | 'Pairs' >> beam.Map(lambda x: (x % 3, x))
        _ = (pairs
             | 'Stateful' >> beam.ParDo(_Stateful())
             | 'AfterStateful' >> beam.Map(lambda kv: kv[1])
             | 'WithSideInput' >> beam.Map(lambda x, s: x + len(s), s=beam.pvalue.AsList(side))
             | 'AfterSideInput' >> beam.Map(_plus_one)
             | 'FinishBundle' >> beam.ParDo(_FinishBundle())
             | 'Timestamp' >> beam.Map(lambda x, t=beam.DoFn.TimestampParam: x)
             | 'Last' >> beam.Map(_plus_one)
             | 'Out' >> beam.Reshuffle())

    with _plans(build) as plans:
        in_chains = {name for chain in _chains(plans[True]) for name in chain.values()}
        harness = _harness_steps(plans[True])
        for name in ('Stateful', 'FinishBundle', 'Timestamp'):
            assert name not in in_chains
            assert name in harness
        # The stateless steps around them are chained; a side input is no harness step.
        for name in ('Pairs', 'AfterStateful', 'WithSideInput', 'AfterSideInput', 'Last'):
            assert name in in_chains
            assert name not in harness
        assert _chain_of(plans[True], 'WithSideInput') == [
            'AfterSideInput', 'AfterStateful', 'WithSideInput']
        assert _harness_steps(plans[False]) >= {
            'Pairs', 'Stateful', 'AfterStateful', 'WithSideInput', 'AfterSideInput',
            'FinishBundle', 'Timestamp', 'Last'}


class _Suffixed(beam.DoFn):
    def process(self, element, suffix='!'):
        yield element + suffix


def test_steps_whose_defaults_are_plain_values_join_the_chain():
    # `str.split(sep=None, maxsplit=-1)` and a DoFn's `suffix='!'` are the callables'
    # own defaults, not DoFn parameters: Beam's invoker passes nothing for them.
    def build(pcoll):
        return (pcoll
                | 'Text' >> beam.Map(lambda x: f'{x} {x + 1}')
                | 'Split' >> beam.FlatMap(str.split)
                | 'Suffix' >> beam.ParDo(_Suffixed())
                | 'Pad' >> beam.Map(lambda x, width=6: x.rjust(width))
                | 'Out' >> beam.Reshuffle())

    inputs = [WindowedValue(x, Timestamp(x), (window.GlobalWindow(),)) for x in range(5)]
    with _plans(build) as plans:
        assert _chain_of(plans[True], 'Split') == ['Pad', 'Split', 'Suffix', 'Text']
        runs = [_run(plans[c], _stage(plans[c], 'Split'), inputs, [2, 3]) for c in (True, False)]
    assert runs[0].outputs == runs[1].outputs
    assert sorted(value for value, *_ in runs[0].outputs) == sorted(
        f'{n}!'.rjust(6) for x in range(5) for n in (x, x + 1))


def test_a_pcollection_read_twice_splits_the_run():
    def build(pcoll):
        a = pcoll | 'A' >> beam.Map(_plus_one) | 'B' >> beam.Map(_plus_one)
        # Two branches read B's output.
        _ = a | 'C1' >> beam.Map(_plus_one) | 'D1' >> beam.Map(_plus_one) | 'Out1' >> (
            beam.Reshuffle())
        _ = a | 'C2' >> beam.Filter(bool) | 'Out2' >> beam.Reshuffle()
        # G's output is also a side input of a step in another stage.
        g = (pcoll
             | 'E' >> beam.Map(_plus_one)
             | 'G' >> beam.Map(_plus_one))
        _ = (g
             | 'H' >> beam.Map(_plus_one)
             | 'I' >> beam.Map(_plus_one)
             | 'Out3' >> beam.Reshuffle())
        _ = (pcoll
             | 'Other' >> beam.Reshuffle()
             | 'ReadsG' >> beam.Map(lambda x, s: x, s=beam.pvalue.AsList(g)))

    with _plans(build) as plans:
        plan = plans[True]
        assert _chain_of(plan, 'A') == ['A', 'B']
        assert _chain_of(plan, 'C1') == ['C1', 'D1']
        assert _chain_of(plan, 'C2') == ['C2']
        assert _chain_of(plan, 'E') == ['E', 'G']
        assert _chain_of(plan, 'H') == ['H', 'I']
        # Without the split these would be one stage's steps: the chains are cut by the
        # second reader, not by the fusion.
        assert {'A', 'B', 'C1', 'C2'} <= set(_stage(plan, 'A').step_names)
        assert {'E', 'G', 'H'} <= set(_stage(plan, 'E').step_names)


def _triple(x):
    return 3 * x


# 3. Chained and unchained stages agree (hypothesis) ------------------------------------
def _counted_triple_plus_one(x):
    # The same counter in several steps: it must be reported under each one's own step.
    Metrics.counter('chain', 'seen').inc()
    return 3 * x + 1


def _pairs_then_some(x):
    if x % 2:
        return [x, x + 1]
    return [x]


def _generator(x):
    Metrics.counter('chain', 'seen').inc()
    yield x
    if x % 3 == 0:
        yield x // 3


def _none_on_fives(x):
    return None if x % 5 == 0 else [x - 2]


def _timestamped(x):
    return window.TimestampedValue(x, x % 50)


def _fails_on_multiples_of_13(x):
    if x % 13 == 0:
        raise ValueError(f'no multiples of 13 ({x})')
    return x + 2


class _BundleCounting(beam.DoFn):
    """Counts its setups and bundles: each bundle's elements add the bundle's number."""

    def setup(self):
        self.setups = getattr(self, 'setups', 0) + 1
        self.bundles = 0

    def start_bundle(self):
        self.bundles += 1
        Metrics.counter('chain', 'bundles').inc()

    def process(self, element):
        Metrics.counter('chain', 'bundle_numbers').inc(self.bundles)
        Metrics.counter('chain', 'setups').inc(self.setups)
        return [element + 1]


class _ReturnsList(beam.DoFn):
    # A class DoFn that returns (Beam checks its first result is no str, bytes or dict).
    def process(self, element):
        return [element, -element] if element % 3 else []


class _Undeclared(beam.DoFn):
    def process(self, element):
        Metrics.counter('chain', 'seen').inc()
        yield beam.pvalue.TaggedOutput('undeclared', -element)
        yield element


def _scaled_by(x, factor, offset=0):
    return x * factor + offset


def _plus_sum(x, values):
    return x + sum(values)


def _repeated(x, times):
    return [x] * (x % times)


def _key_in(x, lookup):
    return x % 7 in lookup


class _MinusSmallest(beam.DoFn):
    def process(self, element, values):
        Metrics.counter('chain', 'seen').inc()
        yield element - min(values, default=0)


# The side inputs menu steps read: how each is made, and its elements as the stage
# making it hands them on (`_run` lays them out as the driver does).
def _sides(pipeline: beam.Pipeline) -> dict[str, beam.PCollection]:
    return {
        'one': pipeline | 'SideOne' >> beam.Create([3]),
        'pairs': pipeline | 'SidePairs' >> beam.Create([(0, 'a'), (3, 'b'), (5, 'c')]),
        'windowed': (pipeline
                     | 'SideValues' >> beam.Create(range(0, 45, 4))
                     | 'SideStamps' >> beam.Map(lambda v: window.TimestampedValue(v, v))
                     | 'SideWindows' >> beam.WindowInto(window.FixedWindows(10))),
    }


_GLOBAL = (window.GlobalWindow(),)
SIDE_ELEMENTS = {
    'one': [WindowedValue(3, Timestamp(0), _GLOBAL)],
    'pairs': [WindowedValue(kv, Timestamp(0), _GLOBAL) for kv in ((0, 'a'), (3, 'b'), (5, 'c'))],
    'windowed': [WindowedValue(v, Timestamp(v), (window.IntervalWindow(v // 10 * 10,
                                                                        v // 10 * 10 + 10),))
                 for v in range(0, 45, 4)],
}
# Which side input a menu step reads, by its label suffix.
SIDE_OF = {'side_list': 'windowed', 'side_singleton': 'one', 'side_dict': 'pairs',
           'side_iter_dofn': 'windowed'}

# Each menu item: (label suffix, transform) steps on ints, giving ints, given the side
# inputs (`_sides`).
MENU: dict[str, Callable[[dict], list[tuple[str, beam.PTransform]]]] = {
    'map': lambda _: [('map', beam.Map(_counted_triple_plus_one))],
    'filter': lambda _: [('filter', beam.Filter(lambda x: x % 4 != 1))],
    'flat_map_list': lambda _: [('flat_map_list', beam.FlatMap(_pairs_then_some))],
    'flat_map_generator': lambda _: [('flat_map_generator', beam.FlatMap(_generator))],
    'flat_map_none': lambda _: [('flat_map_none', beam.FlatMap(_none_on_fives))],
    'map_tuple': lambda _: [('pair', beam.Map(lambda x: (x, x % 3))),
                          ('map_tuple', beam.MapTuple(lambda a, b: a * 2 - b))],
    'timestamped': lambda _: [('timestamped', beam.Map(_timestamped))],
    'fixed': lambda _: [('fixed', beam.WindowInto(window.FixedWindows(7)))],
    'sliding': lambda _: [('sliding', beam.WindowInto(window.SlidingWindows(10, 4)))],
    'class_dofn': lambda _: [('class_dofn', beam.ParDo(_BundleCounting()))],
    'class_returns_list': lambda _: [('class_returns_list', beam.ParDo(_ReturnsList()))],
    'flat_map_tuple': lambda _: [('pair_of_two', beam.Map(lambda x: (x, 2))),
                               ('flat_map_tuple', beam.FlatMapTuple(lambda a, b: [a] * b))],
    'undeclared': lambda _: [('undeclared', beam.ParDo(_Undeclared()))],
    'raising': lambda _: [('raising', beam.Map(_fails_on_multiples_of_13))],
    'extra_args': lambda _: [('extra_args', beam.Map(_scaled_by, 3, offset=1))],
    'side_list': lambda sides: [
        ('side_list', beam.Map(_plus_sum, beam.pvalue.AsList(sides['windowed'])))],
    'side_singleton': lambda sides: [
        ('side_singleton', beam.FlatMap(_repeated, times=beam.pvalue.AsSingleton(sides['one'])))],
    'side_dict': lambda sides: [
        ('side_dict', beam.Filter(_key_in, beam.pvalue.AsDict(sides['pairs'])))],
    'side_iter_dofn': lambda sides: [
        ('side_iter_dofn', beam.ParDo(_MinusSmallest(), beam.pvalue.AsIter(sides['windowed'])))],
}

_WINDOWS = [window.IntervalWindow(0, 10), window.IntervalWindow(10, 20),
            window.IntervalWindow(5, 15), window.IntervalWindow(-20, 40)]
_PANES = [PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0),
          PaneInfo(True, False, PaneInfoTiming.EARLY, 0, -1),
          PaneInfo(False, False, PaneInfoTiming.ON_TIME, 2, 0),
          PaneInfo(False, True, PaneInfoTiming.LATE, 4, 2)]

_element = st.tuples(
    st.integers(-40, 150),  # value
    st.integers(-5_000, 60_000),  # timestamp, ms (the coder keeps ms)
    st.lists(st.sampled_from(range(len(_WINDOWS))), min_size=1, max_size=3),  # windows
    st.sampled_from(range(len(_PANES))))
# Drawn length first: hypothesis's own lists are mostly short, and a task of a few
# elements seldom has several bundles.
_elements = st.integers(0, 60).flatmap(
    lambda n: st.lists(_element, min_size=n, max_size=n))


def _windowed(elements, global_input: bool) -> list[WindowedValue]:
    return [WindowedValue(
        value, Timestamp(micros=ms * 1000),
        (window.GlobalWindow(),) if global_input else tuple(_WINDOWS[w] for w in windows),
        _PANES[pane]) for value, ms, windows, pane in elements]


def _bundle_sizes(total: int, sizes: list[int]) -> list[int]:
    """`sizes` as far as they go, then a bundle of what is left."""
    bounds = sorted({0, total, *(b for b in itertools.accumulate(sizes) if b < total)})
    return [b - a for a, b in itertools.pairwise(bounds)]


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(menu=st.lists(st.sampled_from(sorted(MENU)), min_size=1, max_size=6).filter(
           lambda items: items.count('raising') <= 1),
       global_input=st.booleans(),
       elements=_elements,
       sizes=st.lists(st.integers(1, 15), min_size=1, max_size=6),
       flush_at=st.sampled_from([1, 3, chain_steps.FLUSH_AT]))
def test_chained_and_unchained_stages_agree(menu, global_input, elements, sizes, flush_at):
    names: list[str] = []

    def build(pcoll):
        sides = _sides(pcoll.pipeline)
        steps = [(f's{i}_{suffix}', transform)
                 for i, item in enumerate(menu) for suffix, transform in MENU[item](sides)]
        names.extend(name for name, _ in steps)
        for name, transform in steps:
            pcoll = pcoll | name >> transform
        return pcoll | 'Out' >> beam.Reshuffle()

    inputs = _windowed(elements, global_input)
    bundles = _bundle_sizes(len(inputs), sizes)
    with _plans(build, global_input) as plans:
        chained_stage, unchained_stage = (_stage(plans[c], names[0]) for c in (True, False))
        # The whole menu run is one chain (every item is chainable).
        assert _chain_of(plans[True], names[0]) == sorted(names)
        pcollections = _step_pcollections(unchained_stage, names)
        # A small batch size makes a chain flush in the middle of a harness bundle.
        with mock.patch.object(chain_steps, 'FLUSH_AT', flush_at):
            chained = _run(plans[True], chained_stage, inputs, bundles, pcollections)
        unchained = _run(plans[False], unchained_stage, inputs, bundles, pcollections)

    if unchained.error is not None or chained.error is not None:
        # Both fail, the same way, naming the same step (the one that can fail).
        assert chained.error == unchained.error
        (raising,) = [name for name in names if name.endswith('_raising')]
        assert _STEP.findall(chained.error) == [raising]
        assert 'ValueError: no multiples of 13' in chained.error
        return
    assert chained.outputs == unchained.outputs
    assert chained.counters == unchained.counters
    assert chained.counts == unchained.counts
    if inputs:  # (a task without bundles counts nothing)
        assert set(chained.counts) == set(pcollections)
    # Every counter is under a step that increments it.
    counting = ('_map', '_flat_map_generator', '_class_dofn', '_undeclared', '_side_iter_dofn')
    assert all(key.step.endswith(counting) for key in chained.counters)


def test_windows_timestamps_and_panes_survive_a_chain():
    # The property compares the two paths; this pins what both do on a small case: a
    # plain output keeps its input's windows, timestamp and pane; a TimestampedValue is
    # assigned its windows again, once per window of its input (Beam's output handler
    # multiplies them); an undeclared tagged output is dropped.
    def build(pcoll):
        return (pcoll
                | 'Plus' >> beam.Map(_plus_one)
                | 'Undeclared' >> beam.ParDo(_Undeclared())
                | 'Branch' >> beam.FlatMap(
                    lambda x: [x] if x < 100 else [window.TimestampedValue(x, 12)])
                | 'Out' >> beam.Reshuffle())

    pane = _PANES[3]
    two = (window.IntervalWindow(0, 10), window.IntervalWindow(10, 20))
    inputs = [WindowedValue(1, Timestamp(3), two, pane),
              WindowedValue(199, Timestamp(7), two[:1], pane),
              WindowedValue(149, Timestamp(7), two, pane)]
    with _plans(build, global_input=False) as plans:
        runs = [_run(plans[c], _stage(plans[c], 'Plus'), inputs, [3]) for c in (True, False)]
    assert runs[0].outputs == runs[1].outputs
    no_pane = PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0)
    ten_to_twenty = window.IntervalWindow(10, 20)
    assert runs[0].outputs == collections.Counter({
        (2, 3_000_000, two, pane): 1,
        (200, 12_000_000, (ten_to_twenty,), no_pane): 1,
        (150, 12_000_000, (ten_to_twenty, ten_to_twenty), no_pane): 1,
    })


def test_a_failing_step_is_named_the_same_way():
    def build(pcoll):
        return (pcoll
                | 'Before' >> beam.Map(_plus_one)
                | 'Fails' >> beam.Map(_fails_on_multiples_of_13)
                | 'After' >> beam.Filter(bool)
                | 'Out' >> beam.Reshuffle())

    inputs = _windowed([(v, 0, [0], 0) for v in (1, 2, 25, 5)], global_input=True)
    with _plans(build) as plans:
        runs = [_run(plans[c], _stage(plans[c], 'Fails'), inputs, [2, 2]) for c in (True, False)]
    assert runs[0].error == runs[1].error
    assert runs[0].error.startswith("Beam step 'Fails' failed: ValueError: no multiples of 13")
    assert "[while running 'Fails']" in runs[0].error


@pytest.mark.parametrize('harness_step_before', [False, True])
def test_a_failure_past_the_chains_last_step_is_named_the_same_way(harness_step_before):
    # Beam's DoFnRunner tags whatever its receivers raise too (a step downstream that
    # is no DoFn, the stage's data output encoding an element of the wrong type).
    def build(pcoll):
        if harness_step_before:  # (a DoFn parameter keeps it out of the chain)
            pcoll = pcoll | 'Harness' >> beam.Map(lambda x, t=beam.DoFn.TimestampParam: x)
        return (pcoll
                | 'First' >> beam.Map(_plus_one)
                | 'Last' >> beam.Map(lambda x: 'text' if x == 3 else x).with_output_types(int)
                | 'Out' >> beam.Reshuffle())

    inputs = _windowed([(v, 0, [0], 0) for v in (1, 2, 5)], global_input=True)
    with _plans(build) as plans, mock.patch.object(chain_steps, 'FLUSH_AT', 1):
        runs = [_run(plans[c], _stage(plans[c], 'Last'), inputs, [3]) for c in (True, False)]
    assert runs[1].error == (
        "Beam step 'Last' failed: TypeError: an integer is required [while running 'Last']")
    assert runs[0].error == runs[1].error


def test_a_side_input_is_read_once_per_window_and_bundle():
    # Beam's invoker looks a windowed side input up per element (its window mapped each
    # time); a chain per window and bundle, the view dropped when the bundle ends.
    def build(pcoll):
        sides = _sides(pcoll.pipeline)
        return (pcoll
                # (named as the menu's step reading that side input: see `_run`)
                | 's0_side_list' >> beam.Map(_plus_sum, beam.pvalue.AsList(sides['windowed']))
                | 'Out' >> beam.Reshuffle())

    inputs = [WindowedValue(v, Timestamp(v % 20), (_WINDOWS[v % 2],)) for v in range(300)]
    lookups: collections.Counter = collections.Counter()
    original = bundle_processor.StateBackedSideInputMap.__getitem__

    def counted(side_input, window):
        lookups[window] += 1
        return original(side_input, window)

    with _plans(build, global_input=False) as plans, mock.patch.object(
            bundle_processor.StateBackedSideInputMap, '__getitem__', counted):
        runs = {}
        for chains in (True, False):
            lookups.clear()
            stage = _stage(plans[chains], 's0_side_list')
            runs[chains] = _run(plans[chains], stage, inputs, [200, 100])
            runs[chains] = runs[chains], dict(lookups)
    assert runs[True][0].outputs == runs[False][0].outputs
    # Two windows, two bundles.
    assert runs[True][1] == {_WINDOWS[0]: 2, _WINDOWS[1]: 2}
    assert runs[False][1] == {_WINDOWS[0]: 150, _WINDOWS[1]: 150}
    # [0, 10) reads 0, 4, 8; [10, 20) reads 12, 16.
    assert sorted(value for value, *_ in runs[True][0].outputs) == sorted(
        v + (12 if v % 2 == 0 else 28) for v in range(300))


# 4. Element counts ---------------------------------------------------------------------
def test_element_counts_of_a_chains_steps_are_the_harness_steps_counts():
    def build(pcoll):
        return (pcoll
                | 'Triple' >> beam.Map(_triple)
                | 'Odd' >> beam.Filter(lambda x: x % 2)
                | 'Twice' >> beam.FlatMap(lambda x: [x, -x])
                | 'Sliding' >> beam.WindowInto(window.SlidingWindows(10, 5))
                | 'Out' >> beam.Reshuffle())

    names = ['Triple', 'Odd', 'Twice', 'Sliding']
    # Past the chain's batch size within one harness bundle, and in several bundles;
    # a third of the elements in two windows.
    values = list(range(2_500))
    inputs = [WindowedValue(v, Timestamp(v % 60), _WINDOWS[:1 + (v % 3 == 0)], _PANES[0])
              for v in values]
    with _plans(build, global_input=False) as plans:
        pcollections = _step_pcollections(_stage(plans[False], 'Triple'), names)
        chained_counted = counted_outputs(plans[True].stages, pcollections)
        (chain_counted,) = chained_counted.values()
        # Counted in the chain's transform, by each step's own id.
        assert {c.transform_id for c in chain_counted} == {'Triple/StatelessChain'}
        assert sorted(c.tag for c in chain_counted) == sorted(names)
        runs = {c: _run(plans[c], _stage(plans[c], 'Triple'), inputs, [2_200, 300], pcollections)
                for c in (True, False)}
    assert runs[True].counts == runs[False].counts
    odd = sum(1 for v in values if v % 2)
    odd_two_windows = sum(1 for v in values if v % 2 and v % 3 == 0)
    assert {pcollections[pc]: n for pc, n in runs[True].counts.items()} == {
        'Triple': len(values),
        'Odd': odd,
        'Twice': 2 * odd,
        # An element in two windows becomes two elements.
        'Sliding': 2 * (odd + odd_two_windows),
    }
    assert runs[True].outputs == runs[False].outputs
