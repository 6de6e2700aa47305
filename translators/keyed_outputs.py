"""A batch stage's output grouped by key in its task, for a GroupByKey in the global window.

Design sections 3.5 and 9 (the shuffle of a GroupByKey; the paper's specialisations).
Between a stateless chain (or a bulk read) and the shuffle of a batch GroupByKey with
default windowing, Beam's path encodes every KV into a WindowedValue, the shuffle's map
side parses each element again for its key, and the reduce side decodes it: three
passes over every element in Beam's coders for what the reduce side then keeps, the
key's bytes, the key and the value (the global window, the timestamp and the pane are
dropped by the grouping itself). `KeyedOutputBatches` takes the chain's batches instead
and keeps them as `KeyedValues`: per key, its deterministic bytes (the key coder's, as
the KV coder would write them, so an element routes to the partition it would have gone
to) and its values in arrival order. The map side routes a key's values at once
(`routed`), PySpark pickles them across the shuffle, the reduce side adds them to its
buffers as they are.

It applies only where the values come out as they went in: key and value coders whose
decoding gives back an equal value of the same type (`faithful`); a custom coder, a
schema's row coder or anything else keeps Beam's encoding. Elements a stage emits one at
a time (outside a chain's batch) keep Beam's encoding too; the shuffle and the reduce
side take both forms.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

from apache_beam.coders import coders
from apache_beam.runners.worker import bundle_processor

from beam_streams_runner.records import Record
from beam_streams_runner.translators.stateless_chain import DataOutputBatches

# Coders whose decoding returns what was encoded (same type, equal value): PySpark's
# pickling across the shuffle then hands the reduce side what Beam's coders would.
_FAITHFUL = (coders.VarIntCoder, coders.StrUtf8Coder, coders.BytesCoder,
             coders.BooleanCoder, coders.FloatCoder, coders.PickleCoder)
# Beam's default coders, faithful when what they fall back to for other types is.
_FALLING_BACK = {
    coders.FastPrimitivesCoder: '_fallback_coder',
    coders.DeterministicFastPrimitivesCoder: '_underlying_coder',
    coders.DeterministicFastPrimitivesCoderV2: '_underlying_coder',
}


class KeyedValues(dict):
    """Encoded key -> (key, [values in arrival order]): part of a stage's output."""


def faithful(coder: coders.Coder) -> bool:
    """Whether values decoded by `coder` equal what was encoded, type and value."""
    if isinstance(coder, coders.LengthPrefixCoder):
        return faithful(coder.value_coder())
    if isinstance(coder, coders.TupleCoder):
        return all(faithful(component) for component in coder.coders())
    fallback = _FALLING_BACK.get(type(coder))
    if fallback is not None:
        return faithful(getattr(coder, fallback))
    return type(coder) in _FAITHFUL


def groupable(windowed: coders.Coder, key_coder: coders.Coder, windowing) -> bool:
    """Whether a GroupByKey whose input is coded by `windowed` (a WindowedValueCoder of
    KVs), whose keys it groups by their `key_coder` bytes and whose input is windowed
    by `windowing` can take its input as `KeyedValues`."""
    return (windowing.is_default() and isinstance(windowed, coders.WindowedValueCoder)
            and windowed.is_kv_coder() and windowed.key_coder() == key_coder
            and faithful(key_coder) and faithful(windowed.value_coder()))


class KeyedOutputBatches:
    """A stage's data output, fed a chain's batches, kept grouped by key until the
    bundle's outputs are collected (`take`)."""

    def __init__(self, transform_id: str, key_coder_impl) -> None:
        self.transform_id = transform_id
        self._encode_key = key_coder_impl.encode_nested
        # Keys of exactly int, str or bytes are grouped by the key itself and encoded
        # once per bundle: two such keys are equal only if their encodings are (unlike
        # 1, 1.0 and True, which other types' keys are grouped apart by encoding).
        self._plain: dict = {}
        self._groups = KeyedValues()

    def add_batch(self, values: list, bases: list) -> None:
        plain, groups, encode_key = self._plain, self._groups, self._encode_key
        for key, value in values:
            kind = type(key)
            if kind is int or kind is str or kind is bytes:
                entry = plain.get(key)
                if entry is None:
                    plain[key] = [value]
                else:
                    entry.append(value)
                continue
            encoded = encode_key(key)
            entry = groups.get(encoded)
            if entry is None:
                groups[encoded] = (key, [value])
            else:
                entry[1].append(value)

    def take(self) -> KeyedValues | None:
        """What the bundle added (None if nothing), the batches emptied."""
        groups, self._groups = self._groups, KeyedValues()
        encode_key = self._encode_key
        # Another type's key with the same bytes is one key to Beam: merged.
        add_groups(groups, ((encode_key(key), (key, values))
                            for key, values in self._plain.items()))
        self._plain = {}
        return groups or None


def add_groups(target: dict, groups: Iterable[tuple[bytes, tuple[object, list]]]) -> None:
    """Adds `groups` ((encoded key, (key, values)) pairs) to `target`, a dict of the same
    shape: a key's values after those it holds; a new key's list is taken, not copied."""
    for encoded, (key, values) in groups:
        entry = target.get(encoded)
        if entry is None:
            target[encoded] = (key, values)
        else:
            entry[1].extend(values)


def keep_keyed(processor: bundle_processor.BundleProcessor,
               keyed_outputs: dict[str, object]) -> None:
    """Gives each chain or bulk read of a new `processor` that feeds one of
    `keyed_outputs` (DATA_OUTPUT transform id -> key coder impl) a `KeyedOutputBatches`
    in place of its data output."""
    for op in processor.ops.values():
        consumer = getattr(op, 'batch_consumer', None)
        if not isinstance(consumer, DataOutputBatches):
            continue
        transform_id = consumer.output.name_context.transform_id
        if transform_id in keyed_outputs:
            op.batch_consumer = KeyedOutputBatches(transform_id, keyed_outputs[transform_id])


def keyed_parts(processor: bundle_processor.BundleProcessor
                ) -> Iterator[tuple[str, KeyedValues]]:
    """(DATA_OUTPUT transform id, what it kept) of each `KeyedOutputBatches` of
    `processor` that kept something in this bundle."""
    for op in processor.ops.values():
        consumer = getattr(op, 'batch_consumer', None)
        if isinstance(consumer, KeyedOutputBatches):
            part = consumer.take()
            if part is not None:
                yield consumer.transform_id, part


def routed(keyed: KeyedValues, num_partitions: int, tag: str) -> Iterator[tuple[int, Record]]:
    """The map side of the shuffle for `keyed`: its keys split by partition (the crc32
    of the encoded key, as for encoded elements)."""
    by_target: dict[int, KeyedValues] = {}
    crc32 = zlib.crc32
    for encoded, entry in keyed.items():
        target = crc32(encoded) % num_partitions
        part = by_target.get(target)
        if part is None:
            part = by_target[target] = KeyedValues()
        part[encoded] = entry
    for target, part in by_target.items():
        yield target, (tag, part)
