"""Chain steps whose DoFn takes extra arguments or side inputs.

Design section 9 (the paper's ParDo specialisations), for `ParDo(fn, *args, **kwargs)`:
a Map, FlatMap, Filter or plain DoFn given extra arguments, some of them side inputs
(`AsSingleton`, `AsIter`, `AsList`, `AsDict`, `AsMultiMap`). Beam's harness calls such
a DoFn through its `PerWindowInvoker`: per element (and per window, where a side input
is windowed) it maps the window to each side input's window and looks the view up,
which costs more than most DoFns' own work (NEXMark Q7: a quarter of the worker's time
in `FixedWindows.assign` through the side input's window mapping). Here the arguments
are made once per main-input window and bundle, by Beam's own `StateBackedSideInputMap`
(the same state requests, the same views) and Beam's own `insert_values_in_args`, and
the DoFn is called as the invoker calls it: `process(element, *args, **kwargs)`.

As in Beam, an element in several windows is processed once per window when a side
input is windowed (its outputs in that one window, with no pane, as Beam's invoker
makes them), and once for all its windows when every side input is global. The views
are dropped when the bundle ends, as the harness drops them
(`StateBackedSideInputMap.reset`): a streaming side input may have grown by the next
bundle.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from apache_beam import pvalue
from apache_beam.internal import util
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms import core, sideinputs
from apache_beam.transforms.window import GlobalWindow, WindowFn
from apache_beam.utils import windowed_value

from beam_streams_runner.translators.chain_steps import ParDoStep, check_result_type

# The window an element is processed in when every side input is global: Beam's
# invoker reads such side inputs at the global window, whatever the element's windows.
_GLOBAL = GlobalWindow()


def side_input_maps(factory, transform_id: str, transform: beam_runner_api_pb2.PTransform,
                    payload: beam_runner_api_pb2.ParDoPayload
                    ) -> list[bundle_processor.StateBackedSideInputMap]:
    """A ParDo's side inputs as the harness reads them, in its argument order (what
    Beam's `_create_pardo_operation` makes)."""
    coders = factory.get_input_coders(transform)
    tagged = sorted(
        ((tag, pvalue.SideInputData.from_runner_api(spec, factory.context))
         for tag, spec in payload.side_inputs.items()),
        key=lambda tag_data: sideinputs.get_sideinput_index(tag_data[0]))
    bulk = (common_urns.runner_protocols.MULTIMAP_KEYS_VALUES_SIDE_INPUT.urn
            in factory.runner_capabilities)
    return [bundle_processor.StateBackedSideInputMap(
        factory.state_handler, transform_id, tag, data, coders[tag], use_bulk_read=bulk)
        for tag, data in tagged]


class ArgumentsParDoStep(ParDoStep):
    """A ParDo step called with extra arguments, side inputs among them."""

    def __init__(self, transform_id: str, name: str, state_sampler, fn: core.DoFn,
                 window_fn: WindowFn, main_tag: str, args: list | None, kwargs: dict | None,
                 side_inputs: list) -> None:
        super().__init__(transform_id, name, state_sampler, fn, window_fn, main_tag)
        self.args = list(args or ())
        self.kwargs = dict(kwargs or {})
        self.side_inputs = side_inputs
        self.per_window = not all(si.is_globally_windowed() for si in side_inputs)
        self._arguments: dict[Hashable, tuple[list, dict]] = {}

    def reset(self) -> None:
        super().reset()
        self._arguments = {}
        for side_input in self.side_inputs:
            side_input.reset()

    def arguments(self, window) -> tuple[list, dict]:
        """The DoFn's arguments after the element in `window`, side inputs read."""
        found = self._arguments.get(window)
        if found is None:
            found = self._arguments[window] = util.insert_values_in_args(
                self.args, self.kwargs, [side_input[window] for side_input in self.side_inputs])
        return found

    def _batches(self, values: list, bases: list) -> Iterator[tuple[list, list]]:
        yield from self.flattened(self._each_result(values, bases))

    def _each_result(self, values: list, bases: list) -> Iterator[tuple]:
        for value, base in zip(values, bases, strict=True):
            for window, windowed in self._windows(value, base):
                args, kwargs = self.arguments(window)
                yield self._results(value, args, kwargs), windowed

    def _windows(self, value, base: windowed_value.WindowedValue) -> list[tuple]:
        """(window the arguments are read in, the element as processed there)."""
        if not self.per_window:
            return [(_GLOBAL, base)]
        windows = base.windows
        if len(windows) == 1:
            return [(windows[0], base)]
        # Beam's `PerWindowInvoker` leaves an exploded element's pane out (unknown).
        return [(window, windowed_value.create(value, base.timestamp_micros, (window,)))
                for window in windows]

    def _results(self, value, args: list, kwargs: dict):
        kind, call = self.kind, self.call
        if kind == 'map':
            return (call(value, *args, **kwargs),)
        if kind == 'map_tuple':
            return (call(*value, *args, **kwargs),)
        if kind == 'filter':
            return (value,) if call(value, *args, **kwargs) else ()
        results = call(value, *args, **kwargs)
        if self.check_output:
            self.check_output = False
            check_result_type(results)
        return () if results is None else results
