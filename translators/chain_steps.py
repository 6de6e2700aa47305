"""The steps of a stateless chain: each maps a batch of values to its outputs.

Design section 9. `translators.stateless_chain` runs a run of fused steps as one harness
operation; a step here is one of them over a batch (`ChainStep.apply`): `ParDoStep` (a
Map, FlatMap, Filter, MapTuple or plain DoFn, Beam's Map/MapTuple/Filter wrappers seen
through by `unwrapped_callable`) and `AssignWindowsStep` (a WindowInto, global, fixed
and sliding windows assigned in integer micros by `integer_assign`). A step's outputs
are what Beam's output handler would send on: plain values keep their input's windows,
timestamp and pane; a `TimestampedValue` is assigned windows again; a `WindowedValue` is
taken as it is; a `TaggedOutput` to a tag the step does not declare is dropped. Each
step keeps its user metrics (a metrics container and scoped state of its own), its
element count and its name in errors (" [while running 'Step']", as Beam's DoFnRunner
adds it).
"""

from __future__ import annotations

import inspect
import itertools
import traceback
from collections.abc import Callable, Hashable, Iterator

from apache_beam.internal import pickler
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.pvalue import TaggedOutput
from apache_beam.runners import common
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

# Results that are not plain values: Beam's output handler treats each specially.
_SPECIAL_RESULTS = (TaggedOutput, WindowedValue, TimestampedValue)

# A chain runs over batches of this many input elements (and what is left at the end
# of a bundle): per-step costs (its scoped state, its error tagging) are paid per batch.
FLUSH_AT = 1000
_PAR_DO = common_urns.primitives.PAR_DO.urn


def dofn_info(do_fn: beam_runner_api_pb2.FunctionSpec) -> tuple | None:
    """(fn, args, kwargs, side inputs, windowing) of a ParDo's DoFn spec; None where it
    cannot be read (what cannot be inspected keeps the harness)."""
    try:
        return pickler.loads(core.DoFnInfo.from_runner_api(do_fn, None).serialized_dofn_data())
    except Exception:  # noqa: BLE001 - any failure to unpickle means "not ours"
        return None


def pickled_par_do(transform: beam_runner_api_pb2.PTransform, urn: str = _PAR_DO
                   ) -> tuple[beam_runner_api_pb2.ParDoPayload, tuple] | None:
    """The payload and `dofn_info` of a ParDo (spec `urn`) whose DoFn is a pickled Python
    one; None for any other transform, or a DoFn that cannot be read."""
    if transform.spec.urn != urn:
        return None
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    if payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO:
        return None
    info = dofn_info(payload.do_fn)
    return None if info is None else (payload, info)


def with_payloads(descriptor: beam_fn_api_pb2.ProcessBundleDescriptor,
                  payloads: dict[str, beam_runner_api_pb2.ParDoPayload]
                  ) -> beam_fn_api_pb2.ProcessBundleDescriptor:
    """A copy of `descriptor` whose transforms in `payloads` (by id) have those ParDo
    payloads: a plan-time swap of a step's DoFn; `descriptor` itself is left as it is."""
    swapped = beam_fn_api_pb2.ProcessBundleDescriptor()
    swapped.CopyFrom(descriptor)
    for transform_id, payload in payloads.items():
        swapped.transforms[transform_id].spec.payload = payload.SerializeToString()
    return swapped


def has_special_results(outputs: list) -> bool:
    """Whether any of `outputs` is a TaggedOutput, WindowedValue or TimestampedValue."""
    return any(issubclass(t, _SPECIAL_RESULTS) for t in set(map(type, outputs)))


class ChainStep:
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

    def reset(self) -> None:
        """Forgets the bundle that ended: its metrics, its element count."""
        self.metrics_container.reset()
        self.elements = 0

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


class ParDoStep(ChainStep):
    def __init__(self, transform_id: str, name: str, state_sampler, fn: core.DoFn,
                 window_fn: WindowFn, main_tag: str) -> None:
        super().__init__(transform_id, name, state_sampler)
        self.fn = fn
        self.window_fn = window_fn
        self.main_tag = main_tag
        self.kind, self.call = unwrapped_callable(fn)
        self._window_sets = WindowSets.of(window_fn)
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
        if has_special_results(outputs):
            yield self.special_outputs(outputs, bases)
        else:
            yield outputs, bases

    def _flat_map(self, values: list, bases: list) -> Iterator[tuple[list, list]]:
        yield from self.flattened(self._each_result(values, bases))

    def _each_result(self, values: list, bases: list) -> Iterator[tuple]:
        process, check = self.call, self.check_output
        for value, base in zip(values, bases, strict=True):
            results = process(value)
            if check:
                check = self.check_output = False
                check_result_type(results)
            if results is not None:
                yield results, base

    def flattened(self, results_and_bases: Iterator[tuple]) -> Iterator[tuple[list, list]]:
        """The outputs of (results of an element, the WindowedValue they are made in)
        pairs, as Beam's output handler takes each result, every `FLUSH_AT` of them."""
        special, limit = self.special, FLUSH_AT
        out_values: list = []
        out_bases: list = []
        for results, base in results_and_bases:
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

    def special_outputs(self, outputs: list, bases: list) -> tuple[list, list]:
        """`outputs` (each made from the element of `bases` at its place) as values and
        the WindowedValues they carry, the TaggedOutputs, WindowedValues and
        TimestampedValues among them as Beam's output handler takes them."""
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
        if self._window_sets is None:
            return WindowedValue(result.value, timestamp, self.window_fn.assign(
                WindowFn.AssignContext(timestamp, result.value)))
        micros = timestamp.micros
        return windowed_value.create(result.value, micros, self._window_sets.of_micros(micros))


class AssignWindowsStep(ChainStep):
    def __init__(self, transform_id: str, name: str, state_sampler,
                 window_fn: WindowFn) -> None:
        super().__init__(transform_id, name, state_sampler)
        self.window_fn = window_fn
        self._window_sets = WindowSets.of(window_fn)

    def _batches(self, values: list, bases: list) -> Iterator[tuple[list, list]]:
        yield self._assign(values, bases)

    def _assign(self, values: list, bases: list) -> tuple[list, list]:
        if self._window_sets is not None:
            return self._assign_in_micros(values, bases, self._window_sets)
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
    def _assign_in_micros(values: list, bases: list, sets: WindowSets) -> tuple[list, list]:
        # `sets.of_micros` inlined: a call less per element on the hot path.
        key_of, made = sets.key_of, sets.made
        out_values: list = []
        out_bases: list = []
        for value, base in zip(values, bases, strict=True):
            micros = base.timestamp_micros
            key = key_of(micros)
            windows = made.get(key)
            if windows is None:
                windows = sets.of_key(key)
            for _ in base.windows:
                out_values.append(value)
                out_bases.append(windowed_value.create(value, micros, windows))
        return out_values, out_bases


_GLOBAL_WINDOWS = (GlobalWindow(),)
# Window sets a step keeps made (windows come and go).
_WINDOWS_KEPT = 10_000


class WindowSets:
    """The windows of a WindowFn `integer_assign` handles, by timestamp micros, each set
    made once (the last `_WINDOWS_KEPT` kept)."""

    def __init__(self, key_of: Callable[[int], Hashable],
                 windows_of: Callable[[Hashable], tuple]) -> None:
        self.key_of = key_of
        self._windows_of = windows_of
        self.made: dict[Hashable, tuple] = {}

    @classmethod
    def of(cls, window_fn: WindowFn) -> WindowSets | None:
        """The window sets of `window_fn`, None where Beam's `assign` must do it."""
        integer = integer_assign(window_fn)
        return None if integer is None else cls(*integer)

    def of_micros(self, micros: int) -> tuple:
        key = self.key_of(micros)
        windows = self.made.get(key)
        return self.of_key(key) if windows is None else windows

    def of_key(self, key: Hashable) -> tuple:
        """The windows of `key`, made (and kept) now."""
        if len(self.made) >= _WINDOWS_KEPT:
            self.made.clear()
        windows = self.made[key] = self._windows_of(key)
        return windows


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


def check_result_type(results) -> None:
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


def overrides(fn: core.DoFn, method: str) -> bool:
    return getattr(type(fn), method) is not getattr(core.DoFn, method)
