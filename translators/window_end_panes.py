"""A key's panes for Beam's default trigger over a non-merging WindowFn, without its driver.

Design section 7 (the streaming GroupByKey). Most streaming GroupByKeys and
Combines window by fixed or sliding windows and keep Beam's `DefaultTrigger`.
For them the general trigger driver (`beam_trigger_panes`) does per element
what is known in advance: a trigger context, a watermark timer named after
`str(window)`, a hold appended to a list. NEXMark Q5 streaming spent 37% of
its Python workers' time in the GroupByKey's reduce side, mostly there.

`WindowEndPanes` keeps per window only what the panes of that trigger depend
on (`GeneralTriggerDriver` with `DefaultTrigger`, Beam 2.77): the waiting
values, the combined output time and the earliest hold, the panes fired so
far, and whether the end-of-window timer is pending. It gives
the same panes in the same order:

* an element of a window the input watermark has passed by more than the
  allowed lateness is dropped;
* a window's elements are held at their combined output time (an element whose
  output time is before the watermark holds nothing, unless the combiner
  depends only on the window: Beam holds the window's end then);
* an element arriving while the watermark is before its window's end sets the
  window's timer at the end; otherwise the window fires at once, a late pane;
* the timer fires once the watermark reaches the window's end: an on-time pane
  (the first non-speculative one) or, after a late pane, a late one;
* a pane carries the window's values (cleared when discarding), is first when
  its index is 0, never last (the trigger never finishes), and is timed at the
  held output time (then released) or at the window's end if nothing is held;
  no pane is early, so its non-speculative index is its index.

`tests/translators/test_window_end_panes.py` runs random bundles and watermark
advances through both drivers and compares every pane, hold, timer and window.
"""

from __future__ import annotations

from collections.abc import Iterator

from apache_beam.transforms import trigger
from apache_beam.transforms.timeutil import DependsOnlyOnWindow
from apache_beam.transforms.window import IntervalWindow, TimestampCombiner
from apache_beam.utils.timestamp import TIME_GRANULARITY, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

WINDOW_PANES = 'window-panes'  # the namespace of a key's (user key, {window: panes})

# A window's panes: a list (pickles small and fast), indexed by these. The window's
# end and max timestamp are kept in micros: Beam's `Timestamp.micros` costs a
# microsecond or more each time.
_WINDOW, _VALUES, _OUTPUT_TIME, _EARLIEST_HOLD, _FIRED, _TIMER, _END, _MAX_TIMESTAMP = range(8)
_GRANULARITY = TIME_GRANULARITY.micros
_ON_TIME_FIRST = PaneInfo(True, False, PaneInfoTiming.ON_TIME, 0, 0)


def applies_to(windowing) -> bool:
    """Whether `windowing`'s panes are `WindowEndPanes`' (else Beam's driver's); the
    batch GroupByKey's one pane per window applies to the same windowings."""
    return (type(windowing.triggerfn) is trigger.DefaultTrigger
            and not windowing.windowfn.is_merging())


class WindowEndPanes:
    """What the streaming GroupByKey asks of a key's panes, for `DefaultTrigger` and a
    non-merging WindowFn (see the module docstring); a key's state is
    `{window_key(window): panes}` in the order its windows were first seen."""

    namespace = WINDOW_PANES
    drops_windows = True

    def __init__(self, windowing) -> None:
        self._lateness = windowing.allowed_lateness.micros
        self._discarding = windowing.accumulation_mode == trigger.AccumulationMode.DISCARDING
        self._combiner = TimestampCombiner.get_impl(
            windowing.timestamp_combiner, windowing.windowfn)
        self._by_window = isinstance(self._combiner, DependsOnlyOnWindow)

    def new_state(self) -> dict:
        return {}

    def process_elements(self, state: dict, values: list,
                         watermark: Timestamp) -> Iterator[WindowedValue]:
        now = watermark.micros
        by_window: dict = {}
        for windowed in values:
            for window in windowed.windows:
                # An interval window is found by its bounds: Beam 2.77's
                # `IntervalWindow` hashes and compares through `Timestamp.micros`
                # (2-4 calls, a microsecond or more each).
                name = (window._start_micros, window._end_micros) if type(
                    window) is IntervalWindow else window
                group = by_window.get(name)
                if group is None:
                    by_window[name] = [window, windowed]
                else:
                    group.append(windowed)
        for name, (window, *elements) in by_window.items():
            panes = state.get(name)
            if panes is None:
                end = window.end.micros
                if now > end + self._lateness:
                    continue
                panes = state[name] = [window, [], None, None, 0, False, end,
                                       window.max_timestamp().micros]
            elif now > panes[_END] + self._lateness:
                continue
            self._hold(window, panes, elements, watermark)
            panes[_VALUES].extend([windowed.value for windowed in elements])
            if now >= panes[_END]:
                panes[_TIMER] = False
                yield self._output(panes, on_time=False)
            else:
                panes[_TIMER] = True

    def _hold(self, window, panes: list, elements: list, watermark: Timestamp) -> None:
        combiner = self._combiner
        held = panes[_OUTPUT_TIME]
        if self._by_window:
            # The same output time for every element of the window: combining it
            # with itself (a minimum or a maximum) changes nothing.
            if held is None:
                output_time = combiner.assign_output_time(window, None)
                panes[_OUTPUT_TIME] = output_time
                panes[_EARLIEST_HOLD] = output_time.micros
            return
        output_time = combiner.combine_all(
            time for time in (combiner.assign_output_time(window, windowed.timestamp)
                              for windowed in elements)
            if time >= watermark)
        if output_time is None:
            return
        if held is None:
            panes[_OUTPUT_TIME] = output_time
            panes[_EARLIEST_HOLD] = output_time.micros
        else:
            panes[_OUTPUT_TIME] = combiner.combine(held, output_time)
            panes[_EARLIEST_HOLD] = min(panes[_EARLIEST_HOLD], output_time.micros)

    def fire(self, state: dict, watermark: Timestamp, now: Timestamp) -> Iterator[WindowedValue]:
        micros = watermark.micros
        due = [panes for panes in state.values() if panes[_TIMER] and panes[_END] <= micros]
        for panes in due:
            panes[_TIMER] = False
            yield self._output(panes, on_time=True)

    def _output(self, panes: list, on_time: bool) -> WindowedValue:
        window = panes[_WINDOW]
        index = panes[_FIRED]
        panes[_FIRED] = index + 1
        if on_time and index == 0:
            pane = _ON_TIME_FIRST
        else:
            pane = PaneInfo(index == 0, False, PaneInfoTiming.LATE, index, index)
        values = panes[_VALUES]
        if self._discarding:
            panes[_VALUES] = []
        timestamp = panes[_OUTPUT_TIME]
        if timestamp is None:
            timestamp = window.max_timestamp()
        else:
            panes[_OUTPUT_TIME] = panes[_EARLIEST_HOLD] = None
        return WindowedValue(values, timestamp, (window,), pane)

    def index(self, state: dict) -> tuple:
        event_time = None
        hold = None
        for panes in state.values():
            if panes[_TIMER]:
                end = panes[_END]
                if event_time is None or end < event_time:
                    event_time = end
            earliest = panes[_EARLIEST_HOLD]
            if earliest is not None and (hold is None or earliest < hold):
                hold = earliest
        # Beam's `InMemoryUnmergedState.get_earliest_hold`: a hold one step before.
        hold = None if hold is None else hold - _GRANULARITY
        return (event_time, None, hold, [panes[_MAX_TIMESTAMP] for panes in state.values()])

    def expire_windows(self, state: dict, before: int) -> bool:
        expired = [name for name, panes in state.items()
                   if panes[_END] < before and not panes[_TIMER]]
        for name in expired:
            del state[name]
        return bool(expired)
