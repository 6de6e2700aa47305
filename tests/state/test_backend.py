"""The keyed-state backend's contract, against a dict model (hypothesis state machines).

Design sections 7 and 8. Random sequences of writes (values per key and
namespace, windows, timers, holds, the partition's own values), expiry by
watermark, firing of due timers, deltas and restores run on a live
`KeyedStateBackend` and on a model made of plain dicts. After every step the
live backend must read as the model; at every checkpoint a backend restored
from the sum of the deltas so far (and one restored from a `snapshot`) must
read as the live one, so a partition rebuilt in another Python worker behaves
as the one that wrote it.

The same machine runs with the values each stateful operator keeps (a stateful
ParDo's cells, a GroupByKey's trigger state, a side-input gate's pushed-back
pairs), each through the codec the operator hands its backend (`contract_for`).
Values are compared in a plain form (`BackendContract.plain`): Beam's
`InMemoryUnmergedState` has no `__eq__`.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping

from apache_beam.transforms import trigger, window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from beam_streams_runner.records import MAX_WATERMARK
from beam_streams_runner.state.backend import (
    EVENT_TIME,
    PICKLE_CODEC,
    PROCESSING_TIME,
    KeyedStateBackend,
    split_entry,
)
from beam_streams_runner.translators.beam_trigger_panes import (
    TRIGGER,
    TRIGGER_STATE_CODEC,
    _plain,
)

KEYS = st.sampled_from([b'', b'a', b'b', b'\xff', b'k\x00'])
TIMESTAMPS = st.integers(-10, 10)
DOMAINS = st.sampled_from([EVENT_TIME, PROCESSING_TIME])
TIMER_NAMES = st.sampled_from([('f1', b'x'), ('f1', b'y'), ('f2', b'')])
LATENESS = 2


def _same(value):
    return value


def observe(backend: KeyedStateBackend, plain=_same) -> dict:
    """Everything an operator can read from `backend`, as plain data (each value as
    `plain(value)` gives it)."""
    values = {(key, namespace): plain(backend.get(key, namespace))
              for key in backend.keys() for namespace in backend.namespaces(key)}
    windows = {key: backend.expiry.windows(key) for key in backend.expiry.keys()}
    timers = {domain: {key: backend.timers(domain).timers_of(key)
                       for key in backend.timers(domain).keys()}
              for domain in (EVENT_TIME, PROCESSING_TIME)}
    holds = {key: backend.hold(key) for key in backend.all_keys()
             if backend.hold(key) is not None}
    return {
        'values': values, 'windows': windows, 'timers': timers, 'holds': holds,
        'min_hold': backend.min_hold(), 'live_keys': backend.live_keys(),
        'meta': (backend.watermark, backend.processing_time, backend.get_meta('note')),
        'next_seq': (backend.event_timers.next_seq, backend.processing_timers.next_seq),
    }


def decoded(state: Mapping[bytes, bytes], values=list) -> dict:
    """A delta's (or a state's) values as plain data: b'm' unpickled, each key's header
    (windows, hold, timers) and `values` of its (namespace, value) pairs. Both codecs
    write pickles (the trigger state's as plain lists), so `pickle.loads` reads either;
    two encodings of equal state may differ in their bytes (pickle's memo follows
    object identity)."""
    out = {}
    for name, value in state.items():
        if name == b'm':
            out[name] = pickle.loads(value)
            continue
        header, body = split_entry(value)
        out[name] = (header, values(pickle.loads(body) if body else ()))
    return out


def apply_delta(state: dict[bytes, bytes], delta: tuple[dict, set]) -> None:
    dirty, deleted = delta
    assert not dirty.keys() & deleted
    state.update(dirty)
    for key in deleted:
        state.pop(key, None)


def firing_order(timers: dict) -> list:
    """Timer ids of {timer id: (arrival, fire, hold, payload)} in the order they fire."""
    return sorted(timers, key=lambda timer_id: (timers[timer_id][1], timers[timer_id][0]))


class BackendContract(RuleBasedStateMachine):
    """`KeyedStateBackend` against a model of dicts; `codec`/`values` set per operator."""

    codec = PICKLE_CODEC
    namespaces = st.sampled_from(['n'])
    values = st.none()

    @staticmethod
    def plain(value):
        """`value` in a form `==` compares by content (a hook per operator's values)."""
        return value

    def __init__(self) -> None:
        super().__init__()
        self.backend = KeyedStateBackend(self.codec, track_changes=True)
        self.saved: dict[bytes, bytes] = {}
        self.model_values: dict[tuple[bytes, object], object] = {}
        self.model_windows: dict[bytes, set[int]] = {}
        # domain -> timer id -> (arrival, fire, hold, payload)
        self.model_timers: dict[str, dict] = {EVENT_TIME: {}, PROCESSING_TIME: {}}
        self.arrivals = {EVENT_TIME: 0, PROCESSING_TIME: 0}
        self.model_holds: dict[bytes, int] = {}
        self.note = None

    # Writes --------------------------------------------------------------------------
    @rule(key=KEYS, data=st.data())
    def put(self, key, data):
        namespace = data.draw(self.namespaces)
        value = data.draw(self.values)
        self.backend.put(key, namespace, value)
        self.model_values[(key, namespace)] = value

    @rule(key=KEYS, data=st.data())
    def delete(self, key, data):
        namespace = data.draw(self.namespaces)
        self.backend.delete(key, namespace)
        self.model_values.pop((key, namespace), None)

    @rule(key=KEYS)
    def delete_key(self, key):
        self.backend.delete_key(key)
        self._model_delete_key(key)

    @rule(key=KEYS, window=TIMESTAMPS)
    def add_window(self, key, window):
        self.backend.add_window(key, window)
        self.model_windows.setdefault(key, set()).add(window)

    @rule(key=KEYS, domain=DOMAINS, name=TIMER_NAMES, fire=TIMESTAMPS,
          hold=st.none() | TIMESTAMPS, payload=st.binary(max_size=3))
    def set_timer(self, key, domain, name, fire, hold, payload):
        timer_id = (key, *name)
        self.backend.timers(domain).set(timer_id, fire, payload, hold)
        self.model_timers[domain][timer_id] = (
            self.arrivals[domain], fire, fire if hold is None else hold, payload)
        self.arrivals[domain] += 1

    @rule(key=KEYS, domain=DOMAINS, name=TIMER_NAMES)
    def clear_timer(self, key, domain, name):
        self.backend.timers(domain).clear((key, *name))
        self.model_timers[domain].pop((key, *name), None)

    @rule(key=KEYS, hold=st.none() | TIMESTAMPS)
    def set_hold(self, key, hold):
        self.backend.set_hold(key, hold)
        if hold is None:
            self.model_holds.pop(key, None)
        else:
            self.model_holds[key] = hold

    @rule(watermark=TIMESTAMPS, now=TIMESTAMPS, note=st.integers(0, 3))
    def advance_meta(self, watermark, now, note):
        self.backend.watermark = watermark
        self.backend.processing_time = now
        self.backend.put_meta('note', note)
        self.note = note

    # Expiry and timers in order ----------------------------------------------------------
    @rule(watermark=TIMESTAMPS, pinned=st.sets(KEYS))
    def expire(self, watermark, pinned):
        deleted = self.backend.expire(watermark, LATENESS, pinned.__contains__)
        expected = sorted(
            key for key, windows in self.model_windows.items()
            if windows and max(windows) + LATENESS < watermark and key not in pinned
            and not any(timer_id[0] == key for timers in self.model_timers.values()
                        for timer_id in timers))
        assert sorted(deleted) == expected
        for key in deleted:
            self._model_delete_key(key)

    @rule(domain=DOMAINS, up_to=TIMESTAMPS)
    def pop_due(self, domain, up_to):
        due = self.backend.timers(domain).pop_due(up_to)
        model = self.model_timers[domain]
        earliest: dict[bytes, tuple] = {}
        for timer_id, (arrival, fire, _, _) in model.items():
            if fire <= up_to:
                key = timer_id[0]
                if key not in earliest or (fire, arrival) < earliest[key][:2]:
                    earliest[key] = (fire, arrival, timer_id)
        expected = [timer_id for _, _, timer_id in sorted(earliest.values())]
        assert [timer.timer_id for timer in due] == expected
        for timer_id in expected:
            del model[timer_id]

    # Checkpoints -----------------------------------------------------------------------
    @rule()
    def checkpoint(self):
        apply_delta(self.saved, self.backend.take_delta())
        restored = KeyedStateBackend(self.codec)
        restored.restore(self.saved)
        live = observe(self.backend, self.plain)
        assert observe(restored, self.plain) == live
        from_snapshot = KeyedStateBackend(self.codec)
        from_snapshot.restore(self.backend.snapshot())
        assert observe(from_snapshot, self.plain) == live

    @precondition(lambda self: self.saved)
    @rule()
    def continue_on_the_restored_backend(self):
        """A task landing in another worker: the next epoch runs on a restored backend."""
        self.checkpoint()
        self.backend = KeyedStateBackend(self.codec)
        self.backend.restore(self.saved)

    # The model ------------------------------------------------------------------------
    def _model_delete_key(self, key: bytes) -> None:
        for cell in [cell for cell in self.model_values if cell[0] == key]:
            del self.model_values[cell]
        self.model_windows.pop(key, None)
        self.model_holds.pop(key, None)
        for timers in self.model_timers.values():
            for timer_id in [t for t in timers if t[0] == key]:
                del timers[timer_id]

    @invariant()
    def reads_as_the_model(self):
        seen = observe(self.backend, self.plain)
        assert seen['values'] == {cell: self.plain(value)
                                  for cell, value in self.model_values.items()}
        assert seen['windows'] == {k: sorted(w) for k, w in self.model_windows.items() if w}
        for domain, timers in self.model_timers.items():
            flat = {timer.timer_id: (seq, timer.fire_timestamp, timer.hold_timestamp,
                                     timer.payload)
                    for entries in seen['timers'][domain].values() for seq, timer in entries}
            # The arrival numbers themselves may differ (a timer set again as it is
            # may keep its own): the firing order they give may not.
            assert {i: t[1:] for i, t in flat.items()} == {i: t[1:] for i, t in timers.items()}
            assert firing_order(flat) == firing_order(timers)
        assert seen['holds'] == self.model_holds
        holds = [*self.model_holds.values(),
                 *(hold for timers in self.model_timers.values()
                   for _, _, hold, _ in timers.values())]
        assert seen['min_hold'] == min(holds, default=MAX_WATERMARK)
        assert seen['meta'][2] == self.note


def contract_for(name: str, codec, namespaces, values, plain=None) -> type:
    """The contract's test case for one operator's codec and values (compared as
    `plain(value)` gives them, if given)."""
    attributes = {'codec': codec, 'namespaces': namespaces, 'values': values}
    if plain is not None:
        attributes['plain'] = staticmethod(plain)
    machine = type(name, (BackendContract,), attributes)
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                         deadline=None)
    return machine.TestCase


# A stateful ParDo's cells: (transform, state id, window) -> encoded chunks.
TestParDoCells = contract_for(
    'ParDoCells', PICKLE_CODEC,
    st.sampled_from([('t1', 's1', b'w1'), ('t1', 's1', b'w2'), ('t2', 's2', b'w1')]),
    st.lists(st.binary(max_size=3), min_size=1, max_size=3))

# A side-input gate's pushed-back pairs: one namespace, a tuple per pair.
TestGatePairs = contract_for(
    'GatePairs', PICKLE_CODEC, st.just('pair'),
    st.tuples(st.integers(0, 2), st.binary(max_size=4), TIMESTAMPS, st.none() | KEYS))


# A GroupByKey's trigger state: (user key, Beam's InMemoryUnmergedState), one namespace.
TRIGGER_WINDOWS = st.sampled_from([
    window.GlobalWindow(), window.IntervalWindow(0, 10), window.IntervalWindow(5, 15)])
TRIGGER_TIMESTAMPS = TIMESTAMPS.map(lambda micros: Timestamp(micros=micros))


@st.composite
def trigger_states(draw) -> tuple:
    """(user key, trigger state) with a few states and timers set through Beam's API."""
    state = trigger.InMemoryUnmergedState()
    for _ in range(draw(st.integers(0, 4))):
        w = draw(TRIGGER_WINDOWS)
        kind = draw(st.sampled_from(['list', 'count', 'hold', 'timer', 'cleared', 'global']))
        if kind == 'list':
            state.add_state(w, trigger._ListStateTag('values'), draw(st.binary(max_size=3)))
        elif kind == 'count':
            state.add_state(w, trigger._ReadModifyWriteStateTag('count'),
                            draw(st.integers(0, 3)))
        elif kind == 'hold':
            state.add_state(w, trigger._WatermarkHoldStateTag('watermark', None),
                            draw(TRIGGER_TIMESTAMPS))
        elif kind == 'timer':
            state.set_timer(w, draw(st.sampled_from(['end', 'early'])),
                            draw(st.sampled_from([TimeDomain.WATERMARK, TimeDomain.REAL_TIME])),
                            draw(TRIGGER_TIMESTAMPS))
        elif kind == 'cleared':
            state.set_timer(w, 'end', TimeDomain.WATERMARK, draw(TRIGGER_TIMESTAMPS))
            state.clear_timer(w, 'end', TimeDomain.WATERMARK)
        else:
            state.set_global_state(trigger._ReadModifyWriteStateTag('finished'),
                                   draw(st.booleans()))
    return draw(st.text(max_size=2) | st.integers(0, 3)), state


def plain_trigger_state(value: tuple) -> tuple:
    """A key's (user key, panes' state) as the codec writes it (Beam's trigger state
    as plain lists, the default trigger's windows' panes as they are)."""
    key, state = value
    return _plain(key, state) if isinstance(state, trigger.InMemoryUnmergedState) else value


TestGroupByKeyTriggerState = contract_for(
    'GroupByKeyTriggerState', TRIGGER_STATE_CODEC, st.just(TRIGGER), trigger_states(),
    plain_trigger_state)
