"""Beam's Fn API state protocol served from a partition's own structures.

The SDK harness asks for state with `StateKey` protos (design section 9: the
harness's `BundleProcessor` runs user DoFns with Beam's own state, timer and
side-input machinery). This module answers those requests:

* user state (bag, combining, set: `bag_user_state`; `ordered_list_user_state`;
  `multimap_user_state`) from the partition's `KeyedStateStore`, keyed by the
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

from beam_streams_runner.state.keyed_state import KeyedStateStore

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
    """A `StateHandler` over one partition's keyed state and side inputs."""

    def __init__(
        self,
        keyed_state: KeyedStateStore | None = None,
        side_inputs: Mapping[bytes, bytes] | None = None,
        window_max_timestamp: Callable[[str, bytes], int] | None = None,
    ) -> None:
        self.keyed_state = keyed_state if keyed_state is not None else KeyedStateStore()
        # Streaming: the driver replaces it each epoch as the side inputs fill.
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
            key, cell = self._cell(state_key.bag_user_state)
            return b''.join(self.keyed_state.get(key, cell)), None
        if kind == 'ordered_list_user_state':
            spec = state_key.ordered_list_user_state
            key, cell = self._cell(spec)
            return b''.join(
                self.keyed_state.ordered_range(key, cell, spec.range.start, spec.range.end)
            ), None
        if kind == 'multimap_user_state':
            spec = state_key.multimap_user_state
            key, cell = self._cell(spec)
            return b''.join(self.keyed_state.get(key, (*cell, spec.map_key))), None
        if kind == 'multimap_keys_user_state':
            spec = state_key.multimap_keys_user_state
            key, cell = self._cell(spec)
            map_keys = self.keyed_state.cells_with_prefix(key, cell)
            return b''.join(c[len(cell)] for c in map_keys if self.keyed_state.get(key, c)), None
        raise NotImplementedError(f'State type {kind!r} is not supported by StreamsSparkRunner')

    def append_raw(self, state_key: beam_fn_api_pb2.StateKey, data: bytes) -> sdk_worker._Future:
        kind = state_key.WhichOneof('type')
        if kind == 'bag_user_state':
            key, cell = self._written_cell(state_key.bag_user_state)
            self.keyed_state.append(key, cell, data)
        elif kind == 'ordered_list_user_state':
            key, cell = self._written_cell(state_key.ordered_list_user_state)
            for sort_key, value in _ORDERED_ENTRY_CODER.decode_all(data):
                self.keyed_state.ordered_add(
                    key, cell, sort_key, _ORDERED_ENTRY_CODER.encode((sort_key, value)))
        elif kind == 'multimap_user_state':
            spec = state_key.multimap_user_state
            key, cell = self._written_cell(spec)
            self.keyed_state.append(key, (*cell, spec.map_key), data)
        else:
            raise NotImplementedError(f'Cannot append to state of type {kind!r}')
        return _DONE

    def clear(self, state_key: beam_fn_api_pb2.StateKey) -> sdk_worker._Future:
        kind = state_key.WhichOneof('type')
        if kind == 'bag_user_state':
            self.keyed_state.clear(*self._cell(state_key.bag_user_state))
        elif kind == 'ordered_list_user_state':
            spec = state_key.ordered_list_user_state
            key, cell = self._cell(spec)
            self.keyed_state.ordered_clear(key, cell, spec.range.start, spec.range.end)
        elif kind == 'multimap_user_state':
            spec = state_key.multimap_user_state
            key, cell = self._cell(spec)
            self.keyed_state.clear(key, (*cell, spec.map_key))
        elif kind == 'multimap_keys_user_state':
            key, cell = self._cell(state_key.multimap_keys_user_state)
            for map_cell in self.keyed_state.cells_with_prefix(key, cell):
                self.keyed_state.clear(key, map_cell)
        else:
            raise NotImplementedError(f'Cannot clear state of type {kind!r}')
        return _DONE

    def _cell(self, spec) -> tuple[bytes, tuple]:
        return spec.key, (spec.transform_id, spec.user_state_id, spec.window)

    def _written_cell(self, spec) -> tuple[bytes, tuple]:
        """The cell about to be written; its window joins the key's expiry index."""
        if self._window_max_timestamp is not None:
            self.keyed_state.index.add_window(
                spec.key, self._window_max_timestamp(spec.transform_id, spec.window))
        return self._cell(spec)
