"""Bounded reads: initial splitting over partitions, and source-level bundling.

Design section 4. Every bounded read (`Read` of a `BoundedSource`,
`ReadFromText`, ..., and any splittable DoFn) is expanded by Beam into
"pair with restriction -> split and size -> process". The split restrictions go
through a runner Reshuffle (Beam's `expand_sdf` inserts it when the runner
knows the Reshuffle URN, see `reshuffle`), so they are read by all partitions.

Bundles are cut at the source: `mark_source_bundles` is a fusion phase that
puts a `SourceBundleBoundary` right after every "process" step of a splittable
DoFn, on its main output. It passes each element on and, once the steps
downstream are done with it, calls the hook the operator installed
(`par_do.FusedStageOperator`). The hook counts the source's elements and, every
`bundle_size` of them, ends the bundle of the steps downstream (their
`finish_bundle`, then `start_bundle`) or checkpoints the restriction through the
SDK harness's own split protocol. Counting the source's output, not the chain's,
keeps counts exact when downstream steps buffer (a lifted combine) or write no
output (a file sink).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import common
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.runners.worker import bundle_processor, operation_specs, operations

_PROCESS_SIZED_ELEMENTS = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
SOURCE_BUNDLES_URN = 'beam_streams_runner:source_bundles:v1'

_listener = threading.local()


def set_source_bundle_listener(listener: Callable[[str], None] | None) -> None:
    """Installs the hook called, with the boundary's transform id, after every
    element a source emitted went through the steps downstream (this thread)."""
    _listener.hook = listener


class SourceBundleBoundary(operations.FlattenOperation):
    """Passes a source's elements on; after each, tells the runner's hook."""

    def process(self, o) -> None:
        self.output(o)
        hook = getattr(_listener, 'hook', None)
        if hook is not None:
            hook(self.name_context.transform_id)


@bundle_processor.BeamTransformFactory.register_urn(SOURCE_BUNDLES_URN, None)
def _create_source_bundle_boundary(factory, transform_id: str,
                                   transform_proto: beam_runner_api_pb2.PTransform,
                                   payload, consumers) -> SourceBundleBoundary:
    return factory.augment_oldstyle_op(
        SourceBundleBoundary(
            common.NameContext(transform_proto.unique_name, transform_id),
            operation_specs.WorkerFlatten(None, [factory.get_only_output_coder(transform_proto)]),
            factory.counter_factory,
            factory.state_sampler),
        transform_proto.unique_name,
        consumers)


def mark_source_bundles(
    stages: Iterable[translations.Stage], context: translations.TransformContext
) -> Iterable[translations.Stage]:
    """Fusion phase: a `SourceBundleBoundary` after each splittable DoFn's process step.

    Runs after fusion. The process step now writes its main output to a new,
    stage-local PCollection that only the boundary reads; the boundary writes
    the original PCollection, so every step that read the source's output
    (in the stage, data outputs to other stages, side inputs of later stages)
    reads the boundary's output unchanged."""
    pcollections = context.components.pcollections
    for stage in stages:
        boundaries = []
        for transform in stage.transforms:
            if transform.spec.urn != _PROCESS_SIZED_ELEMENTS or not transform.outputs:
                continue
            tag = 'None' if 'None' in transform.outputs else next(iter(transform.outputs))
            read = transform.outputs[tag]
            # Renaming the producer's side, not the consumers', keeps a data output's
            # PCollection the one its buffer id names: Beam's side-input layout
            # (`commit_side_inputs_to_state`) finds the coder by that name.
            unbundled = translations.unique_name(pcollections, read + '/Unbundled')
            pcollections[unbundled].CopyFrom(pcollections[read])
            pcollections[unbundled].unique_name = unbundled
            transform.outputs[tag] = unbundled
            boundary_id = translations.unique_name(
                context.components.transforms, transform.unique_name + '/SourceBundles')
            boundary = context.components.transforms[boundary_id]
            boundary.CopyFrom(beam_runner_api_pb2.PTransform(
                unique_name=boundary_id,
                spec=beam_runner_api_pb2.FunctionSpec(urn=SOURCE_BUNDLES_URN),
                inputs={'in': unbundled},
                outputs={'out': read},
                environment_id=transform.environment_id))
            boundaries.append(boundary)
        stage.transforms.extend(boundaries)
        yield stage


def is_source_bundle_boundary(transform: beam_runner_api_pb2.PTransform) -> bool:
    return transform.spec.urn == SOURCE_BUNDLES_URN
