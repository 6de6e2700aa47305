"""Counting the elements of PCollections inside a task, for the streaming progress.

A task counts the elements of the PCollections the driver picked
(`driver.progress.counted_outputs`) with the SDK harness's own per-PCollection
element counters, read after every harness bundle, so counting costs a few
attribute reads per bundle and no decoding.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class CountedOutput(NamedTuple):
    """Where a task counts the elements of one PCollection: an output of a harness step."""

    transform_id: str
    tag: str  # the step's output tag (in a stateless chain: the id of the step in it)
    pcollection: str


def count_elements(processor, counted: Iterable[CountedOutput], counts: dict[str, int]) -> None:
    """Adds the elements one harness bundle emitted on the `counted` outputs to
    `counts` (PCollection -> elements). Called before the bundle processor is
    released: releasing it resets its counters."""
    for transform_id, tag, pcollection in counted:
        op = processor.ops.get(transform_id)
        elements_of = getattr(op, 'elements_of', None)
        if elements_of is not None:  # a stateless chain counts each of its steps
            counts[pcollection] = counts.get(pcollection, 0) + elements_of(tag)
            continue
        receivers = getattr(op, 'receivers', None) or ()
        if len(receivers) == 1:
            index = 0  # a single-output step has one receiver whatever its tag
        else:
            # The harness numbers a step's receivers in the order of its output tags.
            outputs = processor.process_bundle_descriptor.transforms[transform_id].outputs
            index = list(outputs).index(tag)
        if index < len(receivers):
            elements = receivers[index].opcounter.element_counter.value()
            counts[pcollection] = counts.get(pcollection, 0) + elements
