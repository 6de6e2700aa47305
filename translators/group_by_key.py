"""GroupByKey (and the shuffle in front of stateful ParDos and lifted Combines).

Design sections 3.3-3.5 and 7. The map side decodes each element's key, hashes
its deterministic Beam encoding (crc32 of the key coder's bytes) to a
partition, and ships the element's original bytes, batched per target partition
in chunks of at most `bundle_size` elements. The reduce side
(`GroupByKeyOperator`) buffers values per (encoded key) and, when the input
watermark passes, runs Beam's trigger driver
(`apache_beam.transforms.trigger.create_trigger_driver`) per key: every
WindowFn incl. custom and merging ones (the real Python WindowFn, never an
opaque stand-in), timestamp combiners, accumulation modes, allowed lateness,
pane info. Combine lifting (`lift_combiners`) puts a partial combine before this
shuffle and the merge of accumulators after it, both in the SDK harness.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

from apache_beam.transforms import trigger

from beam_streams_runner.operators import MAX_WATERMARK, Bundle, Operator
from beam_streams_runner.records import ChunkBuilder, Record, decode_with_raw


class KeyPartitioner:
    """Map side of a keyed shuffle: routes encoded KV elements by their key."""

    def __init__(self, element_coder_impl, key_coder_impl, num_partitions: int,
                 bundle_size: int) -> None:
        self._element_coder = element_coder_impl
        self._key_coder = key_coder_impl
        self._num_partitions = num_partitions
        self._bundle_size = bundle_size

    def partition(self, tag: str, chunks: Iterable[bytes]) -> Iterator[tuple[int, Record]]:
        n = self._num_partitions
        builders: dict[int, ChunkBuilder] = {}
        encode_key = self._key_coder.encode_nested
        for chunk in chunks:
            for windowed, raw in decode_with_raw(self._element_coder, chunk):
                target = zlib.crc32(encode_key(windowed.value[0])) % n
                builder = builders.get(target)
                if builder is None:
                    builder = builders[target] = ChunkBuilder(self._bundle_size)
                full = builder.add(raw)
                if full is not None:
                    yield target, (tag, full)
        for target, builder in builders.items():
            rest = builder.flush()
            if rest is not None:
                yield target, (tag, rest)


class GroupByKeyOperator(Operator):
    """Reduce side of GroupByKey: per-key buffers, fired by the watermark."""

    def __init__(self, input_coder_impl, output_coder_impl, key_coder_impl, windowing,
                 output_id: str, bundle_size: int, channels=('input',)) -> None:
        super().__init__(channels)
        self._input_coder = input_coder_impl
        self._output_coder = output_coder_impl
        self._key_coder = key_coder_impl
        self._windowing = windowing
        self._output_id = output_id
        self._bundle_size = bundle_size
        self._buffers: dict[bytes, tuple[object, list]] = {}

    def process_bundle(self, bundle: Bundle) -> list[Record]:
        encode_key = self._key_coder.encode_nested
        buffers = self._buffers
        for _, chunk in bundle:
            for windowed, _ in decode_with_raw(self._input_coder, chunk):
                key, value = windowed.value
                encoded = encode_key(key)
                entry = buffers.get(encoded)
                if entry is None:
                    entry = buffers[encoded] = (key, [])
                entry[1].append(windowed.with_value(value))
        return []

    def on_input_watermark(self, watermark: int) -> list[Record]:
        if watermark < MAX_WATERMARK:
            # Firing before the end of input is the streaming driver's work
            # (trigger driver in streaming mode); the batch driver only ends inputs.
            return []
        driver = trigger.create_trigger_driver(self._windowing, is_batch=True)
        builder = ChunkBuilder(self._bundle_size)
        out: list[Record] = []
        encode = self._output_coder.encode_nested
        for key, values in self._buffers.values():
            for grouped in driver.process_entire_key(key, values):
                full = builder.add(encode(grouped))
                if full is not None:
                    out.append((self._output_id, full))
        rest = builder.flush()
        if rest is not None:
            out.append((self._output_id, rest))
        self._buffers = {}
        return out
