"""The Pending States Graph: main-input elements waiting for side-input windows.

Design section 6 (Li et al., PVLDB 11(12) 2018, section 4.2). Each ParDo
partition keeps ONE graph (not one per key) with three tiers:

* tier 1: requested side-input windows that are not ready yet. Per side input
  they are kept ordered by the window's max timestamp, so that a side watermark
  advance expires them with a range scan instead of visiting every node;
* tier 2: (pushed-back element, main window) pairs, with an edge from every
  tier-1 window they still wait for;
* tier 3: pushed-back elements, with an edge from each of their tier-2 pairs.

Algorithm 1 (`add_element`): for each main window of an element, the side
windows it needs (one per side input, mapped by the caller's
`WindowMappingFn`) are checked; if all are ready the pair runs now, otherwise
it is pushed back into the three tiers. Algorithm 2 (`on_side_data`,
`on_side_watermark`): the side windows that became ready lose their tier-1
node and its edges; a tier-2 pair whose last incoming edge went is released
(the DoFn runs for that element in that window); a tier-3 element disappears
once all of its pushed-back windows were released.

A side window is ready when data arrived in it, or when its side input's
watermark is past its end (watermark > window max timestamp); once ready it
stays ready. Windows made ready by data are remembered only until the side
watermark passes their max timestamp, from then on the watermark alone makes
them ready, so that memory stays flat however long the stream runs.

Released pairs always come out in the order the elements were added and, per
element, in the order of its windows: tier-2 nodes are numbered in that order,
and each release sorts by that number. Pushed-back elements hold the ParDo's
output watermark (`min_hold`) and pin their key's state (`has_pending`).

Side windows are only required to be hashable (Beam windows need not be
mutually comparable), so every ordered index breaks max-timestamp ties with a
sequence number. Everything is plain dicts, lists, small slotted classes and
sortedcontainers, so the graph pickles as-is. The runner does not persist it
whole: the side-input gate persists its side watermarks and its pushed-back
elements in chunks, one graph element per chunk, and rebuilds a graph from them
(`translators/side_input_gate`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from sortedcontainers import SortedDict, SortedList

from beam_streams_runner.records import MIN_WATERMARK

# (side input id, side window, side window max timestamp in micros)
SideWindowRequest = tuple[Hashable, Hashable, int]


class Released(NamedTuple):
    """A pushed-back element whose main window may now run the DoFn."""

    payload: Any
    main_window: Hashable


class _SideWindowNode:
    """Tier 1: a requested side window that is not ready yet."""

    __slots__ = ('order_key', 'waiting')

    def __init__(self, order_key: tuple[int, int]) -> None:
        self.order_key = order_key  # (max timestamp, sequence): its place in the order
        self.waiting: list[int] = []  # ids of the tier-2 nodes waiting for it


class _MainWindowNode:
    """Tier 2: one (pushed-back element, main window) pair."""

    __slots__ = ('element_id', 'main_window', 'missing')

    def __init__(self, element_id: int, main_window: Hashable, missing: int) -> None:
        self.element_id = element_id
        self.main_window = main_window
        self.missing = missing  # incoming edges left: side windows not ready yet


class _ElementNode:
    """Tier 3: a pushed-back element."""

    __slots__ = ('key', 'payload', 'pending_windows', 'timestamp')

    def __init__(self, payload: Any, timestamp: int, key: Hashable, pending_windows: int) -> None:
        self.payload = payload
        self.timestamp = timestamp
        self.key = key
        self.pending_windows = pending_windows  # tier-2 nodes not released yet


class _SideInputState:
    """Everything the graph knows about one side input."""

    __slots__ = ('not_ready', 'not_ready_order', 'ready', 'ready_order', 'watermark')

    def __init__(self) -> None:
        self.watermark = MIN_WATERMARK
        # Tier 1: side window -> node, plus (max timestamp, seq) -> side window, ordered.
        self.not_ready: dict[Hashable, _SideWindowNode] = {}
        self.not_ready_order: SortedDict = SortedDict()
        # Windows made ready by data that the watermark has not passed yet, same layout.
        self.ready: dict[Hashable, tuple[int, int]] = {}
        self.ready_order: SortedDict = SortedDict()


class PendingStatesGraph:
    """The pushed-back main-input elements of one ParDo partition (paper section 4.2)."""

    def __init__(self, side_inputs: Iterable[Hashable]) -> None:
        self._sides: dict[Hashable, _SideInputState] = {
            side_input: _SideInputState() for side_input in side_inputs}
        self._seq = 0  # tie-breaker in the side-window orders (windows need not compare)
        self._next_main_id = 0  # tier-2 ids grow in release order: element, then window
        self._next_element_id = 0
        self._main_windows: dict[int, _MainWindowNode] = {}
        self._elements: dict[int, _ElementNode] = {}
        self._holds: SortedList = SortedList()  # (element timestamp, element id)
        self._pending_by_key: dict[Hashable, int] = {}
        self.last_pushed_back: int | None = None  # the element `add_element` pushed back last

    # Queries -----------------------------------------------------------------------
    def side_watermark(self, side_input: Hashable) -> int:
        return self._sides[side_input].watermark

    def is_ready(self, side_input: Hashable, side_window: Hashable, max_timestamp: int) -> bool:
        side = self._sides[side_input]
        return side.watermark > max_timestamp or side_window in side.ready

    def min_hold(self) -> int | None:
        """Smallest timestamp of any pushed-back element (it holds the output watermark)."""
        return self._holds[0][0] if self._holds else None

    def has_pending(self, key: Hashable) -> bool:
        """Whether any pushed-back element has this key (its state must not be collected).

        Keys are counted as given, None included: `has_pending(None)` tells
        whether an element added without a key is pushed back.
        """
        return key in self._pending_by_key

    def __len__(self) -> int:
        return len(self._elements)

    def sizes(self) -> dict[str, int]:
        return {
            'side_windows': sum(len(side.not_ready) for side in self._sides.values()),
            'main_windows': len(self._main_windows),
            'elements': len(self._elements),
            'ready_windows': sum(len(side.ready) for side in self._sides.values()),
        }

    # Algorithm 1: a main-input element arrives ------------------------------------
    def add_element(
        self,
        payload: Any,
        timestamp: int,
        key: Hashable | None,
        windows: Mapping[Hashable, Sequence[SideWindowRequest]],
    ) -> list[Hashable]:
        """Returns the main windows that may run now, in the given order.

        `windows` maps each main window of the element to the side windows it
        needs, `(side input id, side window, side window max timestamp)`. The
        other main windows are pushed back and come out later as `Released`; the
        element's id is then `last_pushed_back` (for `lower_hold`).
        """
        runnable: list[Hashable] = []
        blocked: list[tuple[Hashable, list[tuple[_SideInputState, Hashable, int]]]] = []
        for main_window, requests in windows.items():
            missing = []
            seen: set[tuple[Hashable, Hashable]] = set()
            for side_input, side_window, max_timestamp in requests:
                if (side_input, side_window) in seen:  # asked twice: one edge is enough
                    continue
                seen.add((side_input, side_window))
                if not self.is_ready(side_input, side_window, max_timestamp):
                    missing.append((self._sides[side_input], side_window, max_timestamp))
            if missing:
                blocked.append((main_window, missing))
            else:
                runnable.append(main_window)
        if not blocked:
            return runnable

        element_id = self.last_pushed_back = self._next_element_id
        self._next_element_id += 1
        self._elements[element_id] = _ElementNode(payload, timestamp, key, len(blocked))
        self._holds.add((timestamp, element_id))
        self._pending_by_key[key] = self._pending_by_key.get(key, 0) + 1
        for main_window, missing in blocked:
            main_id = self._next_main_id
            self._next_main_id += 1
            self._main_windows[main_id] = _MainWindowNode(element_id, main_window, len(missing))
            for side, side_window, max_timestamp in missing:
                node = side.not_ready.get(side_window)
                if node is None:
                    node = _SideWindowNode((max_timestamp, self._next_seq()))
                    side.not_ready[side_window] = node
                    side.not_ready_order[node.order_key] = side_window
                node.waiting.append(main_id)
        return runnable

    def lower_hold(self, element_id: int, timestamp: int) -> None:
        """Pushed-back element `element_id` holds the output watermark at `timestamp`
        if that is earlier than its own: it stands for several elements (the side-input
        gate pushes back a chunk of elements waiting for the same side windows as one)."""
        element = self._elements[element_id]
        if timestamp < element.timestamp:
            self._holds.remove((element.timestamp, element_id))
            element.timestamp = timestamp
            self._holds.add((timestamp, element_id))

    # Algorithm 2: side data or a side watermark -------------------------------------
    def on_side_data(
        self, side_input: Hashable, side_window: Hashable, max_timestamp: int
    ) -> list[Released]:
        """Data arrived in `side_window`: it is ready from now on."""
        side = self._sides[side_input]
        if side.watermark > max_timestamp or side_window in side.ready:
            # Already ready, so nothing can wait for it; a window the watermark has
            # passed is not remembered (the watermark keeps it ready).
            return []
        order_key = (max_timestamp, self._next_seq())
        side.ready[side_window] = order_key
        side.ready_order[order_key] = side_window
        node = side.not_ready.pop(side_window, None)
        if node is None:
            return []
        del side.not_ready_order[node.order_key]
        return self._release(node.waiting)

    def on_side_watermark(self, side_input: Hashable, watermark: int) -> list[Released]:
        """The side input's watermark advanced: every window ending before it is ready."""
        side = self._sides[side_input]
        if watermark <= side.watermark:
            return []  # watermarks only move forward
        side.watermark = watermark
        # Range scans: the windows whose max timestamp is below the watermark.
        bound = (watermark,)  # sorts after every (max timestamp < watermark, seq)
        for order_key in list(side.ready_order.irange(maximum=bound, inclusive=(True, False))):
            del side.ready[side.ready_order.pop(order_key)]
        waiting: list[int] = []
        for order_key in list(side.not_ready_order.irange(maximum=bound, inclusive=(True, False))):
            waiting.extend(side.not_ready.pop(side.not_ready_order.pop(order_key)).waiting)
        return self._release(waiting)

    # Internals -----------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _release(self, main_ids: list[int]) -> list[Released]:
        """Removes one incoming edge from each listed tier-2 node; releases the freed ones."""
        freed = []
        for main_id in main_ids:
            node = self._main_windows[main_id]
            node.missing -= 1
            if not node.missing:
                freed.append(main_id)
        freed.sort()  # tier-2 ids follow element arrival, then window order
        released = []
        for main_id in freed:
            node = self._main_windows.pop(main_id)
            element = self._elements[node.element_id]
            released.append(Released(element.payload, node.main_window))
            element.pending_windows -= 1
            if not element.pending_windows:
                self._forget_element(node.element_id, element)
        return released

    def _forget_element(self, element_id: int, element: _ElementNode) -> None:
        del self._elements[element_id]
        self._holds.remove((element.timestamp, element_id))
        remaining = self._pending_by_key[element.key] - 1
        if remaining:
            self._pending_by_key[element.key] = remaining
        else:
            del self._pending_by_key[element.key]
