"""A batch GroupByKey's panes handed to the stage reading them without Beam's coders.

Design sections 3.5 and 9. The reduce side of a batch GroupByKey runs in the task of the
stage that reads its output (`worker.batch_tasks`): Beam's path encodes every pane (the
key and each of its values) into a chunk, writes it to the harness's data channel, and
the stage's `DataInputOperation` decodes it all again, element by element. For a
grouping in the global window with default windowing, whose key and value coders give
back what they encode (`keyed_outputs.faithful`), the panes are handed over as
`GroupedPanes`: the data input's operation passes them to its consumer as they are, a
whole list at once to a stateless chain. Each pane carries the timestamp, window and pane
info Beam's decoding would have given it (the end of the global window to the
millisecond, as Beam's coder keeps it).

The harness reads a bundle's input only from its data channel, so the runner writes a
marker there for the input (this process's random bytes, its own data element): its
data input's `process_encoded`, wrapped by `PaneInput`, takes the panes waiting for it
when it meets the marker and decodes everything else as before.
"""

from __future__ import annotations

import os

from apache_beam.coders import coders
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.translators.stateless_chain import BatchConsumer, batch_consumer_of

# Beam's only pane of a key in the global window, as its coder gives it back.
_GLOBAL_PANE_CODER = coders.WindowedValueCoder(coders.BytesCoder(), coders.GlobalWindowCoder())
MARKER = os.urandom(16)


class GroupedPanes(list):
    """A list of a GroupByKey's panes (WindowedValues of (key, [values])): part of the
    input of the stage reading them."""


def global_pane(pane_info) -> WindowedValue:
    """The pane of a key in the global window with `pane_info`, its timestamp as Beam's
    coder gives it back (to the millisecond), its value to be set."""
    encoded = GlobalWindows.windowed_value(
        b'', timestamp=GlobalWindow().max_timestamp(), pane_info=pane_info)
    return _GLOBAL_PANE_CODER.decode(_GLOBAL_PANE_CODER.encode(encoded))


class PaneInput:
    """A data input's `process_encoded`, also taking the panes waiting for it."""

    def __init__(self, op: bundle_processor.DataInputOperation,
                 batch_consumer: BatchConsumer | None) -> None:
        self._op = op
        self._decode = op.process_encoded
        self._batch_consumer = batch_consumer
        self.waiting: list[GroupedPanes] = []

    def __call__(self, encoded: bytes) -> None:
        if encoded == MARKER and self.waiting:
            waiting, self.waiting = self.waiting, []
            for panes in waiting:
                self._hand_on(panes)
        else:
            self._decode(encoded)

    def _hand_on(self, panes: GroupedPanes) -> None:
        if self._batch_consumer is not None:
            self._batch_consumer.add_batch([pane.value for pane in panes], panes)
            return
        receive = self._op.receivers[0].receive
        for pane in panes:
            receive(pane)


def hand_in(processor: bundle_processor.BundleProcessor, input_id: str,
            panes: list[GroupedPanes]) -> None:
    """Leaves `panes` with the data input `input_id` of `processor` for the bundle about
    to run (whose channel must carry `MARKER` for that input)."""
    op = processor.ops[input_id]
    pane_input = op.__dict__.get('process_encoded')
    if not isinstance(pane_input, PaneInput):
        descriptor = processor.process_bundle_descriptor
        read = next(iter(descriptor.transforms[input_id].outputs.values()))
        readers = [reader for transform_id, reader in processor.ops.items()
                   if read in descriptor.transforms[transform_id].inputs.values()]
        pane_input = op.process_encoded = PaneInput(
            op, batch_consumer_of(readers, descriptor))
    pane_input.waiting.extend(panes)
