"""Stateless chains: runs of fused Map/FlatMap/Filter/WindowInto steps as composed calls.

Design section 9 (the paper's ParDo specialisations). Beam's SDK harness runs every
fused step as an operation of its own: per element and step a DoFnRunner, an invoker, an
output handler and a receiver with its counters. `fuse_stateless_chains` rewrites a
stage's ProcessBundleDescriptor at plan time: each maximal linear run of steps that need
none of that becomes one transform (`STATELESS_CHAIN_URN`), built by the harness as one
`StatelessChainOperation`. It gathers its input into batches (`chain_steps.FLUSH_AT`
elements, and what is left when the bundle finishes) and runs each step over a whole
batch (`chain_steps`: the values in a list, each with the WindowedValue whose windows,
timestamp and pane it carries, untouched until a step changes them; a FlatMap hands its
outputs on in batches too, so one element's million outputs never pile up).

A step joins a chain when Beam's harness would call its DoFn without asking it for
more than its element, its extra arguments and its side inputs: a ParDo with one main
input and one output whose DoFn is not stateful nor splittable, takes no DoFn
parameters, defines no `finish_bundle` (it could output) nor `process_batch` and yields
no batches, asks for no bundle finalization and carries no runtime type checks; or a
WindowInto. A step with extra arguments or side inputs is `chain_arguments`' (its side
inputs read once per window and bundle). Everything else keeps the harness. What stays
per step: its user metrics (reported under its transform id), its output element count
(the streaming progress), `setup`/`start_bundle`/`teardown`, and its name in errors, as
Beam's DoFnRunner gives it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import Protocol

from apache_beam.internal import pickler
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import common
from apache_beam.runners.portability.fn_api_runner.translations import PAR_DO_URNS
from apache_beam.runners.worker import bundle_processor, operation_specs, operations
from apache_beam.transforms import core
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.translators import chain_steps
from beam_streams_runner.translators.chain_arguments import ArgumentsParDoStep, side_input_maps
from beam_streams_runner.translators.chain_steps import (
    AssignWindowsStep,
    ChainStep,
    ParDoStep,
    dofn_info,
    overrides,
)
from beam_streams_runner.translators.file_writes import FileWriteBatches, is_batch_file_write
from beam_streams_runner.translators.partial_combine import TaskPartialCombine

STATELESS_CHAIN_URN = 'beam_streams_runner:stateless_chain:v1'
_PAR_DO = common_urns.primitives.PAR_DO.urn
_ASSIGN_WINDOWS = common_urns.primitives.ASSIGN_WINDOWS.urn
_STATELESS_DOFN_URNS = (python_urns.KEY_WITH_NONE_DOFN,)


# Plan side ---------------------------------------------------------------------------
def fuse_stateless_chains(
    descriptor: beam_fn_api_pb2.ProcessBundleDescriptor,
) -> beam_fn_api_pb2.ProcessBundleDescriptor:
    """`descriptor` with each maximal linear run of chainable steps replaced by one
    stateless-chain transform (a copy; `descriptor` itself is left as it is)."""
    transforms = descriptor.transforms
    consumers: dict[str, list[str]] = collections.defaultdict(list)
    for transform_id, transform in transforms.items():
        for pcollection in transform.inputs.values():
            consumers[pcollection].append(transform_id)
    chainable = {tid for tid, t in transforms.items() if is_chainable(t)}
    if not chainable:
        return descriptor

    def successor(transform_id: str) -> str | None:
        # Only a step whose output nothing else reads (no other step, data output or
        # side input) hands it on inside the chain, to a step reading it as its main input.
        (output,) = transforms[transform_id].outputs.values()
        readers = consumers.get(output, [])
        if len(readers) != 1 or readers[0] not in chainable:
            return None
        return readers[0] if main_input(transforms[readers[0]]) == output else None

    continued = {s for tid in chainable if (s := successor(tid)) is not None}
    fused = beam_fn_api_pb2.ProcessBundleDescriptor()
    fused.CopyFrom(descriptor)
    for start in sorted(chainable - continued):
        chain = [start]
        while (following := successor(chain[-1])) is not None:
            chain.append(following)
        _replace_chain(fused, chain)
    return fused


def _replace_chain(descriptor: beam_fn_api_pb2.ProcessBundleDescriptor,
                   chain: list[str]) -> None:
    steps = [descriptor.transforms[tid] for tid in chain]
    chain_id = f'{chain[0]}/StatelessChain'
    while chain_id in descriptor.transforms:
        chain_id += '_'
    payload = beam_runner_api_pb2.Components(
        transforms={tid: step for tid, step in zip(chain, steps, strict=True)})
    replacement = beam_runner_api_pb2.PTransform(
        unique_name=f"StatelessChain({', '.join(s.unique_name for s in steps)})",
        spec=beam_runner_api_pb2.FunctionSpec(
            urn=STATELESS_CHAIN_URN, payload=payload.SerializeToString()),
        inputs={'in': main_input(steps[0])},
        outputs={'out': next(iter(steps[-1].outputs.values()))},
        environment_id=steps[0].environment_id)
    for tid in chain:
        del descriptor.transforms[tid]
    descriptor.transforms[chain_id].CopyFrom(replacement)


def main_input(transform: beam_runner_api_pb2.PTransform) -> str:
    """The PCollection a step reads as its main input (a ParDo's other inputs are its
    side inputs)."""
    side_inputs = ()
    if transform.spec.urn in PAR_DO_URNS:
        side_inputs = beam_runner_api_pb2.ParDoPayload.FromString(
            transform.spec.payload).side_inputs
    return next(pc for tag, pc in transform.inputs.items() if tag not in side_inputs)


def is_chainable(transform: beam_runner_api_pb2.PTransform) -> bool:
    """Whether a fused step can run inside a stateless chain (see the module doc)."""
    if len(transform.outputs) != 1:
        return False
    if transform.spec.urn == _ASSIGN_WINDOWS:
        return len(transform.inputs) == 1
    if transform.spec.urn != _PAR_DO:
        return False
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    if len(transform.inputs) != 1 + len(payload.side_inputs):
        return False
    if (payload.state_specs or payload.timer_family_specs
            or payload.restriction_coder_id or payload.requests_finalization
            or payload.requires_time_sorted_input):
        return False
    # A pickled DoFn, or one of the DoFns Beam names by a URN of its own (the
    # `KeyWithVoid` of every CombineGlobally).
    if payload.do_fn.urn not in (python_urns.PICKLED_DOFN_INFO, *_STATELESS_DOFN_URNS):
        return False
    info = dofn_info(payload.do_fn)
    if info is None:
        return False
    fn, args, kwargs, side_inputs, _ = info
    return is_plain_dofn(fn, args, kwargs, side_inputs)


def is_plain_dofn(fn: core.DoFn, args, kwargs, side_inputs) -> bool:
    """Whether Beam's invoker would pass `fn` nothing but its element and extra
    arguments, and the chain can run it without its DoFnRunner (no bundle method that
    could output). Extra arguments (side inputs among them) are passed as Beam's
    invoker passes them (`chain_arguments`), unless one asks for a DoFn parameter."""
    if side_inputs or hasattr(fn, '_runtime_output_constraints'):
        return False
    if any(map(_is_dofn_param, (*(args or ()), *(kwargs or {}).values()))):
        return False
    signature = common.DoFnSignature(fn)
    if (signature.is_stateful_dofn() or signature.is_splittable_dofn()
            or any(map(_is_dofn_param, signature.process_method.defaults))):
        return False
    if (overrides(fn, 'finish_bundle') or overrides(fn, 'process_batch')
            or fn._process_yields_batches):
        return False
    return not any(method.defaults for method in (
        signature.setup_lifecycle_method, signature.start_bundle_method,
        signature.teardown_lifecycle_method))


def _is_dofn_param(default) -> bool:
    """Whether a default of `process` asks the harness for a parameter (the element's
    timestamp, window, state...). Any other default is the callable's own: Beam's
    invoker passes nothing for it (`str.split`'s `sep=None`), as the chain does."""
    param = type(core.DoFn.ElementParam)  # every DoFn parameter's base class
    return isinstance(default, param) or (isinstance(default, type) and issubclass(default, param))


def chain_step_outputs(transform: beam_runner_api_pb2.PTransform
                       ) -> Iterator[tuple[str, str]]:
    """(tag, PCollection) of every output a step emits; for a stateless chain, of each
    of its steps, tagged with the step's transform id (see `elements_of`)."""
    if transform.spec.urn != STATELESS_CHAIN_URN:
        yield from transform.outputs.items()
        return
    steps = beam_runner_api_pb2.Components.FromString(transform.spec.payload).transforms
    for step_id, step in steps.items():
        for pcollection in step.outputs.values():
            yield step_id, pcollection


def descriptor_steps(descriptor: beam_fn_api_pb2.ProcessBundleDescriptor
                     ) -> Iterator[tuple[str, beam_runner_api_pb2.PTransform]]:
    """(transform id, transform) of every step of a stage, the steps of its stateless
    chains each on its own (a step with side inputs may be in a chain)."""
    for transform_id, transform in descriptor.transforms.items():
        if transform.spec.urn == STATELESS_CHAIN_URN:
            yield from beam_runner_api_pb2.Components.FromString(
                transform.spec.payload).transforms.items()
        else:
            yield transform_id, transform


class StatelessChainOperation(operations.Operation):
    """A chain of stateless steps as one harness operation (see the module doc)."""

    def __init__(self, name_context: common.NameContext, spec, counter_factory,
                 state_sampler, steps: list[ChainStep]) -> None:
        super().__init__(name_context, spec, counter_factory, state_sampler)
        self.steps = steps
        self._pending: list[WindowedValue] = []
        # The chain's one consumer when it takes whole batches (`batch_consumer_of`).
        self.batch_consumer: BatchConsumer | None = None

    def setup(self, data_sampler=None) -> None:
        super().setup(data_sampler)
        for step in self.steps:
            self._lifecycle(step, 'setup')

    def start(self) -> None:
        super().start()
        for step in self.steps:
            result = self._lifecycle(step, 'start_bundle')
            if result is not None:
                step.fail(RuntimeError(
                    f'Start Bundle should not output any elements but got {result}'))

    def process(self, o: WindowedValue) -> None:
        pending = self._pending
        pending.append(o)
        if len(pending) >= chain_steps.FLUSH_AT:
            self._flush()

    def add_batch(self, values: list, bases: list) -> None:
        """`process` of a batch at once: `values[i]` carrying the windows, timestamp
        and pane of `bases[i]` (a bulk read hands its records on so)."""
        self._flush()
        self._push(0, values, bases)

    def finish(self) -> None:
        self._flush()
        super().finish()

    def _flush(self) -> None:
        bases = self._pending
        if not bases:
            return
        self._pending = []
        self._push(0, [windowed.value for windowed in bases], bases)

    def _push(self, index: int, values: list, bases: list) -> None:
        """Runs steps `index`... over a batch, and sends what the last one emits on."""
        if index < len(self.steps):
            for out_values, out_bases in self.steps[index].apply(values, bases):
                self._push(index + 1, out_values, out_bases)
            return
        try:
            hand_on(self, values, bases)
        except BaseException as exn:  # noqa: BLE001
            # Beam's DoFnRunner of the last step covers what its outputs run into (the
            # next operation, the encoding of a data output): a failure there that no
            # step named is named after it.
            self.steps[-1].fail(exn)

    def teardown(self) -> None:
        for step in self.steps:
            self._lifecycle(step, 'teardown')
        super().teardown()

    def reset(self) -> None:
        super().reset()
        self._pending = []
        for step in self.steps:
            step.reset()

    def _lifecycle(self, step: ChainStep, method: str):
        if step.fn is None or not overrides(step.fn, method):
            return None
        with step.scoped_state:
            try:
                return getattr(step.fn, method)()
            except BaseException as exn:  # noqa: BLE001 - Beam tags any failure
                step.fail(exn)

    def metric_containers(self) -> Iterable[tuple[str, object]]:
        return [(step.transform_id, step.metrics_container) for step in self.steps]

    def elements_of(self, step_id: str) -> int:
        """The elements the step `step_id` emitted in this bundle."""
        return next(step.elements for step in self.steps if step.transform_id == step_id)


def hand_on(op: operations.Operation, values: list, bases: list) -> None:
    """Sends a batch on from `op`: whole to its batch consumer, if it has one, else one
    element at a time to its receiver."""
    if op.batch_consumer is not None:
        op.batch_consumer.add_batch(values, bases)
        return
    receive = op.receivers[0].receive
    for value, base in zip(values, bases, strict=True):
        receive(base if base.value is value else base.with_value(value))


def metric_containers(transform_id: str, op) -> Iterable[tuple[str, object]]:
    """(transform id, metrics container) of each step a harness operation runs."""
    own = getattr(op, 'metric_containers', None)  # a stateless chain, a bulk read
    if own is not None:
        return own()
    return ((transform_id, op.metrics_container),)


@bundle_processor.BeamTransformFactory.register_urn(STATELESS_CHAIN_URN, None)
def _create_stateless_chain(factory, transform_id: str,
                            transform_proto: beam_runner_api_pb2.PTransform,
                            payload: bytes, consumers) -> StatelessChainOperation:
    transforms = beam_runner_api_pb2.Components.FromString(payload).transforms
    by_input = {main_input(t): tid for tid, t in transforms.items()}
    steps, pcollection = [], transform_proto.inputs['in']
    while pcollection in by_input:
        step_id = by_input[pcollection]
        steps.append(_build_step(factory, step_id, transforms[step_id]))
        pcollection = next(iter(transforms[step_id].outputs.values()))
    op = StatelessChainOperation(
        common.NameContext(transform_proto.unique_name, transform_id),
        operation_specs.WorkerFlatten(None, [factory.get_only_output_coder(transform_proto)]),
        factory.counter_factory, factory.state_sampler, steps)
    op.batch_consumer = batch_consumer_of(
        [reader for ops in consumers.values() for reader in ops], factory.descriptor)
    return factory.augment_oldstyle_op(op, transform_proto.unique_name, consumers)


class BatchConsumer(Protocol):
    """A step's one reader that takes a batch at once: `values[i]` carrying the windows,
    timestamp and pane of the WindowedValue `bases[i]`."""

    def add_batch(self, values: list, bases: list) -> None: ...


class DataOutputBatches:
    """A stage's data output fed a chain's batch at once: each element encoded
    straight into the output stream, whose size is checked once per batch."""

    def __init__(self, output: bundle_processor.DataOutputOperation) -> None:
        self.output = output

    def add_batch(self, values: list, bases: list) -> None:
        output = self.output
        encode, stream = output.windowed_coder_impl.encode_to_stream, output.output_stream
        for value, base in zip(values, bases, strict=True):
            encode(base if base.value is value else base.with_value(value), stream, True)
        stream.maybe_flush()


def batch_consumer_of(readers: list, descriptor: beam_fn_api_pb2.ProcessBundleDescriptor
                      ) -> BatchConsumer | None:
    """What takes a step's batches whole, when its output has one reader that can: a
    stateless chain, a task's partial combine, the stage's data output or a file sink's
    bundle writer. Others get elements one by one through the harness's receivers
    (which also count them)."""
    if len(readers) != 1:
        return None
    reader = readers[0]
    if isinstance(reader, StatelessChainOperation | TaskPartialCombine):
        return reader
    if type(reader) is bundle_processor.DataOutputOperation:
        return DataOutputBatches(reader)
    if isinstance(reader, operations.DoOperation) and is_batch_file_write(
            descriptor.transforms[reader.name_context.transform_id]):
        return FileWriteBatches(reader)
    return None


def _build_step(factory, transform_id: str, transform: beam_runner_api_pb2.PTransform
                ) -> ChainStep:
    if transform.spec.urn == _ASSIGN_WINDOWS:
        windowing = core.Windowing.from_runner_api(
            beam_runner_api_pb2.WindowingStrategy.FromString(transform.spec.payload),
            factory.context)
        return AssignWindowsStep(transform_id, transform.unique_name,
                                  factory.state_sampler, windowing.windowfn)
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    fn, args, kwargs, _, windowing = pickler.loads(
        core.DoFnInfo.from_runner_api(payload.do_fn, factory.context).serialized_dofn_data())
    if windowing is None:
        windowing = factory.context.windowing_strategies.get_by_id(
            factory.descriptor.pcollections[main_input(transform)].windowing_strategy_id)
    step = (transform_id, transform.unique_name, factory.state_sampler, fn,
            windowing.windowfn, next(iter(transform.outputs)))
    if not (args or kwargs or payload.side_inputs):
        return ParDoStep(*step)
    return ArgumentsParDoStep(*step, args, kwargs,
                              side_input_maps(factory, transform_id, transform, payload))
