"""`Create` of a long list read in slices by every task of a batch run, not by one.

Design section 9 (reads in bulk). Beam's `Create` expands to Impulse, a FlatMap that
emits every encoded value (`lambda _: serialized_values`, the list captured in its
closure), a Reshuffle and a Map that decodes. An Impulse is one element, so one task
emitted the whole list before the Reshuffle spread it. At plan time the FlatMap of a
stage reading an Impulse is swapped for `CreateSlices` over the same encoded values
(`sliced_creates`, from `SLICED_FROM` values up); the batch driver then sends the stage
one impulse per partition (`impulse_records`), each carrying its slice as `i/n`, so
every task emits its own part. An impulse without a slice (the empty impulse Beam
sends, and streaming's) reads them all, so a swapped step is right whoever feeds it.
The values, their order within a slice, the Reshuffle and the decoding are Beam's.
"""

from __future__ import annotations

from apache_beam.coders import coders
from apache_beam.internal import pickler
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner.execution import ENCODED_IMPULSE_VALUE
from apache_beam.transforms import core

from beam_streams_runner.translators.chain_steps import pickled_par_do, with_payloads

# The FlatMap of Beam's `Create.expand`: its lambda, with the encoded values in its closure.
_CREATE_VALUES = ('apache_beam.transforms.core', 'Create.expand.<locals>.<lambda>')
# Shorter lists stay with one task: slicing them would only add tasks.
SLICED_FROM = 1000
_IMPULSE_CODER = coders.WindowedValueCoder(coders.BytesCoder(), coders.GlobalWindowCoder())


class CreateSlices(core.DoFn):
    """Emits the slice of `values` its impulse names (`i/n`), or all for an empty one."""

    def __init__(self, values: list[bytes]) -> None:
        self._values = values

    def process(self, element: bytes) -> list[bytes]:
        if not element:
            return self._values
        index, count = (int(part) for part in element.split(b'/'))
        total = len(self._values)
        return self._values[total * index // count:total * (index + 1) // count]


def sliced_creates(descriptor: beam_fn_api_pb2.ProcessBundleDescriptor,
                   impulse_inputs: set[str]
                   ) -> beam_fn_api_pb2.ProcessBundleDescriptor | None:
    """A copy of `descriptor` whose Create FlatMap reading one of `impulse_inputs` (data
    input transform ids fed by an Impulse) emits slices; None if it has none to swap."""
    read_by = {}
    for transform_id, transform in descriptor.transforms.items():
        for pcollection in transform.inputs.values():
            read_by.setdefault(pcollection, []).append(transform_id)
    swapped = {}
    for input_id in impulse_inputs:
        (impulses,) = descriptor.transforms[input_id].outputs.values()
        readers = read_by.get(impulses, [])
        if len(readers) == 1:
            payload = _sliced_payload(descriptor.transforms[readers[0]])
            if payload is not None:
                swapped[readers[0]] = payload
    return with_payloads(descriptor, swapped) if swapped else None


def _sliced_payload(transform: beam_runner_api_pb2.PTransform
                    ) -> beam_runner_api_pb2.ParDoPayload | None:
    par_do = pickled_par_do(transform)
    if par_do is None:
        return None
    payload, info = par_do
    if payload.side_inputs or type(info[0]) is not core.CallableWrapperDoFn:
        return None
    fn = info[0]._fn
    closure = getattr(fn, '__closure__', None) or ()
    if (getattr(fn, '__module__', None), getattr(fn, '__qualname__', None)) != _CREATE_VALUES \
            or len(closure) != 1:
        return None
    values = closure[0].cell_contents
    if not isinstance(values, list) or len(values) < SLICED_FROM:
        return None
    payload.do_fn.payload = pickler.dumps((CreateSlices(values), *info[1:]))
    return payload


def impulse_records(input_id: str, count: int) -> list[tuple[str, bytes]]:
    """`count` impulses for `input_id`, the `i`th naming slice `i/count`: Beam's impulse
    (its timestamp, window and pane) with that value."""
    impulse = _IMPULSE_CODER.get_impl().decode_nested(ENCODED_IMPULSE_VALUE)
    encode = _IMPULSE_CODER.get_impl().encode_nested
    return [(input_id, encode(impulse.with_value(f'{index}/{count}'.encode())))
            for index in range(count)]
