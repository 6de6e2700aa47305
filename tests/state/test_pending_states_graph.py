"""Unit tests of `PendingStatesGraph` (no Spark).

The cases of the paper's section 4.2 first, then a hypothesis state machine
that interleaves elements, side data, side watermarks and pickle round trips and
checks the graph against a brute-force model: a plain list of pending
(element, main window, needed side windows), re-checked against the ready sets
after every step.
"""

from __future__ import annotations

import itertools
import pickle

from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK
from beam_streams_runner.state.pending_states_graph import PendingStatesGraph, Released


def side_max(window: int) -> int:
    """Max timestamp of the integer side window `window` (windows of 10 micros)."""
    return 10 * window + 9


def needs(*pairs):
    """[(side input, integer side window, its max timestamp), ...] from (side input, window)."""
    return [(side_input, window, side_max(window)) for side_input, window in pairs]


# The paper's cases ---------------------------------------------------------------

def test_without_side_inputs_every_window_runs_at_once():
    psg = PendingStatesGraph([])
    assert psg.add_element('e', 5, 'k', {'w1': [], 'w2': []}) == ['w1', 'w2']
    assert psg.add_element('f', 5, None, {}) == []
    assert len(psg) == 0 and psg.min_hold() is None and not psg.has_pending('k')
    assert psg.sizes() == {'side_windows': 0, 'main_windows': 0, 'elements': 0,
                           'ready_windows': 0}


def test_watermarks_start_at_min_and_nothing_is_ready():
    psg = PendingStatesGraph(['s'])
    assert psg.side_watermark('s') == MIN_WATERMARK
    assert not psg.is_ready('s', 0, side_max(0))
    assert not psg.is_ready('s', 'anything', MIN_WATERMARK)


def test_element_is_pushed_back_until_side_data_arrives():
    psg = PendingStatesGraph(['s'])
    assert psg.add_element('e', 3, 'k', {0: needs(('s', 0))}) == []
    assert len(psg) == 1 and psg.min_hold() == 3 and psg.has_pending('k')
    assert psg.sizes() == {'side_windows': 1, 'main_windows': 1, 'elements': 1,
                           'ready_windows': 0}
    assert psg.on_side_data('s', 1, side_max(1)) == []  # another window
    assert psg.on_side_data('s', 0, side_max(0)) == [Released('e', 0)]
    assert len(psg) == 0 and psg.min_hold() is None and not psg.has_pending('k')
    assert psg.sizes() == {'side_windows': 0, 'main_windows': 0, 'elements': 0,
                           'ready_windows': 2}
    # Ready by data stays ready: the next element in that window runs at once.
    assert psg.add_element('f', 4, 'k', {0: needs(('s', 0))}) == [0]
    assert psg.on_side_data('s', 0, side_max(0)) == []  # more data: nothing new
    assert len(psg) == 0


def test_side_watermark_past_the_window_end_makes_it_ready():
    psg = PendingStatesGraph(['s'])
    psg.add_element('e', 0, None, {0: needs(('s', 0))})
    # watermark == max timestamp: data with that timestamp may still come
    assert psg.on_side_watermark('s', side_max(0)) == []
    assert not psg.is_ready('s', 0, side_max(0))
    assert psg.on_side_watermark('s', side_max(0) + 1) == [Released('e', 0)]
    assert psg.is_ready('s', 0, side_max(0))  # ready but empty: the view's default
    assert psg.sizes()['ready_windows'] == 0  # the watermark alone keeps it ready
    assert psg.add_element('f', 0, None, {0: needs(('s', 0))}) == [0]


def test_one_watermark_advance_expires_a_range_of_side_windows():
    psg = PendingStatesGraph(['s'])
    for window in (4, 0, 3, 1, 2):
        psg.add_element(f'e{window}', window, None, {window: needs(('s', window))})
    assert psg.sizes()['side_windows'] == 5
    released = psg.on_side_watermark('s', side_max(2) + 1)
    # In arrival order, not in window order.
    assert released == [Released('e0', 0), Released('e1', 1), Released('e2', 2)]
    assert psg.sizes()['side_windows'] == 2 and psg.min_hold() == 3
    assert psg.on_side_watermark('s', MAX_WATERMARK) == [Released('e4', 4), Released('e3', 3)]
    assert len(psg) == 0


def test_lower_side_watermarks_are_ignored():
    psg = PendingStatesGraph(['s'])
    assert psg.on_side_watermark('s', 50) == []
    assert psg.on_side_watermark('s', 20) == []
    assert psg.on_side_watermark('s', 50) == []
    assert psg.side_watermark('s') == 50
    assert psg.is_ready('s', 4, side_max(4))  # max timestamp 49 < 50


def test_an_element_waits_for_every_side_input():
    psg = PendingStatesGraph(['a', 'b'])
    assert psg.add_element('e', 7, 'k', {0: needs(('a', 0), ('b', 0))}) == []
    assert psg.sizes()['side_windows'] == 2
    assert psg.on_side_data('a', 0, side_max(0)) == []  # one edge left
    assert psg.sizes() == {'side_windows': 1, 'main_windows': 1, 'elements': 1,
                           'ready_windows': 1}
    assert psg.has_pending('k')
    assert psg.on_side_watermark('b', 100) == [Released('e', 0)]
    assert len(psg) == 0


def test_one_side_window_node_is_shared_by_every_element_waiting_for_it():
    psg = PendingStatesGraph(['s'])
    psg.add_element('e1', 1, 'k1', {0: needs(('s', 0))})
    psg.add_element('e2', 2, 'k2', {0: needs(('s', 0))})
    psg.add_element('e3', 0, 'k1', {1: needs(('s', 0))})
    assert psg.sizes() == {'side_windows': 1, 'main_windows': 3, 'elements': 3,
                           'ready_windows': 0}
    assert psg.min_hold() == 0
    assert psg.on_side_data('s', 0, side_max(0)) == [
        Released('e1', 0), Released('e2', 0), Released('e3', 1)]


def test_sliding_main_windows_map_to_past_and_future_side_windows():
    """An element in three main windows; each needs other side windows than its own."""
    psg = PendingStatesGraph(['past', 'future'])
    psg.on_side_data('past', 4, side_max(4))
    windows = {
        5: needs(('past', 4), ('future', 6)),
        6: needs(('past', 5), ('future', 7)),
        7: needs(('past', 6)),
    }
    assert psg.add_element('e', 55, 'k', windows) == []
    assert psg.sizes() == {'side_windows': 4, 'main_windows': 3, 'elements': 1,
                           'ready_windows': 1}
    assert psg.on_side_data('future', 6, side_max(6)) == [Released('e', 5)]
    assert len(psg) == 1 and psg.min_hold() == 55  # two windows still pushed back
    assert psg.on_side_watermark('past', side_max(6) + 1) == [Released('e', 7)]
    assert psg.sizes() == {'side_windows': 1, 'main_windows': 1, 'elements': 1,
                           'ready_windows': 1}  # 'future' 6 is still remembered
    assert psg.on_side_data('future', 7, side_max(7)) == [Released('e', 6)]
    assert len(psg) == 0 and psg.min_hold() is None


def test_ready_windows_run_now_and_the_others_wait():
    psg = PendingStatesGraph(['s'])
    psg.on_side_data('s', 1, side_max(1))
    psg.on_side_watermark('s', side_max(0) + 1)
    windows = {3: needs(('s', 3)), 0: needs(('s', 0)), 2: needs(('s', 2)), 1: needs(('s', 1))}
    assert psg.add_element('e', 9, None, windows) == [0, 1]  # in the given order
    assert psg.on_side_watermark('s', MAX_WATERMARK) == [Released('e', 3), Released('e', 2)]


def test_release_order_is_arrival_then_window_order_across_side_inputs():
    psg = PendingStatesGraph(['a', 'b'])
    psg.add_element('e1', 0, None, {2: needs(('b', 2)), 1: needs(('a', 1))})
    psg.add_element('e2', 0, None, {1: needs(('a', 1), ('b', 1)), 0: needs(('b', 0))})
    assert psg.on_side_watermark('b', MAX_WATERMARK) == [Released('e1', 2), Released('e2', 0)]
    assert psg.on_side_data('a', 1, side_max(1)) == [Released('e1', 1), Released('e2', 1)]


def test_ready_by_data_is_forgotten_once_the_watermark_passes_it():
    psg = PendingStatesGraph(['s'])
    for window in range(5):
        psg.on_side_data('s', window, side_max(window))
    assert psg.sizes()['ready_windows'] == 5
    psg.on_side_watermark('s', side_max(2))  # window 2 is not passed yet
    assert psg.sizes()['ready_windows'] == 3
    psg.on_side_watermark('s', side_max(2) + 1)
    assert psg.sizes()['ready_windows'] == 2
    assert all(psg.is_ready('s', window, side_max(window)) for window in range(5))
    # Late data in a window the watermark passed is not remembered.
    psg.on_side_data('s', 0, side_max(0))
    assert psg.sizes()['ready_windows'] == 2


def test_memory_stays_flat_over_a_long_stream():
    psg = PendingStatesGraph(['s'])
    peak = {}
    for window in range(2000):
        psg.add_element(('e', window), side_max(window), window % 7,
                        {window: needs(('s', window))})
        if window % 3 == 0:
            psg.on_side_data('s', window, side_max(window))
        psg.on_side_watermark('s', side_max(window - 2) + 1)
        for name, size in psg.sizes().items():
            peak[name] = max(peak.get(name, 0), size)
    # Windows w-1 and w wait (unless w got data); data is remembered for two steps.
    assert peak == {'side_windows': 2, 'main_windows': 2, 'elements': 2, 'ready_windows': 1}
    assert psg.on_side_watermark('s', MAX_WATERMARK) == [Released(('e', 1999), 1999)]
    assert len(psg) == 0 and psg.sizes()['ready_windows'] == 0


def test_min_hold_and_has_pending_follow_the_pushed_back_elements():
    psg = PendingStatesGraph(['s'])
    psg.add_element('e1', 30, 'a', {0: needs(('s', 0))})
    psg.add_element('e2', 10, 'b', {1: needs(('s', 1))})
    psg.add_element('e3', 20, 'a', {2: needs(('s', 2))})
    psg.add_element('e4', 5, None, {3: needs(('s', 3))})
    assert psg.add_element('e5', 1, 'c', {}) == []  # nothing to wait for: no hold
    assert psg.min_hold() == 5
    assert psg.has_pending('a') and psg.has_pending('b') and psg.has_pending(None)
    assert not psg.has_pending('c')
    psg.on_side_data('s', 3, side_max(3))
    assert psg.min_hold() == 10 and not psg.has_pending(None)
    psg.on_side_data('s', 1, side_max(1))
    assert psg.min_hold() == 20 and not psg.has_pending('b')
    psg.on_side_data('s', 2, side_max(2))
    assert psg.min_hold() == 30 and psg.has_pending('a')
    psg.on_side_data('s', 0, side_max(0))
    assert psg.min_hold() is None and not psg.has_pending('a')


def test_an_element_standing_for_several_holds_at_the_earliest():
    """The side-input gate adds a chunk of elements as one and lowers its hold as
    earlier ones join it."""
    psg = PendingStatesGraph(['s'])
    psg.add_element('chunk1', 30, None, {0: needs(('s', 0))})
    first = psg.last_pushed_back
    psg.add_element('chunk2', 20, None, {1: needs(('s', 1))})
    assert psg.last_pushed_back != first and psg.min_hold() == 20
    psg.lower_hold(first, 40)  # later than its own: no change
    assert psg.min_hold() == 20
    psg.lower_hold(first, 10)
    assert psg.min_hold() == 10
    assert psg.on_side_data('s', 0, side_max(0)) == [Released('chunk1', 0)]
    assert psg.min_hold() == 20


def test_beam_windows_with_equal_max_timestamps_and_the_global_window():
    """Windows need not be comparable; several windows may share a max timestamp."""
    psg = PendingStatesGraph(['s', 'g'])
    w1, w2 = IntervalWindow(0, 10), IntervalWindow(5, 10)
    main = IntervalWindow(0, 10)
    glob = GlobalWindow()
    g_max = glob.max_timestamp().micros
    assert psg.add_element('e', 1, b'k', {
        main: [('s', w1, w1.max_timestamp().micros), ('s', w2, w2.max_timestamp().micros),
               ('g', glob, g_max)],
    }) == []
    assert psg.sizes()['side_windows'] == 3
    assert psg.on_side_data('s', w2, w2.max_timestamp().micros) == []
    # Beam windows are in seconds: both end at 9999999 micros, the watermark passes w1.
    assert psg.on_side_watermark('s', w1.end.micros) == []
    assert psg.sizes()['side_windows'] == 1 and psg.sizes()['ready_windows'] == 0
    # The global side window becomes ready by the final watermark only.
    assert psg.on_side_watermark('g', g_max) == []
    assert psg.on_side_watermark('g', MAX_WATERMARK) == [Released('e', main)]


def test_a_side_window_requested_twice_is_one_edge():
    psg = PendingStatesGraph(['s'])
    psg.add_element('e', 0, None, {0: needs(('s', 0), ('s', 0))})
    assert psg.sizes()['side_windows'] == 1
    assert psg.on_side_data('s', 0, side_max(0)) == [Released('e', 0)]


def test_unknown_side_inputs_are_errors():
    psg = PendingStatesGraph(['s'])
    for call in (lambda: psg.add_element('e', 0, None, {0: needs(('t', 0))}),
                 lambda: psg.on_side_data('t', 0, 9),
                 lambda: psg.on_side_watermark('t', 9),
                 lambda: psg.side_watermark('t')):
        try:
            call()
        except KeyError:
            pass
        else:
            raise AssertionError('an unknown side input must raise KeyError')
    assert len(psg) == 0


def test_pickle_round_trip_mid_way():
    psg = PendingStatesGraph(['a', 'b'])
    psg.on_side_data('a', 1, side_max(1))
    psg.on_side_watermark('b', side_max(0) + 1)
    psg.add_element('e1', 15, 'k', {1: needs(('a', 1), ('b', 1)), 2: needs(('a', 2))})
    psg.add_element('e2', 12, 'j', {1: needs(('b', 1))})
    copy = pickle.loads(pickle.dumps(psg))
    assert copy.sizes() == psg.sizes()
    assert copy.min_hold() == 12 and copy.has_pending('k') and len(copy) == 2
    assert copy.side_watermark('b') == side_max(0) + 1
    assert copy.is_ready('a', 1, side_max(1))
    assert copy.on_side_watermark('b', side_max(1) + 1) == [Released('e1', 1), Released('e2', 1)]
    assert copy.add_element('e3', 0, None, {1: needs(('a', 1), ('b', 1))}) == [1]
    assert copy.on_side_data('a', 2, side_max(2)) == [Released('e1', 2)]
    assert len(copy) == 0 and copy.min_hold() is None
    assert len(psg) == 2  # the original is untouched


# State machine against a brute-force model -----------------------------------------

SIDE_INPUTS = ['s1', 's2', 's3']
KEY_POOL = ['a', 'b', None]
SIDE_WINDOW_RANGE = range(-4, 12)  # every side window the machine can ask for

# Main window w asks, per chosen side input, for side window w + offset (past,
# same or future windows).
WINDOW_SPECS = st.lists(
    st.tuples(
        st.integers(0, 7),
        st.dictionaries(st.sampled_from(SIDE_INPUTS), st.integers(-2, 2), max_size=3),
    ),
    max_size=3,
    unique_by=lambda spec: spec[0],
)
# Watermarks near window ends: one below, at and above a max timestamp.
WATERMARKS = st.builds(lambda w, d: side_max(w) + d, st.integers(-3, 11), st.integers(-1, 1))


class PsgModel:
    """The obviously correct (and slow) version of the graph."""

    def __init__(self, side_inputs):
        self.watermarks = dict.fromkeys(side_inputs, MIN_WATERMARK)
        self.data = set()  # (side input, side window) that received data, never forgotten
        self.pending = []  # (payload, timestamp, key, main window, requests), in release order

    def is_ready(self, side_input, side_window, max_timestamp):
        return (self.watermarks[side_input] > max_timestamp
                or (side_input, side_window) in self.data)

    def all_ready(self, requests):
        return all(self.is_ready(*request) for request in requests)

    def add_element(self, payload, timestamp, key, windows):
        runnable = []
        for main_window, requests in windows.items():
            if self.all_ready(requests):
                runnable.append(main_window)
            else:
                self.pending.append((payload, timestamp, key, main_window, tuple(requests)))
        return runnable

    def sweep(self):
        released = [Released(p[0], p[3]) for p in self.pending if self.all_ready(p[4])]
        self.pending = [p for p in self.pending if not self.all_ready(p[4])]
        return released

    def on_side_data(self, side_input, side_window):
        self.data.add((side_input, side_window))
        return self.sweep()

    def on_side_watermark(self, side_input, watermark):
        self.watermarks[side_input] = max(self.watermarks[side_input], watermark)
        return self.sweep()

    def sizes(self):
        not_ready = {
            (side_input, side_window)
            for *_, requests in self.pending
            for side_input, side_window, max_timestamp in requests
            if not self.is_ready(side_input, side_window, max_timestamp)
        }
        remembered = [(s, w) for s, w in self.data if side_max(w) >= self.watermarks[s]]
        return {
            'side_windows': len(not_ready),
            'main_windows': len(self.pending),
            'elements': len({p[0] for p in self.pending}),
            'ready_windows': len(remembered),
        }


class PendingStatesGraphMachine(RuleBasedStateMachine):
    """Random elements, side data, side watermarks and pickling, compared with `PsgModel`."""

    def __init__(self):
        super().__init__()
        self.psg = PendingStatesGraph(SIDE_INPUTS)
        self.model = PsgModel(SIDE_INPUTS)
        self.ids = itertools.count()
        self.added = set()  # every (payload, main window) given to add_element
        self.ran = set()  # every (payload, main window) run now or released

    def record_runs(self, pairs):
        for pair in pairs:
            assert pair not in self.ran, f'{pair} ran twice'
            self.ran.add(pair)

    @rule(spec=WINDOW_SPECS, timestamp=st.integers(-50, 120), key=st.sampled_from(KEY_POOL))
    def add_element(self, spec, timestamp, key):
        payload = ('e', next(self.ids))
        windows = {
            main: [(side_input, main + offset, side_max(main + offset))
                   for side_input, offset in offsets.items()]
            for main, offsets in spec
        }
        runnable = self.psg.add_element(payload, timestamp, key, windows)
        assert runnable == self.model.add_element(payload, timestamp, key, windows)
        self.added.update((payload, main) for main in windows)
        self.record_runs((payload, main) for main in runnable)

    @rule(side_input=st.sampled_from(SIDE_INPUTS), side_window=st.integers(-3, 10))
    def on_side_data(self, side_input, side_window):
        released = self.psg.on_side_data(side_input, side_window, side_max(side_window))
        assert released == self.model.on_side_data(side_input, side_window)
        self.record_runs(released)

    @rule(side_input=st.sampled_from(SIDE_INPUTS), watermark=WATERMARKS)
    def on_side_watermark(self, side_input, watermark):
        released = self.psg.on_side_watermark(side_input, watermark)
        assert released == self.model.on_side_watermark(side_input, watermark)
        self.record_runs(released)

    @rule()
    def pickle_round_trip(self):
        self.psg = pickle.loads(pickle.dumps(self.psg))

    @invariant()
    def agrees_with_model(self):
        pending = self.model.pending
        assert len(self.psg) == len({p[0] for p in pending})
        assert self.psg.sizes() == self.model.sizes()
        assert self.psg.min_hold() == (min(p[1] for p in pending) if pending else None)
        for key in KEY_POOL:
            assert self.psg.has_pending(key) == any(p[2] == key for p in pending)
        for side_input in SIDE_INPUTS:
            assert self.psg.side_watermark(side_input) == self.model.watermarks[side_input]
            for window in SIDE_WINDOW_RANGE:
                assert (self.psg.is_ready(side_input, window, side_max(window))
                        == self.model.is_ready(side_input, window, side_max(window)))

    @invariant()
    def nothing_lost(self):
        pending = {(p[0], p[3]) for p in self.model.pending}
        assert not pending & self.ran
        assert pending | self.ran == self.added

    def teardown(self):
        # The final side watermarks release everything still pushed back.
        for side_input in SIDE_INPUTS:
            released = self.psg.on_side_watermark(side_input, MAX_WATERMARK)
            assert released == self.model.on_side_watermark(side_input, MAX_WATERMARK)
            self.record_runs(released)
        assert self.ran == self.added
        assert len(self.psg) == 0 and self.psg.min_hold() is None
        assert self.psg.sizes() == {'side_windows': 0, 'main_windows': 0, 'elements': 0,
                                    'ready_windows': 0}


PendingStatesGraphMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None)
TestPendingStatesGraphStateful = PendingStatesGraphMachine.TestCase
