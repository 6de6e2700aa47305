"""The steps of a stateless chain (`translators.chain_steps`).

* `unwrapped_callable` sees through Beam's Map, MapTuple and Filter wrappers after a
  pickle round trip, and leaves FlatMap and class DoFns to their `process`;
* a FlatMap hands its outputs on in batches while it makes them (an Impulse followed by
  a FlatMap generating the input does not pile it all up);
* `integer_assign` gives Beam's windows, in Beam's order, for global, fixed and sliding
  windows (hypothesis), and leaves other WindowFns to Beam's `assign`.

The chain as a whole, planned and run against the harness path, is
`test_stateless_chain`'s.
"""

from __future__ import annotations

import operator

import apache_beam as beam
import pytest
from apache_beam.internal import pickler
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import window
from apache_beam.utils.counters import CounterFactory
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.translators import chain_steps
from beam_streams_runner.translators.chain_steps import unwrapped_callable


def _triple(x):
    return 3 * x


# unwrapped_callable -----------------------------------------------------------------
def _scaled(x, factor=5):
    return factor * x


def _round_trip(transform: beam.ParDo):
    return pickler.loads(pickler.dumps(transform.fn))


class _ClassDoFn(beam.DoFn):
    def process(self, element):
        yield element


@pytest.mark.parametrize('transform, kind, user_fn, call, expected', [
    (beam.Map(_triple), 'map', _triple, (4,), 12),
    (beam.Map(lambda x: x - 1), 'map', None, (4,), 3),
    # A function with a default argument gets Beam's other Map wrapper.
    (beam.Map(_scaled), 'map', _scaled, (4,), 20),
    (beam.Map(abs), 'map', abs, (-4,), 4),
    (beam.MapTuple(operator.sub), 'map_tuple', operator.sub, (7, 2), 5),
    (beam.MapTuple(lambda a, b: a * b), 'map_tuple', None, (7, 2), 14),
    (beam.Filter(lambda x: x > 2), 'filter', None, (3,), True),
    (beam.Filter(bool), 'filter', bool, (0,), False),
])
def test_beams_wrappers_are_seen_through_after_pickling(transform, kind, user_fn, call,
                                                        expected):
    wrapped = transform.fn._fn
    found_kind, found = unwrapped_callable(_round_trip(transform))
    assert found_kind == kind
    assert found(*call) == expected
    # The user's function, not Beam's wrapper (which returns a list, or takes a tuple).
    user = user_fn if user_fn is not None else wrapped.__closure__[0].cell_contents
    assert found is user or found.__code__.co_code == user.__code__.co_code
    assert found is not wrapped


@pytest.mark.parametrize('transform', [
    beam.FlatMap(lambda x: [x, x]),
    beam.FlatMap(_triple),
    beam.ParDo(_ClassDoFn()),
], ids=['flat_map_lambda', 'flat_map_function', 'class_dofn'])
def test_flat_map_and_class_dofns_run_their_process(transform):
    fn = _round_trip(transform)
    kind, call = unwrapped_callable(fn)
    assert kind == 'flat_map'
    assert call == fn.process


# A FlatMap's outputs go on in batches ------------------------------------------------
def test_a_flat_map_hands_its_outputs_on_while_it_makes_them():
    # An Impulse followed by a FlatMap that generates many elements (how sources and
    # Create start) must not pile all of them up before the next step sees any.
    made = []

    def generate(_):
        for i in range(2_500):
            made.append(i)
            yield i

    sampler = statesampler.StateSampler('test', CounterFactory())
    step = chain_steps.ParDoStep(
        'gen', 'Generate', sampler, beam.FlatMap(generate).fn, window.GlobalWindows(), 'None')
    base = WindowedValue(None, Timestamp(5), (window.GlobalWindow(),))
    sizes = []
    for values, bases in step.apply([None], [base]):
        sizes.append(len(values))
        assert len(made) == sum(sizes)  # nothing made ahead of what went on
        assert all(b is base for b in bases) and values == made[-len(values):]
    assert sizes == [1_000, 1_000, 500]
    assert step.elements == 2_500


# Window assignment in integer micros -------------------------------------------------
_MICROS = st.integers(-10**13, 10**13)


# (size, period): at most 12 sliding windows an element, as Beam makes every one of them.
_SIZE_AND_PERIOD = st.integers(1, 10**8).flatmap(
    lambda period: st.tuples(st.integers(1, 12 * period), st.just(period)))


@settings(max_examples=300, deadline=None)
@given(size_and_period=_SIZE_AND_PERIOD, offset=_MICROS,
       micros=st.lists(_MICROS, min_size=1, max_size=20), sliding=st.booleans())
def test_integer_assignment_gives_beams_windows(size_and_period, offset, micros, sliding):
    size, period = size_and_period
    def duration(m):
        return Timestamp(micros=m) - Timestamp(0)
    window_fn = (window.SlidingWindows(duration(size), duration(period), Timestamp(micros=offset))
                 if sliding else window.FixedWindows(duration(size), Timestamp(micros=offset)))
    key_of, windows_of = chain_steps.integer_assign(window_fn)
    for m in micros:
        beams = window_fn.assign(window.WindowFn.AssignContext(Timestamp(micros=m)))
        assert list(windows_of(key_of(m))) == beams  # the same windows, in the same order


def test_the_global_window_and_other_window_fns():
    key_of, windows_of = chain_steps.integer_assign(window.GlobalWindows())
    assert list(windows_of(key_of(-5))) == list(windows_of(key_of(10**12))) == [
        window.GlobalWindow()]
    assert chain_steps.integer_assign(window.Sessions(10)) is None


