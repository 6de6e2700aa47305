"""Stateless chains: runs of fused Map/FlatMap/Filter/WindowInto steps as composed calls.

Design section 9 (the paper's ParDo specialisations). Beam's SDK harness runs every
fused step as an operation of its own: per element and step a DoFnRunner, an invoker, an
output handler and a receiver with its counters. `fuse_stateless_chains` rewrites a
stage's ProcessBundleDescriptor at plan time: each maximal linear run of steps that need
none of that becomes one transform (`STATELESS_CHAIN_URN`), built by the harness as one
`StatelessChainOperation`. It gathers its input into batches (`FLUSH_AT` elements, and
what is left when the bundle finishes) and runs each step over a whole batch (a FlatMap
hands its outputs on every `FLUSH_AT` of them, so one element's million outputs never
pile up): the values in a list, each with the WindowedValue whose windows, timestamp and
pane it carries, untouched until a step changes them. Beam's Map, MapTuple and Filter
wrappers are seen through (`unwrapped_callable`), so a Map step is one list
comprehension over the user's function; fixed and sliding windows are assigned in
integer micros (`integer_assign`), each window made once per batch. Outputs go on as
Beam's output handler would send them: plain values keep their input's windows,
timestamp and pane; a `TimestampedValue` is assigned windows again; a `WindowedValue` is
taken as it is; a `TaggedOutput` to a tag the step does not declare is dropped, as the
harness drops it.

A step joins a chain when Beam's harness would call its DoFn through its
`SimpleInvoker`: a ParDo with one input and one output whose DoFn is not stateful nor
splittable, takes no side inputs, extra arguments or DoFn parameters, defines no
`finish_bundle` (it could output) nor `process_batch` and yields no batches, asks for no
bundle finalization and carries no runtime type checks; or a WindowInto. Everything else
keeps the harness. What stays per step: its user metrics (a metrics container and a
scoped state of its own, reported under its transform id), its output element count (the
streaming progress), `setup`/`start_bundle`/`teardown`, and its name in errors (" [while
running 'Step']", as Beam's DoFnRunner adds it).
"""

from __future__ import annotations

import collections
import inspect
import itertools
import traceback
from collections.abc import Callable, Hashable, Iterable, Iterator

from apache_beam.internal import pickler
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.pvalue import TaggedOutput
from apache_beam.runners import common
from apache_beam.runners.worker import bundle_processor, operation_specs, operations
from apache_beam.transforms import core
from apache_beam.transforms.window import (
    FixedWindows,
    GlobalWindow,
    GlobalWindows,
    IntervalWindow,
    SlidingWindows,
    TimestampedValue,
    WindowFn,
)
from apache_beam.utils import windowed_value
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

STATELESS_CHAIN_URN = 'beam_streams_runner:stateless_chain:v1'
_PAR_DO = common_urns.primitives.PAR_DO.urn
_ASSIGN_WINDOWS = common_urns.primitives.ASSIGN_WINDOWS.urn
# Results that are not plain values: Beam's output handler treats each specially.
_SPECIAL_RESULTS = (TaggedOutput, WindowedValue, TimestampedValue)


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
        # side input) hands it on inside the chain.
        (output,) = transforms[transform_id].outputs.values()
        readers = consumers.get(output, [])
        return readers[0] if len(readers) == 1 and readers[0] in chainable else None

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
        inputs={'in': next(iter(steps[0].inputs.values()))},
        outputs={'out': next(iter(steps[-1].outputs.values()))},
        environment_id=steps[0].environment_id)
    for tid in chain:
        del descriptor.transforms[tid]
    descriptor.transforms[chain_id].CopyFrom(replacement)


def is_chainable(transform: beam_runner_api_pb2.PTransform) -> bool:
    """Whether a fused step can run inside a stateless chain (see the module doc)."""
    if len(transform.inputs) != 1 or len(transform.outputs) != 1:
        return False
    if transform.spec.urn == _ASSIGN_WINDOWS:
        return True
    if transform.spec.urn != _PAR_DO:
        return False
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    if (payload.side_inputs or payload.state_specs or payload.timer_family_specs
            or payload.restriction_coder_id or payload.requests_finalization
            or payload.requires_time_sorted_input
            or payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO):
        return False
    try:
        fn, args, kwargs, side_inputs, _ = pickler.loads(payload.do_fn.payload)
    except Exception:  # noqa: BLE001 - what cannot be inspected keeps the harness
        return False
    return is_plain_dofn(fn, args, kwargs, side_inputs)


def is_plain_dofn(fn: core.DoFn, args, kwargs, side_inputs) -> bool:
    """Whether Beam's harness would run `fn` through its SimpleInvoker, and the chain
    can run it without its DoFnRunner (no bundle method that could output)."""
    if args or kwargs or side_inputs or hasattr(fn, '_runtime_output_constraints'):
        return False
    signature = common.DoFnSignature(fn)
    if (signature.is_stateful_dofn() or signature.is_splittable_dofn()
            or signature.process_method.defaults):
        return False
    if (_overrides(fn, 'finish_bundle') or _overrides(fn, 'process_batch')
            or fn._process_yields_batches):
        return False
    return not any(method.defaults for method in (
        signature.setup_lifecycle_method, signature.start_bundle_method,
        signature.teardown_lifecycle_method))


def _overrides(fn: core.DoFn, method: str) -> bool:
    return getattr(type(fn), method) is not getattr(core.DoFn, method)


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


# Worker side -------------------------------------------------------------------------
class _Step:
    """One step of a chain: how it maps a batch, where its metrics go, what it emitted."""

    def __init__(self, transform_id: str, name: str, state_sampler) -> None:
        self.transform_id = transform_id
        self.name = name
        name_context = common.NameContext(name, transform_id)
        self.metrics_container = MetricsContainer(name_context.metrics_name())
        self.scoped_state = state_sampler.scoped_state(
            name_context, 'process', metrics_container=self.metrics_container)
        self.elements = 0
        self.fn: core.DoFn | None = None

    def apply(self, values: list, bases: list) -> Iterator[tuple[list, list]]:
        """The step over a batch: `values[i]` carries the windows, timestamp and pane
        of `bases[i]` (a WindowedValue); yields its outputs the same way, in batches
        (a FlatMap's every `FLUSH_AT` outputs, so one element's thousands of outputs go
        on while it makes them). The step's scoped state and error tagging cover its
        own code only, never what runs while a batch is out."""
        batches = self._batches(values, bases)
        while True:
            with self.scoped_state:
                try:
                    batch = next(batches, None)
                except BaseException as exn:  # noqa: BLE001 - Beam tags any failure
                    self.fail(exn)
            if batch is None:
                return
            self.elements += len(batch[0])
            yield batch

    def _batches(self, values: list, bases: list) -> Iterator[tuple[list, list]]:
        raise NotImplementedError

    def fail(self, exn: BaseException) -> None:
        """Re-raises `exn` naming this step, as Beam's DoFnRunner does."""
        if getattr(exn, '_tagged_with_step', False):
            raise exn
        annotation = f" [while running '{self.name}']"
        try:
            augmented = type(exn)(exn.args[0] + annotation, *exn.args[1:])
            augmented._tagged_with_step = True
        except Exception:  # noqa: BLE001 - Beam's fallback: a RuntimeError with the text
            augmented = RuntimeError(
                traceback.format_exception_only(type(exn), exn)[-1].strip() + annotation)
            augmented._tagged_with_step = True
        raise augmented.with_traceback(exn.__traceback__)


class _ParDoStep(_Step):
    def __init__(self, transform_id: str, name: str, state_sampler, fn: core.DoFn,
                 window_fn: WindowFn, main_tag: str) -> None:
        super().__init__(transform_id, name, state_sampler)
        self.fn = fn
        self.window_fn = window_fn
        self.main_tag = main_tag
        self.kind, self.call = unwrapped_callable(fn)
        self._integer = integer_assign(window_fn)
        self._windows_made: dict[Hashable, tuple] = {}
        # Beam checks a class DoFn's first non-generator result (not Map/FlatMap's).
        self.check_output = not isinstance(fn, core.CallableWrapperDoFn) and not (
            inspect.isgeneratorfunction(common.DoFnSignature(fn).process_method.method_value))

    def _batches(self, values: list, bases: list) -> Iterator[tuple[list, list]]:
        call = self.call
        if self.kind == 'flat_map':
            yield from self._flat_map(values, bases)
            return
        if self.kind == 'filter':
            keep = [call(v) for v in values]
            yield list(itertools.compress(values, keep)), list(itertools.compress(bases, keep))
            return
        if self.kind == 'map':
            outputs = [call(v) for v in values]
        else:
            outputs = [call(*v) for v in values]
        if any(issubclass(t, _SPECIAL_RESULTS) for t in set(map(type, outputs))):
            yield self._special_outputs(outputs, bases)
        else:
            yield outputs, bases

    def _flat_map(self, values: list, bases: list) -> Iterator[tuple[list, list]]:
        process, check, special, limit = self.call, self.check_output, self.special, FLUSH_AT
        out_values: list = []
        out_bases: list = []
        for value, base in zip(values, bases, strict=True):
            results = process(value)
            if check:
                check = self.check_output = False
                _check_result_type(results)
            if results is None:
                continue
            for result in results:
                if isinstance(result, _SPECIAL_RESULTS):
                    result = special(base, result)
                    if result is None:
                        continue
                    out_values.append(result.value)
                    out_bases.append(result)
                else:
                    out_values.append(result)
                    out_bases.append(base)
                if len(out_values) >= limit:
                    yield out_values, out_bases
                    out_values, out_bases = [], []
        if out_values:
            yield out_values, out_bases

    def _special_outputs(self, outputs: list, bases: list) -> tuple[list, list]:
        out_values, out_bases = [], []
        for result, base in zip(outputs, bases, strict=True):
            if isinstance(result, _SPECIAL_RESULTS):
                result = self.special(base, result)
                if result is not None:
                    out_values.append(result.value)
                    out_bases.append(result)
            else:
                out_values.append(result)
                out_bases.append(base)
        return out_values, out_bases

    def special(self, windowed: WindowedValue, result) -> WindowedValue | None:
        """Beam's output handler for a TaggedOutput, WindowedValue or TimestampedValue."""
        if isinstance(result, TaggedOutput):
            if not isinstance(result.tag, str):
                raise TypeError(f'In {self.name}, tag {result.tag} is not a string')
            if result.tag != self.main_tag:
                return None  # an output the step does not declare: the harness drops it
            result = result.value
        if isinstance(result, WindowedValue):
            output = result
        elif isinstance(result, TimestampedValue):
            output = self._timestamped(result)
        else:
            return windowed.with_value(result)
        if len(windowed.windows) != 1:
            output.windows *= len(windowed.windows)
        return output

    def _timestamped(self, result: TimestampedValue) -> WindowedValue:
        """A TimestampedValue's WindowedValue, its windows assigned by the step's input
        WindowFn (in integer micros where `integer_assign` can, each set made once)."""
        timestamp = result.timestamp
        if self._integer is None:
            return WindowedValue(result.value, timestamp, self.window_fn.assign(
                WindowFn.AssignContext(timestamp, result.value)))
        key_of, windows_of = self._integer
        micros = timestamp.micros
        key = key_of(micros)
        windows = self._windows_made.get(key)
        if windows is None:
            if len(self._windows_made) >= _WINDOWS_KEPT:
                self._windows_made.clear()  # windows come and go
            windows = self._windows_made[key] = windows_of(key)
        return windowed_value.create(result.value, micros, windows)


class _AssignWindowsStep(_Step):
    def __init__(self, transform_id: str, name: str, state_sampler,
                 window_fn: WindowFn) -> None:
        super().__init__(transform_id, name, state_sampler)
        self.window_fn = window_fn

    def _batches(self, values: list, bases: list) -> Iterator[tuple[list, list]]:
        yield self._assign(values, bases)

    def _assign(self, values: list, bases: list) -> tuple[list, list]:
        integer = integer_assign(self.window_fn)
        if integer is not None:
            return self._assign_in_micros(values, bases, *integer)
        assign, context = self.window_fn.assign, WindowFn.AssignContext
        out_values: list = []
        out_bases: list = []
        for value, base in zip(values, bases, strict=True):
            timestamp = base.timestamp
            # One output per input window, as Beam's WindowIntoDoFn (it takes WindowParam).
            for window in base.windows:
                out_values.append(value)
                out_bases.append(windowed_value.create(
                    value, base.timestamp_micros, assign(context(timestamp, value, window))))
        return out_values, out_bases

    @staticmethod
    def _assign_in_micros(values: list, bases: list, key_of: Callable[[int], Hashable],
                          windows_of: Callable[[Hashable], tuple]) -> tuple[list, list]:
        made: dict[Hashable, tuple] = {}
        out_values: list = []
        out_bases: list = []
        for value, base in zip(values, bases, strict=True):
            micros = base.timestamp_micros
            key = key_of(micros)
            windows = made.get(key)
            if windows is None:
                windows = made[key] = windows_of(key)
            for _ in base.windows:
                out_values.append(value)
                out_bases.append(windowed_value.create(value, micros, windows))
        return out_values, out_bases


_GLOBAL_WINDOWS = (GlobalWindow(),)
# Window sets a ParDo step keeps for the TimestampedValues it emits.
_WINDOWS_KEPT = 10_000


def _global_key(micros: int) -> int:
    return 0


def _global_windows(key: Hashable) -> tuple:
    return _GLOBAL_WINDOWS


def integer_assign(window_fn: WindowFn
                   ) -> tuple[Callable[[int], Hashable], Callable[[Hashable], tuple]] | None:
    """For GlobalWindows, FixedWindows and SlidingWindows: (the key of a timestamp's
    windows, from its micros; the windows of a key), the same windows as the WindowFn's
    `assign` in integer arithmetic (Beam's does it on Python Timestamp objects, several
    allocations per element and window); None for any other WindowFn."""
    if type(window_fn) is GlobalWindows:
        return _global_key, _global_windows
    if type(window_fn) is FixedWindows:
        size, offset = window_fn.size.micros, window_fn.offset.micros

        def fixed_start(micros: int) -> int:
            return micros - (micros - offset) % size

        def fixed(start: int) -> tuple:
            return (IntervalWindow(Timestamp(micros=start), Timestamp(micros=start + size)),)
        return fixed_start, fixed
    if type(window_fn) is SlidingWindows:
        size, period = window_fn.size.micros, window_fn.period.micros
        offset = window_fn.offset.micros

        def sliding_key(micros: int) -> tuple[int, int]:
            # The latest window's start, and how many windows (the latest first) hold it.
            start = micros - (micros - offset) % period
            return start, len(range(start, micros - size, -period))

        def sliding(key: tuple[int, int]) -> tuple:
            start, count = key
            return tuple(IntervalWindow(Timestamp(micros=s), Timestamp(micros=s + size))
                         for s in range(start, start - count * period, -period))
        return sliding_key, sliding
    return None


def _check_result_type(results) -> None:
    if isinstance(results, (str, bytes, dict)):
        raise TypeError(
            f'Returning a {type(results).__name__} from a ParDo or FlatMap is not allowed. '
            f'Please use list({results!r}) if you really want this behavior.')


def _probe(x):
    return x


def _probe_with_default(x, y=None):
    return x


def _fingerprint(function) -> tuple | None:
    code = getattr(function, '__code__', None)
    if code is None:
        return None
    return (code.co_code, code.co_consts, code.co_names, code.co_varnames,
            code.co_freevars, code.co_flags)


# The wrappers Beam's Map, MapTuple and Filter put around a user function, known by
# their bytecode (a pickled lambda comes back as a new function with the same code).
_WRAPPERS = {
    _fingerprint(core.Map(_probe).fn._fn): 'map',
    _fingerprint(core.Map(_probe_with_default).fn._fn): 'map',
    _fingerprint(core.MapTuple(_probe).fn._fn): 'map_tuple',
    _fingerprint(core.Filter(_probe).fn._fn): 'filter',
}


def unwrapped_callable(fn: core.DoFn) -> tuple[str, Callable]:
    """How a chain calls `fn` over a batch: ('map', f) (one output per element, f(x)),
    ('map_tuple', f) (f(*x)), ('filter', predicate) or ('flat_map', process)."""
    wrapper = getattr(fn, '_fn', None) if isinstance(fn, core.CallableWrapperDoFn) else None
    kind = _WRAPPERS.get(_fingerprint(wrapper)) if wrapper is not None else None
    if kind is not None and wrapper.__closure__:
        cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__, strict=True))
        if 'fn' in cells:
            return kind, cells['fn'].cell_contents
    return 'flat_map', fn.process


# A chain runs over batches of this many input elements (and what is left at the end
# of a bundle): per-step costs (its scoped state, its error tagging) are paid per batch.
FLUSH_AT = 1000


class StatelessChainOperation(operations.Operation):
    """A chain of stateless steps as one harness operation (see the module doc)."""

    def __init__(self, name_context: common.NameContext, spec, counter_factory,
                 state_sampler, steps: list[_Step]) -> None:
        super().__init__(name_context, spec, counter_factory, state_sampler)
        self.steps = steps
        self._pending: list[WindowedValue] = []

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
        if len(pending) >= FLUSH_AT:
            self._flush()

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
        receive = self.receivers[0].receive
        try:
            for value, base in zip(values, bases, strict=True):
                receive(base if base.value is value else base.with_value(value))
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
            step.metrics_container.reset()
            step.elements = 0

    def _lifecycle(self, step: _Step, method: str):
        if step.fn is None or not _overrides(step.fn, method):
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


def metric_containers(transform_id: str, op) -> Iterable[tuple[str, object]]:
    """(transform id, metrics container) of each step a harness operation runs."""
    if isinstance(op, StatelessChainOperation):
        return op.metric_containers()
    return ((transform_id, op.metrics_container),)


@bundle_processor.BeamTransformFactory.register_urn(STATELESS_CHAIN_URN, None)
def _create_stateless_chain(factory, transform_id: str,
                            transform_proto: beam_runner_api_pb2.PTransform,
                            payload: bytes, consumers) -> StatelessChainOperation:
    transforms = beam_runner_api_pb2.Components.FromString(payload).transforms
    by_input = {next(iter(t.inputs.values())): tid for tid, t in transforms.items()}
    steps, pcollection = [], transform_proto.inputs['in']
    while pcollection in by_input:
        step_id = by_input[pcollection]
        steps.append(_build_step(factory, step_id, transforms[step_id]))
        pcollection = next(iter(transforms[step_id].outputs.values()))
    op = StatelessChainOperation(
        common.NameContext(transform_proto.unique_name, transform_id),
        operation_specs.WorkerFlatten(None, [factory.get_only_output_coder(transform_proto)]),
        factory.counter_factory, factory.state_sampler, steps)
    return factory.augment_oldstyle_op(op, transform_proto.unique_name, consumers)


def _build_step(factory, transform_id: str, transform: beam_runner_api_pb2.PTransform
                ) -> _Step:
    if transform.spec.urn == _ASSIGN_WINDOWS:
        windowing = core.Windowing.from_runner_api(
            beam_runner_api_pb2.WindowingStrategy.FromString(transform.spec.payload),
            factory.context)
        return _AssignWindowsStep(transform_id, transform.unique_name,
                                  factory.state_sampler, windowing.windowfn)
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    fn, _, _, _, windowing = pickler.loads(
        core.DoFnInfo.from_runner_api(payload.do_fn, factory.context).serialized_dofn_data())
    if windowing is None:
        windowing = factory.context.windowing_strategies.get_by_id(
            factory.descriptor.pcollections[
                next(iter(transform.inputs.values()))].windowing_strategy_id)
    return _ParDoStep(transform_id, transform.unique_name, factory.state_sampler, fn,
                      windowing.windowfn, next(iter(transform.outputs)))
