"""Beam's user state context with cheaper combining states (a Beam state adapter).

Design section 9: the SDK harness runs a stateful DoFn's state through Beam's
own `FnApiUserStateContext`; this module only changes how its combining states
copy their CombineFn (see `CheapCombiningStateContext`).
"""

from __future__ import annotations

import contextlib
import pickle

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms import userstate


class CheapCombiningStateContext(bundle_processor.FnApiUserStateContext):
    """Beam's user state context, but combining states copy their CombineFn by
    unpickling it rather than by `copy.deepcopy`.

    Beam's `FnApiUserStateContext` gives every combining state (one per key and
    window a bundle touches) its own deep copy of the spec's CombineFn; a deep copy
    of even `CountCombineFn` (its type hints included) costs more than the rest of
    the element's state access. Unpickling a pickle made once gives an equally fresh
    copy several times faster. A CombineFn that pickle cannot round-trip, or that
    defines its own `__deepcopy__`, is still deep-copied.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pickled_fns: dict[int, tuple[object, bytes | None]] = {}

    def _create_state(self, state_spec, key, window):
        if type(state_spec) is not userstate.CombiningValueStateSpec:
            return super()._create_state(state_spec, key, window)
        combine_fn = state_spec.combine_fn
        entry = self._pickled_fns.get(id(combine_fn))
        if entry is None or entry[0] is not combine_fn:
            entry = self._pickled_fns[id(combine_fn)] = (
                combine_fn, _pickled_or_none(combine_fn))
        if entry[1] is None:
            return super()._create_state(state_spec, key, window)
        bag_state = bundle_processor.SynchronousBagRuntimeState(
            self._state_handler,
            state_key=beam_fn_api_pb2.StateKey(
                bag_user_state=beam_fn_api_pb2.StateKey.BagUserState(
                    transform_id=self._transform_id,
                    user_state_id=state_spec.name,
                    window=self._window_coder.encode(window),
                    key=self._key_coder.encode_nested(key))),
            value_coder=state_spec.coder)
        return bundle_processor.CombiningValueRuntimeState(bag_state, pickle.loads(entry[1]))


@contextlib.contextmanager
def cheap_combining_state():
    """Bundle processors built in this block use `CheapCombiningStateContext` (the harness
    looks Beam's class up by name when it builds a stateful ParDo)."""
    previous = bundle_processor.FnApiUserStateContext
    bundle_processor.FnApiUserStateContext = CheapCombiningStateContext
    try:
        yield
    finally:
        bundle_processor.FnApiUserStateContext = previous


def _pickled_or_none(combine_fn) -> bytes | None:
    if hasattr(type(combine_fn), '__deepcopy__'):
        return None
    try:
        pickled = pickle.dumps(combine_fn, pickle.HIGHEST_PROTOCOL)
        pickle.loads(pickled)
    except Exception:  # noqa: BLE001 - anything pickle cannot round-trip is deep-copied
        return None
    return pickled
