"""Bounded sources read in bulk: a split's records read in one pass, handed on in batches.

Design sections 4 (reads) and 9 (the paper's ParDo specialisations). Beam reads every
`BoundedSource` (`ReadFromText`, `Read(source)`, Avro, Parquet, TFRecord...) through its
splittable DoFn `SDFBoundedSourceReader`: each record goes out through the harness's SDF
output handler, the watermark estimator, the receivers' counters and the runner's
`SourceBundleBoundary`, one at a time, which cost a text word count half its CPU.

`bulk_bounded_reads` rewrites a stage's ProcessBundleDescriptor at plan time: the
process step of that DoFn and the boundary after it become one transform
(`read.BOUNDED_READ_URN`, the step's own ParDo payload), built by the harness as a
`BoundedSourceReadOperation`. It reads each restriction with the source's own reader
(`source.read(range_tracker)`: Beam's range tracker still claims every record), takes
what is left of the current source bundle at once, and hands the records on as one batch:
whole to a stateless chain, a task's partial combine or the stage's data output, one by
one to any other step. The records keep the input element's timestamp, window and pane,
as Beam's output handler gives them; a TimestampedValue, WindowedValue or TaggedOutput a
source yields is taken as that handler takes it.

Source bundles and read slices stay the runner's (`read.SourceBundler`): a source bundle
ends after `bundle_size` records; a slice ends with a checkpoint the operation makes with
the restriction's own `try_split` (what the harness does for a runner's split), and the
rest of the restriction goes back as a residual root, as the harness would return it. So
batch tasks read on, streaming epochs keep residuals for their read budget, and the
driver's dynamic splits cut them, as for any other source.
"""

from __future__ import annotations

import collections
import itertools

from apache_beam.internal import pickler
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import common
from apache_beam.runners.worker import bundle_processor, operation_specs, operations
from apache_beam.transforms import core
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner.translators import chain_steps
from beam_streams_runner.translators.chain_steps import (
    ParDoStep,
    has_special_results,
    pickled_par_do,
)
from beam_streams_runner.translators.read import (
    _CHECKPOINT_FRACTION,
    BOUNDED_READ_URN,
    SOURCE_BUNDLES_URN,
    source_bundle_listener,
)
from beam_streams_runner.translators.stateless_chain import batch_consumer_of, hand_on

# The most records taken at once, whatever the bundle size (a batch is held in memory).
_MOST_AT_ONCE = 10 * chain_steps.FLUSH_AT

_PROCESS_SIZED = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
# Beam's splittable DoFn over a BoundedSource (`iobase.SDFBoundedSourceReader`).
_BOUNDED_READER = ('apache_beam.io.iobase',
                   'SDFBoundedSourceReader._create_sdf_bounded_source_dofn.'
                   '<locals>.SDFBoundedSourceDoFn')


# Plan side ---------------------------------------------------------------------------
def bulk_bounded_reads(
    descriptor: beam_fn_api_pb2.ProcessBundleDescriptor,
) -> beam_fn_api_pb2.ProcessBundleDescriptor:
    """`descriptor` with each bounded source's process step and the source bundle
    boundary after it replaced by one bulk read (a copy; `descriptor` is left as it is)."""
    transforms = descriptor.transforms
    consumers: dict[str, list[str]] = collections.defaultdict(list)
    for transform_id, transform in transforms.items():
        for pcollection in transform.inputs.values():
            consumers[pcollection].append(transform_id)
    reads = {}
    for transform_id, transform in transforms.items():
        if not is_bounded_source_reader(transform):
            continue
        (read,) = transform.outputs.values()
        readers = consumers.get(read, [])
        if len(readers) == 1 and transforms[readers[0]].spec.urn == SOURCE_BUNDLES_URN:
            reads[transform_id] = readers[0]
    if not reads:
        return descriptor
    bulk = beam_fn_api_pb2.ProcessBundleDescriptor()
    bulk.CopyFrom(descriptor)
    for process_id, boundary_id in reads.items():
        process = bulk.transforms[process_id]
        boundary = bulk.transforms[boundary_id]
        (tag, unbundled), = process.outputs.items()
        process.spec.urn = BOUNDED_READ_URN
        process.outputs[tag] = boundary.outputs['out']
        del bulk.transforms[boundary_id]
        del bulk.pcollections[unbundled]
    return bulk


def is_bounded_source_reader(transform: beam_runner_api_pb2.PTransform) -> bool:
    """Whether `transform` is the process step of Beam's reader of a BoundedSource,
    with one input and one output."""
    if (transform.spec.urn != _PROCESS_SIZED or len(transform.inputs) != 1
            or len(transform.outputs) != 1):
        return False
    par_do = pickled_par_do(transform, _PROCESS_SIZED)
    if par_do is None or par_do[0].side_inputs:
        return False
    fn = par_do[1][0]
    return (type(fn).__module__, type(fn).__qualname__) == _BOUNDED_READER


# Worker side -------------------------------------------------------------------------
class BoundedSourceReadOperation(operations.Operation):
    """Reads bounded sources' restrictions in bulk (see the module doc)."""

    def __init__(self, name_context: common.NameContext, spec, counter_factory,
                 state_sampler, step: ParDoStep, provider: core.RestrictionProvider,
                 input_tag: str, input_coder) -> None:
        super().__init__(name_context, spec, counter_factory, state_sampler)
        self.step = step
        self._provider = provider
        self._input_tag = input_tag
        self._input_coder = input_coder  # CoderImpl of the sized element and restriction
        self.batch_consumer = None  # set by the factory (`batch_consumer_of`)
        # Whether this harness bundle's read slice ended: the elements still to come
        # go back unread, as the harness's split gives back what its input has left.
        self._slice_ended = False

    def start(self) -> None:
        super().start()
        self._slice_ended = False

    def process(self, o: WindowedValue) -> None:
        if len(o.windows) == 1:
            self._read(o)
            return
        for w in o.windows:  # Beam's SDF invoker reads a restriction once per window
            self._read(WindowedValue(o.value, o.timestamp, (w,), o.pane_info))

    def _read(self, o: WindowedValue) -> None:
        (element, (restriction, estimator_state)), _ = o.value
        step, transform_id = self.step, self.name_context.transform_id
        bundler = source_bundle_listener()
        if self._slice_ended and bundler is not None:
            bundler.defer(self._root(o.value[0], o))
            return

        def split() -> beam_fn_api_pb2.DelayedBundleApplication | None:
            parts = restriction.try_split(_CHECKPOINT_FRACTION)
            if not parts:
                return None
            self._slice_ended = True
            return self._root((element, (parts[1], estimator_state)), o)

        with step.scoped_state:
            try:
                records = iter(restriction.source().read(restriction.range_tracker()))
            except BaseException as exn:  # noqa: BLE001 - Beam tags any failure
                step.fail(exn)
        while True:
            room = chain_steps.FLUSH_AT if bundler is None else bundler.room(transform_id)
            with step.scoped_state:
                try:
                    values = list(itertools.islice(records, min(max(room, 1), _MOST_AT_ONCE)))
                except BaseException as exn:  # noqa: BLE001 - Beam tags any failure
                    step.fail(exn)
            if not values:
                return
            read = len(values)
            bases = [o] * read
            if has_special_results(values):
                values, bases = step.special_outputs(values, bases)
            step.elements += len(values)
            try:
                hand_on(self, values, bases)
            except BaseException as exn:  # noqa: BLE001 - named as Beam's DoFnRunner does
                step.fail(exn)
            if bundler is not None:
                bundler.add(transform_id, read, split)

    def _root(self, element_and_restriction, o: WindowedValue
              ) -> beam_fn_api_pb2.DelayedBundleApplication:
        """A residual root of a restriction to read later, as the harness makes one."""
        element, (restriction, _) = element_and_restriction
        size = self._provider.restriction_size(element, restriction)
        return beam_fn_api_pb2.DelayedBundleApplication(
            application=beam_fn_api_pb2.BundleApplication(
                transform_id=self.name_context.transform_id, input_id=self._input_tag,
                element=self._input_coder.encode_nested(
                    o.with_value((element_and_restriction, size)))))

    def try_split(self, fraction_of_remainder):
        return None  # its splits are made by the runner's source bundles (`_read`)

    def current_element_progress(self):
        return None

    def reset(self) -> None:
        super().reset()
        self.step.metrics_container.reset()
        self.step.elements = 0

    def metric_containers(self) -> list[tuple[str, object]]:
        return [(self.step.transform_id, self.step.metrics_container)]

    def elements_of(self, tag: str) -> int:
        """The records it handed on in this bundle."""
        return self.step.elements


@bundle_processor.BeamTransformFactory.register_urn(
    BOUNDED_READ_URN, beam_runner_api_pb2.ParDoPayload)
def _create_bounded_read(factory, transform_id: str,
                         transform_proto: beam_runner_api_pb2.PTransform,
                         payload: beam_runner_api_pb2.ParDoPayload,
                         consumers) -> BoundedSourceReadOperation:
    fn = pickler.loads(core.DoFnInfo.from_runner_api(
        payload.do_fn, factory.context).serialized_dofn_data())[0]
    (input_tag, input_pcollection), = transform_proto.inputs.items()
    (output_tag, _), = transform_proto.outputs.items()
    windowing = factory.context.windowing_strategies.get_by_id(
        factory.descriptor.pcollections[input_pcollection].windowing_strategy_id)
    step = ParDoStep(transform_id, transform_proto.unique_name, factory.state_sampler, fn,
                     windowing.windowfn, output_tag)
    op = BoundedSourceReadOperation(
        common.NameContext(transform_proto.unique_name, transform_id),
        operation_specs.WorkerFlatten(None, [factory.get_only_output_coder(transform_proto)]),
        factory.counter_factory, factory.state_sampler, step,
        common.DoFnSignature(fn).get_restriction_provider(), input_tag,
        factory.get_windowed_coder(input_pcollection).get_impl())
    op.batch_consumer = batch_consumer_of(
        [reader for ops in consumers.values() for reader in ops], factory.descriptor)
    return factory.augment_oldstyle_op(op, transform_proto.unique_name, consumers)
