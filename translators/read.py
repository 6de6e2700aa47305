"""Bounded reads: initial splitting over partitions, and source-level bundling.

Design section 4. Every bounded read (`Read` of a `BoundedSource`,
`ReadFromText`, ..., and any splittable DoFn) is expanded by Beam into
"pair with restriction -> split and size -> process". The split restrictions go
through a runner Reshuffle (Beam's `expand_sdf` inserts it when the runner
knows the Reshuffle URN, see `reshuffle`), so they are read by all partitions.

Bundles are cut at the source: `count_source_outputs` is a fusion phase that
adds, beside every "process" step of a splittable DoFn, a counting sink
(`SourceBundleCounter`) fed with the step's output. When a bundle's count
reaches `bundle_size`, the counter calls the hook the operator installed
(`par_do.FusedStageOperator`), which checkpoints the restriction through the
SDK harness's own split protocol; the rest is read as the next bundle. The
counter sits beside the output, not in its path, so the fused chain is
unchanged (and counts are exact even when downstream steps buffer, like a
lifted combine, or write no output, like a file sink).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import apache_beam as beam
from apache_beam.internal import pickler
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import translations

_PROCESS_SIZED_ELEMENTS = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
COUNTER_SUFFIX = '/CountSourceBundle'

_listener = threading.local()


def set_source_bundle_listener(listener: Callable[[], None] | None) -> None:
    """Installs the hook called for every element a source emits (this thread)."""
    _listener.hook = listener


class SourceBundleCounter(beam.DoFn):
    """Counts a source's output elements for the runner; outputs nothing."""

    def process(self, element) -> None:
        hook = getattr(_listener, 'hook', None)
        if hook is not None:
            hook()


def count_source_outputs(
    stages: Iterable[translations.Stage], context: translations.TransformContext
) -> Iterable[translations.Stage]:
    """Fusion phase: a `SourceBundleCounter` beside each splittable DoFn's process step."""
    payload = beam_runner_api_pb2.ParDoPayload(
        do_fn=beam_runner_api_pb2.FunctionSpec(
            urn=python_urns.PICKLED_DOFN_INFO,
            payload=pickler.dumps((SourceBundleCounter(), (), {}, [], None))))
    for stage in stages:
        counters = []
        for transform in stage.transforms:
            if transform.spec.urn != _PROCESS_SIZED_ELEMENTS:
                continue
            if not transform.outputs:
                continue
            main_output = transform.outputs.get('None') or next(iter(transform.outputs.values()))
            counter_id = translations.unique_name(
                context.components.transforms, transform.unique_name + COUNTER_SUFFIX)
            counter = context.components.transforms[counter_id]
            counter.CopyFrom(beam_runner_api_pb2.PTransform(
                unique_name=counter_id,
                spec=beam_runner_api_pb2.FunctionSpec(
                    urn=common_urns.primitives.PAR_DO.urn,
                    payload=payload.SerializeToString()),
                inputs={'in': main_output},
                environment_id=transform.environment_id))
            counters.append(counter)
        stage.transforms.extend(counters)
        yield stage


def is_source_bundle_counter(transform: beam_runner_api_pb2.PTransform) -> bool:
    return transform.unique_name.endswith(COUNTER_SUFFIX) and not transform.outputs
