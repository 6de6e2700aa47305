"""GroupByKey (and the shuffle in front of stateful ParDos and lifted Combines).

Design sections 3.3-3.5 and 7. The map side decodes each element's key, hashes
its deterministic Beam encoding (crc32 of the key coder's bytes) to a
partition, and ships the element's original bytes, batched per target partition
in chunks of at most `bundle_size` elements. The reduce side
(`GroupByKeyOperator`) buffers values per (encoded key) and, at the end of the
bounded input, runs Beam's trigger driver
(`apache_beam.transforms.trigger.create_trigger_driver`) per key: every
WindowFn incl. custom and merging ones (the real Python WindowFn, never an
opaque stand-in), timestamp combiners, accumulation modes, allowed lateness,
pane info. Combine lifting (`lift_combiners`) puts a partial combine before this
shuffle and the merge of accumulators after it, both in the SDK harness. In
streaming the reduce side keeps its trigger state across epochs in the keyed-state
backend (`streaming_group_by_key`).

Two fast paths skip the trigger driver where its result is known in advance:
the global window with default windowing (one pane per key, as Beam's own
`BatchGlobalTriggerDriver`), and (`_one_pane_per_window`) a non-merging
WindowFn with Beam's `DefaultTrigger`, where in batch every (key, window) gets
exactly one on-time pane. The second exists because the general driver's
per-window state, timers and watermark holds cost 16% of all Python worker
time in NEXMark Q5 batch (sliding windows, default trigger; py-spy, 300k
events); its panes are the general driver's, value for value (see
`_one_pane_per_window`), and the general driver still runs for merging
WindowFns, every other trigger, and keys with a window ending outside
(-inf, +inf].
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from apache_beam.runners.direct.clock import RealClock
from apache_beam.transforms import trigger
from apache_beam.transforms.window import GlobalWindow, GlobalWindows, TimestampCombiner
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_streams_runner.records import (
    MAX_WATERMARK,
    ChunkBuilder,
    Record,
    chunks_by_target,
    decode_with_raw,
)
from beam_streams_runner.translators import window_end_panes
from beam_streams_runner.translators.grouped_inputs import GroupedPanes, global_pane
from beam_streams_runner.translators.keyed_outputs import KeyedValues, add_groups, routed
from beam_streams_runner.translators.kv_chunks import KvChunks
from beam_streams_runner.translators.operator import Bundle, Operator

_ONLY_PANE = PaneInfo(
    is_first=True, is_last=True, timing=PaneInfoTiming.ON_TIME, index=0, nonspeculative_index=0)
# What `GeneralTriggerDriver` emits for `DefaultTrigger` in batch: the watermark
# timer at the window's end fires once, on time, and `DefaultTrigger.on_fire`
# never finishes the window, so the pane is not marked last.
_DEFAULT_TRIGGER_PANE = PaneInfo(
    is_first=True, is_last=False, timing=PaneInfoTiming.ON_TIME, index=0, nonspeculative_index=0)


def _process_entire_key(driver, key, windowed_values):
    """`GeneralTriggerDriver.process_entire_key`, with processing-time timers.

    Beam 2.77's version asks for due timers without a processing time, so any
    processing-time trigger (e.g. NEXMark Q12's) fails with a TypeError; here
    both the watermark and processing time stand at +inf once the bounded input
    has ended, so every pending pane fires.
    """
    state = trigger.InMemoryUnmergedState()
    for wvalue in driver.process_elements(state, windowed_values, MIN_TIMESTAMP, MIN_TIMESTAMP):
        yield wvalue.with_value((key, wvalue.value))
    while state.timers:
        fired, _ = state.get_timers(
            clear=True, watermark=MAX_TIMESTAMP, processing_time=MAX_TIMESTAMP)
        if not fired:
            break  # only timers set beyond the end of time remain
        for timer_window, (name, time_domain, fire_time, _) in fired:
            for wvalue in driver.process_timer(timer_window, name, time_domain, fire_time, state):
                yield wvalue.with_value((key, wvalue.value))


def _one_pane_per_window(timestamp_combiner, general, key, windowed_values):
    """One key's panes for a non-merging WindowFn and `DefaultTrigger` in batch.

    Exactly what `_process_entire_key(general driver)` gives, without its state,
    timers and holds: `process_elements` (at watermark -inf) groups the values by
    window in arrival order (an element in several windows goes into each),
    holds each window at its combined output time and sets one watermark timer
    at the window's end; at watermark +inf the timers fire in the order the
    windows were first seen, each giving one pane `_DEFAULT_TRIGGER_PANE` at the
    held time, or at the window's end if nothing was held (an output time before
    -inf, from `get_transformed_output_time`, holds nothing); allowed lateness
    drops nothing at watermark -inf. Only a window ending at or before -inf
    (fired early, at once) or after +inf (its timer never fires) differs: then
    the key goes through `general`.
    """
    by_window: dict = {}
    for windowed in windowed_values:
        for window in windowed.windows:
            group = by_window.get(window)
            if group is None:
                by_window[window] = [windowed]
            else:
                group.append(windowed)
    assign = timestamp_combiner.assign_output_time
    merge = timestamp_combiner.merge
    panes = []
    for window, group in by_window.items():
        if not MIN_TIMESTAMP < window.end <= MAX_TIMESTAMP:
            return list(general(key, windowed_values))
        # As the driver's hold: over the output times not before the output
        # watermark (-inf); a combiner that depends only on the window
        # (END_OF_WINDOW) never reads them.
        timestamp = merge(window, (
            output_time for output_time in (
                assign(window, windowed.timestamp) for windowed in group)
            if output_time >= MIN_TIMESTAMP))
        if timestamp is None:
            timestamp = window.max_timestamp()
        panes.append(WindowedValue(
            (key, [windowed.value for windowed in group]), timestamp, (window,),
            _DEFAULT_TRIGGER_PANE))
    return panes


def batch_panes(windowing):
    """`panes(key, windowed_values)` for the batch GroupByKey once its input ended:
    one of the fast paths, or Beam's trigger driver for `windowing`."""
    if windowing.is_default():
        # Global window, default trigger: one pane per key at the end, as Beam's
        # own batch grouping does; the values come without their windows.
        in_global_window = GlobalWindows.windowed_value(
            None, timestamp=GlobalWindow().max_timestamp(), pane_info=_ONLY_PANE).with_value
        return lambda key, values: (in_global_window((key, values)),)
    driver = trigger.create_trigger_driver(windowing, is_batch=True, clock=RealClock())
    if not isinstance(driver, trigger.GeneralTriggerDriver):
        return driver.process_entire_key
    general = functools.partial(_process_entire_key, driver)
    if window_end_panes.applies_to(windowing):
        return functools.partial(
            _one_pane_per_window,
            TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn),
            general)
    return general


class KeyPartitioner:
    """Map side of a keyed shuffle: routes encoded KV elements by their key."""

    def __init__(self, element_coder_impl, key_coder_impl, num_partitions: int,
                 bundle_size: int, kv_chunks: KvChunks | None = None) -> None:
        """`kv_chunks`: a reader of the elements' chunks when they are windowed KVs
        (their keys' bytes read as sent, not encoded again)."""
        self._element_coder = element_coder_impl
        self._key_coder = key_coder_impl
        self._num_partitions = num_partitions
        self._bundle_size = bundle_size
        self._kv_chunks = kv_chunks

    def partition(self, tag: str, chunks: Iterable[bytes | KeyedValues]
                  ) -> Iterator[tuple[int, Record]]:
        n = self._num_partitions
        # Runs of encoded chunks are batched per target across chunks; a chunk already
        # grouped by key is routed a key at a time.
        for keyed, run in itertools.groupby(chunks, key=_is_keyed):
            if keyed:
                for part in run:
                    yield from routed(part, n, tag)
            else:
                yield from chunks_by_target(self._routed(run), n, self._bundle_size, tag)

    def _routed(self, chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
        n = self._num_partitions
        crc32 = zlib.crc32
        if self._kv_chunks is not None:
            keyed_raw = self._kv_chunks.keyed_raw
            return ((crc32(key) % n, raw) for chunk in chunks for key, raw in keyed_raw(chunk))
        encode_key = self._key_coder.encode_nested
        return (
            (crc32(encode_key(windowed.value[0])) % n, raw)
            for chunk in chunks
            for windowed, raw in decode_with_raw(self._element_coder, chunk))


def _is_keyed(chunk: bytes | KeyedValues) -> bool:
    return type(chunk) is KeyedValues


class GroupingCoders(NamedTuple):
    """The coders (impls) a GroupByKey's reduce side decodes, groups and encodes with."""

    input: object  # the input's windowed KV coder
    output: object  # the output's windowed KV-of-iterable coder
    key: object
    value: object


class GroupByKeyOperator(Operator):
    """Reduce side of GroupByKey on a bounded input: per-key buffers, fired at its end.

    Firing before the end of the input is the trigger driver's work in streaming
    (`streaming_group_by_key`)."""

    def __init__(self, coders: GroupingCoders, windowing, output_id: str,
                 bundle_size: int, kv_chunks: KvChunks | None = None,
                 hands_panes: bool = False) -> None:
        """`kv_chunks`: a reader of the input's chunks when its elements are windowed
        KVs (the keys' bytes read as sent, not encoded again). `hands_panes`: the
        panes leave as `GroupedPanes`, not encoded (default windowing only, see
        `grouped_inputs`)."""
        if hands_panes and not windowing.is_default():
            raise ValueError('only panes in the global window are handed on unencoded')
        self._hands_panes = hands_panes
        self._coders = coders
        self._windowing = windowing
        self._output_id = output_id
        self._bundle_size = bundle_size
        self._buffers: dict[bytes, tuple[object, list]] = {}
        # Global window, default trigger (see `batch_panes`): values are kept
        # without their windows.
        self._trivial = windowing.is_default()
        self._kv_chunks = kv_chunks

    def process_bundle(self, bundle: Bundle) -> list[Record]:
        buffers = self._buffers
        for _, chunk in bundle:
            if type(chunk) is KeyedValues:  # only given to a trivial grouping
                add_groups(buffers, chunk.items())
            elif self._trivial and self._kv_chunks is not None:
                self._add_values(chunk)
            else:
                self._add_decoded(chunk)
        return []

    def _add_values(self, chunk: bytes) -> None:
        buffers = self._buffers
        for encoded, key, value in self._kv_chunks.keyed_values(chunk):
            entry = buffers.get(encoded)
            if entry is None:
                entry = buffers[encoded] = (key, [])
            entry[1].append(value)

    def _add_decoded(self, chunk: bytes) -> None:
        encode_key = self._coders.key.encode_nested
        buffers = self._buffers
        trivial = self._trivial
        for windowed in self._coders.input.decode_all(chunk):
            key, value = windowed.value
            encoded = encode_key(key)
            entry = buffers.get(encoded)
            if entry is None:
                entry = buffers[encoded] = (key, [])
            entry[1].append(value if trivial else windowed.with_value(value))

    def advance(self, watermark: int, processing_time: int | None = None) -> list[Record]:
        if watermark < MAX_WATERMARK:
            return []
        if self._hands_panes:
            return self._handed_panes()
        panes = batch_panes(self._windowing)
        builder = ChunkBuilder(self._bundle_size)
        out: list[Record] = []
        encode = self._coders.output.encode_nested
        for key, values in self._buffers.values():
            for grouped in panes(key, values):
                full = builder.add(encode(grouped))
                if full is not None:
                    out.append((self._output_id, full))
        rest = builder.flush()
        if rest is not None:
            out.append((self._output_id, rest))
        self._buffers = {}
        return out

    def _handed_panes(self) -> list[Record]:
        """The panes as `GroupedPanes` of at most `bundle_size` keys each."""
        in_global_window = global_pane(_ONLY_PANE).with_value
        out: list[Record] = []
        panes = GroupedPanes()
        for key, values in self._buffers.values():
            panes.append(in_global_window((key, values)))
            if len(panes) >= self._bundle_size:
                out.append((self._output_id, panes))
                panes = GroupedPanes()
        if panes:
            out.append((self._output_id, panes))
        self._buffers = {}
        return out
