"""Beam's Fn API state protocol served from a partition's own structures.

The SDK harness asks for state with `StateKey` protos (design section 9: the
harness's `BundleProcessor` runs user DoFns with Beam's own state, timer and
side-input machinery). This module answers those requests:

* user state (bag, combining, set: `bag_user_state`; `ordered_list_user_state`;
  `multimap_user_state`) from the partition's `KeyedStateBackend`, keyed by the
  encoded user key, so that expiry and checkpoints work per key;
* side inputs (`iterable_side_input`, `multimap_*_side_input`) from the
  read-only, pre-encoded map built by the driver from the side input's
  PCollection (broadcast to every task).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from apache_beam.coders import coders
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker import sdk_worker
from sortedcontainers import SortedDict

from beam_streams_runner.state.backend import KeyedStateBackend

_SIDE_INPUT_TYPES = frozenset([
    'iterable_side_input',
    'multimap_side_input',
    'multimap_keys_side_input',
    'multimap_keys_values_side_input',
])

_ORDERED_ENTRY_CODER = coders.TupleCoder(
    [coders.VarIntCoder(), coders.LengthPrefixCoder(coders.BytesCoder())]).get_impl()


class _Done(sdk_worker._Future):
    """A completed future, as Beam's own in-memory state servicer returns, minus the
    `threading.Event` every `wait` would go through (state requests here complete
    when they return; the harness waits on one per state written per bundle)."""

    def __init__(self) -> None:
        self._value = None

    def wait(self, timeout=None) -> bool:
        return True

    def get(self, timeout=None) -> None:
        return None


_DONE = _Done()


class PartitionStateHandler(sdk_worker.StateHandler):
    """A `StateHandler` over one partition's keyed-state backend and side inputs.

    A user state cell is the namespace `(transform id, state id, encoded window)`
    (`+ (map key,)` for a multimap entry) of its encoded user key: a list of encoded
    chunks, or for an ordered list a `SortedDict` from sort key to entries.
    """

    def __init__(
        self,
        state: KeyedStateBackend | None = None,
        side_inputs: Mapping[bytes, bytes] | None = None,
        window_max_timestamp: Callable[[str, bytes], int] | None = None,
    ) -> None:
        self.state = state if state is not None else KeyedStateBackend()
        self.side_inputs = side_inputs if side_inputs is not None else {}
        self._window_max_timestamp = window_max_timestamp

    @contextlib.contextmanager
    def process_instruction_id(self, bundle_id: str) -> Iterator[None]:
        yield

    def done(self) -> None:
        pass

    def get_raw(
        self, state_key: beam_fn_api_pb2.StateKey, continuation_token: bytes | None = None
    ) -> tuple[bytes, None]:
        kind = state_key.WhichOneof('type')
        if kind in _SIDE_INPUT_TYPES:
            return self.side_inputs.get(state_key.SerializeToString(), b''), None
        if kind == 'bag_user_state':
            key, cell = _cell(state_key.bag_user_state)
            return b''.join(self.state.get(key, cell, ())), None
        if kind == 'ordered_list_user_state':
            spec = state_key.ordered_list_user_state
            key, cell = _cell(spec)
            entries = self.state.get(key, cell)
            if not entries:
                return b'', None
            return b''.join(
                part for sort_key in entries.irange(
                    spec.range.start, spec.range.end, inclusive=(True, False))
                for part in entries[sort_key]), None
        if kind == 'multimap_user_state':
            spec = state_key.multimap_user_state
            key, cell = _cell(spec)
            return b''.join(self.state.get(key, (*cell, spec.map_key), ())), None
        if kind == 'multimap_keys_user_state':
            key, cell = _cell(state_key.multimap_keys_user_state)
            return b''.join(map_cell[len(cell)] for map_cell in self._map_cells(key, cell)), None
        raise NotImplementedError(f'State type {kind!r} is not supported by StreamsSparkRunner')

    def append_raw(self, state_key: beam_fn_api_pb2.StateKey, data: bytes) -> sdk_worker._Future:
        kind = state_key.WhichOneof('type')
        if kind == 'bag_user_state':
            self._append(*self._written_cell(state_key.bag_user_state), data)
        elif kind == 'ordered_list_user_state':
            key, cell = self._written_cell(state_key.ordered_list_user_state)
            entries = self.state.get(key, cell)
            if entries is None:
                entries = SortedDict()
                self.state.put(key, cell, entries)
            else:
                self.state.mark_changed(key)
            for sort_key, value in _ORDERED_ENTRY_CODER.decode_all(data):
                entries.setdefault(sort_key, []).append(
                    _ORDERED_ENTRY_CODER.encode((sort_key, value)))
        elif kind == 'multimap_user_state':
            spec = state_key.multimap_user_state
            key, cell = self._written_cell(spec)
            self._append(key, (*cell, spec.map_key), data)
        else:
            raise NotImplementedError(f'Cannot append to state of type {kind!r}')
        return _DONE

    def clear(self, state_key: beam_fn_api_pb2.StateKey) -> sdk_worker._Future:
        kind = state_key.WhichOneof('type')
        if kind == 'bag_user_state':
            self.state.delete(*_cell(state_key.bag_user_state))
        elif kind == 'ordered_list_user_state':
            spec = state_key.ordered_list_user_state
            key, cell = _cell(spec)
            self._ordered_clear(key, cell, spec.range.start, spec.range.end)
        elif kind == 'multimap_user_state':
            spec = state_key.multimap_user_state
            key, cell = _cell(spec)
            self.state.delete(key, (*cell, spec.map_key))
        elif kind == 'multimap_keys_user_state':
            key, cell = _cell(state_key.multimap_keys_user_state)
            for map_cell in self._map_cells(key, cell):
                self.state.delete(key, map_cell)
        else:
            raise NotImplementedError(f'Cannot clear state of type {kind!r}')
        return _DONE

    def _append(self, key: bytes, cell: tuple, data: bytes) -> None:
        chunks = self.state.get(key, cell)
        if chunks is None:
            self.state.put(key, cell, [data])
        else:
            chunks.append(data)
            self.state.mark_changed(key)

    def _ordered_clear(self, key: bytes, cell: tuple, start: int, end: int) -> None:
        entries = self.state.get(key, cell)
        if not entries:
            return
        doomed = list(entries.irange(start, end, inclusive=(True, False)))
        if not doomed:
            return
        for sort_key in doomed:
            del entries[sort_key]
        if entries:
            self.state.mark_changed(key)
        else:
            self.state.delete(key, cell)

    def _map_cells(self, key: bytes, cell: tuple) -> list[tuple]:
        """The multimap entries of `cell` (each `cell + (map key,)`) holding values."""
        n = len(cell)
        return [c for c in self.state.namespaces(key)
                if len(c) == n + 1 and c[:n] == cell and self.state.get(key, c)]

    def _written_cell(self, spec) -> tuple[bytes, tuple]:
        """The cell about to be written; its window joins the key's expiry index."""
        if self._window_max_timestamp is not None:
            self.state.add_window(
                spec.key, self._window_max_timestamp(spec.transform_id, spec.window))
        return _cell(spec)


def _cell(spec) -> tuple[bytes, tuple]:
    return spec.key, (spec.transform_id, spec.user_state_id, spec.window)
