"""Reads: initial splitting over partitions, source-level bundling, read slices.

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

A harness bundle is a read slice; what it leaves of each restriction (`Residual`)
goes where the policy the operator is handed says: a batch task reads it on at
once (`ReadToEnd`), a streaming epoch's task reads on for the epoch's read
budget and gives the rest back to the driver (`ReadInEpochs`). The operator
never asks which driver runs it.
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import common
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.runners.portability.fn_api_runner.execution import BundleContextManager
from apache_beam.runners.worker import bundle_processor, operation_specs, operations

from beam_streams_runner.options import DEFAULT_BUNDLE_SIZE, DEFAULT_BUNDLE_TIME_MS
from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK, Record, decode_with_raw

_PROCESS_SIZED_ELEMENTS = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
SOURCE_BUNDLES_URN = 'beam_streams_runner:source_bundles:v1'
# A bounded source's process step and its boundary as one (`translators.bounded_reads`).
BOUNDED_READ_URN = 'beam_streams_runner:bounded_read:v1'
_READS = (_PROCESS_SIZED_ELEMENTS, BOUNDED_READ_URN)
# "Split right after the current position": the smallest fraction trackers accept.
_CHECKPOINT_FRACTION = 1e-9

_listener = threading.local()


class SourceBundler(NamedTuple):
    """Where a stage's source bundles end (`SourceReads.bundler`), as its sources tell
    it what they read, each under its transform id."""

    on_element: Callable[[str], None]  # one element went through the steps downstream
    room: Callable[[str], int]  # elements left in the source's current bundle
    # `count` elements went through; `split` checkpoints the source's restriction
    # (its residual root, or None where its tracker refuses), should the slice end.
    add: Callable[[str, int, Callable[[], beam_fn_api_pb2.DelayedBundleApplication | None]],
                  None]
    # Gives an input element back unread, as a residual root (after the slice ended).
    defer: Callable[[beam_fn_api_pb2.DelayedBundleApplication], None]


def set_source_bundle_listener(listener: SourceBundler | None) -> None:
    """Installs the hook a stage's sources tell what they read (this thread)."""
    _listener.hook = listener


def source_bundle_listener() -> SourceBundler | None:
    """The hook `set_source_bundle_listener` installed on this thread, if any."""
    return getattr(_listener, 'hook', None)


class SourceBundleBoundary(operations.FlattenOperation):
    """Passes a source's elements on; after each, tells the runner's hook."""

    def process(self, o) -> None:
        self.output(o)
        hook = getattr(_listener, 'hook', None)
        if hook is not None:
            hook.on_element(self.name_context.transform_id)


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


# Reading a stage's sources: bundles, slices and what is left ---------------------------
class Residual(NamedTuple):
    """What is left of a splittable DoFn's restriction (or an input element not read)."""

    input_id: str
    element: bytes  # encoded (element, restriction, watermark estimator state)
    resume_delay_s: float
    watermark: int  # micros: the output watermark the restriction's estimator allows


class ReadToEnd:
    """How a batch task reads its sources: what a read slice leaves is read on at once,
    in the same task (after the resume delay a self-checkpointing DoFn asked for),
    and a slice lasts at least a default bundle time (each slice costs a harness
    bundle and an SDF checkpoint: Beam pickles and compresses the restriction,
    10% of a word count's CPU at a slice per 1,000 lines)."""

    bundle_time_ms = 0
    min_slice_s = DEFAULT_BUNDLE_TIME_MS / 1000.0

    def keep(self, leftovers: list[Residual]) -> list[Residual]:
        """The residuals to read now: all of them."""
        delays = [r.resume_delay_s for r in leftovers]
        if delays and min(delays) > 0:
            time.sleep(min(delays))  # e.g. a PeriodicImpulse waiting for its next firing
        return leftovers


class ReadInEpochs:
    """How a streaming epoch's task reads its sources: bundles are also cut after
    `bundle_time_ms`, and what a read slice leaves is kept (`residuals`) for
    `read_on` or, past the epoch's read budget, for the driver's next epochs."""

    min_slice_s = 0.0

    def __init__(self, bundle_time_ms: int) -> None:
        self.bundle_time_ms = bundle_time_ms
        self.residuals: list[Residual] = []

    def deal(self, residuals: Iterable[Residual]) -> None:
        """Residuals the driver dealt this task: due now, whatever delay they were kept
        for."""
        self.residuals.extend(r._replace(resume_delay_s=0.0) for r in residuals)

    def keep(self, leftovers: list[Residual]) -> list[Residual]:
        self.residuals.extend(leftovers)
        return []

    def hold(self) -> int:
        """The output watermark the kept residuals allow."""
        return min((r.watermark for r in self.residuals), default=MAX_WATERMARK)

    def read_on(self, read_residual: Callable[[Residual], list[Record]], deadline: float,
                clock: Callable[[], float] = time.monotonic) -> Iterator[Record]:
        """Reads the kept residuals on, one read slice each in turn (`read_residual`),
        while one is due at once and `deadline` (on `clock`) is not reached; the first
        slice is read even past the deadline, so every task moves on.

        The furthest-behind restriction reads first (lowest watermark, then earliest
        due): the stage's watermark is their minimum, and a restriction left behind
        while the others read ahead would keep every key read ahead alive in
        downstream state. So a restriction ahead of the others waits until they catch
        up (Flink calls this watermark alignment). Reading each restriction a bundle
        per epoch instead lets their event times drift apart without bound when they
        advance at different event-time paces (NEXMark parts of 12 and 13 timelines
        under time-cut bundles).

        A residual due now means backlog (a runner checkpoint after a full bundle, or
        an input element not read yet); one due later is a source waiting for data (a
        self-checkpoint with a resume delay): it goes back to the driver, so a paced
        source ends the epoch early and the epoch's length follows the load. What is
        left when the budget runs out also goes back, with its remaining delay.
        """
        now = clock()
        pending = [(now + r.resume_delay_s, r) for r in self.residuals]
        self.residuals = []
        read_any = False
        while pending and (now < deadline or not read_any):
            due = [item for item in pending if item[0] <= now]
            if not due:
                break
            item = min(due, key=lambda entry: (entry[1].watermark, entry[0]))
            pending.remove(item)
            yield from read_residual(item[1])
            read_any = True
            now = clock()
            pending.extend((now + r.resume_delay_s, r) for r in self.residuals)
            self.residuals = []
        self.residuals = [r._replace(resume_delay_s=max(0.0, at - now)) for at, r in pending]


SourcePolicy = ReadToEnd | ReadInEpochs


class SourceReads:
    """The splittable DoFns of one fused stage partition: where their bundles end, when
    their restrictions are checkpointed, and what a harness bundle left of them."""

    def __init__(self, runtime, stage, descriptor_view, bundle_size: int,
                 policy: SourcePolicy) -> None:
        self._runtime = runtime
        self._stage = stage
        self._descriptor_view = descriptor_view
        self._bundle_size = bundle_size
        self.policy = policy
        self.splittable_inputs = _splittable_inputs(descriptor_view)
        self._inputs_of_roots: dict[tuple[str, str], str] = {}
        self._input_counts: dict[str, int] = {}
        self._bundle_steps: dict[str, list[str]] | None = None

    def start_bundle(self, counts: dict[str, int] | None) -> None:
        """A harness bundle starts; `counts`: its input elements, where known."""
        self._input_counts = dict(counts or {})

    def bundler(self, processor, instruction_id: str, data, cuts: list
                ) -> SourceBundler | None:
        """The hook of the stage's `SourceBundleBoundary`s and bulk bounded reads: cuts
        source bundles, or None when the stage reads no source or bundles are not cut.

        Every `bundle_size` elements a source emitted (or `bundle_time_ms`, when the
        policy sets one) a source bundle ends: the steps downstream of the source
        finish their bundle and start the next (`finish_bundle`, `start_bundle`),
        inside the same harness bundle. The harness bundle is a read slice: at the
        first bundle end past `max(bundle_size, DEFAULT_BUNDLE_SIZE)` elements and
        the policy's `min_slice_s` (or past `max(bundle_time_ms,
        DEFAULT_BUNDLE_TIME_MS)`) the runner checkpoints the source's restriction
        and the rest is read as the next slice. So small bundles cost a
        `finish_bundle`/`start_bundle` of the steps downstream, not a harness bundle
        and an SDF checkpoint each.
        """
        if not self.splittable_inputs or not self._bundle_size:
            return None
        ops = processor.ops
        steps = self._steps_after_sources(ops)
        bundle_size = self._bundle_size
        bundle_time_ms = self.policy.bundle_time_ms
        bundle_s = bundle_time_ms / 1000.0 if bundle_time_ms else None
        slice_size = max(bundle_size, DEFAULT_BUNDLE_SIZE)
        started = time.monotonic()
        slice_until = (started + max(bundle_s, DEFAULT_BUNDLE_TIME_MS / 1000.0)
                       if bundle_s else math.inf)
        slice_from = started + self.policy.min_slice_s
        in_bundle = dict.fromkeys(steps, 0)
        bundle_until = dict.fromkeys(steps, started + bundle_s if bundle_s else math.inf)
        read = 0

        def end_bundle(boundary_id: str, checkpoint: Callable[[], bool]) -> None:
            in_bundle[boundary_id] = 0
            now = time.monotonic()
            if ((read >= slice_size and now >= slice_from) or now >= slice_until) and checkpoint():
                return  # the slice's last bundle ends with the harness bundle
            finishing = steps[boundary_id]
            for step in finishing:
                ops[step].finish()
            for step in reversed(finishing):
                ops[step].start()
            if bundle_s is not None:
                bundle_until[boundary_id] = time.monotonic() + bundle_s

        def bundle_goes_on(boundary_id: str, count: int) -> bool:
            """Counts `count` more elements read; False when the source bundle ends."""
            nonlocal read
            read += count
            count += in_bundle[boundary_id]
            if count < bundle_size and (bundle_s is None
                                        or time.monotonic() < bundle_until[boundary_id]):
                in_bundle[boundary_id] = count
                return True
            return False

        def harness_checkpoint() -> bool:
            return self._checkpoint(processor, instruction_id, data, cuts)

        def on_element(boundary_id: str) -> None:
            if not bundle_goes_on(boundary_id, 1):
                end_bundle(boundary_id, harness_checkpoint)

        def room(boundary_id: str) -> int:
            return bundle_size - in_bundle[boundary_id]

        def defer(root: beam_fn_api_pb2.DelayedBundleApplication) -> None:
            cuts.append(beam_fn_api_pb2.ProcessBundleSplitResponse(residual_roots=[root]))

        def add(boundary_id: str, count: int,
                split: Callable[[], beam_fn_api_pb2.DelayedBundleApplication | None]) -> None:
            if bundle_goes_on(boundary_id, count):
                return

            def own_checkpoint() -> bool:
                # One checkpoint per harness bundle, as `_checkpoint` asks for.
                if any(cut.residual_roots for cut in cuts):
                    return False
                residual = split()
                if residual is None:
                    return False
                defer(residual)
                return True

            end_bundle(boundary_id, own_checkpoint)

        return SourceBundler(on_element, room, add, defer)

    def leftovers(self, delayed, cuts, data) -> list[Residual]:
        """What the harness bundle left: the DoFns' own self-checkpoints (`delayed`), the
        residuals of the runner's checkpoints and the input elements they left unread."""
        roots = list(delayed) + [root for cut in cuts for root in cut.residual_roots]
        left = []
        for root in roots:
            watermarks = [w.seconds * 1_000_000 + w.nanos // 1000
                          for w in root.application.output_watermarks.values()]
            left.append(Residual(
                self._input_of(root), root.application.element,
                root.requested_time_delay.ToTimedelta().total_seconds(),
                min(watermarks) if watermarks else MIN_WATERMARK))
        for cut in cuts:
            for input_id, elements in self._unread(cut.channel_splits, data).items():
                left.extend(Residual(input_id, element, 0.0, MIN_WATERMARK)
                            for element in elements)
        return left

    def _checkpoint(self, processor, instruction_id: str, data, cuts: list) -> bool:
        """Checkpoints the source's restriction just after the current position.

        This is a runner-initiated split (fraction ~0 of the remainder) through the
        harness's own splitting protocol: the rest of the restriction comes back as
        a residual and is read as the next slice. True if it split; a tracker may
        refuse (byte-offset trackers only split between records), and a bundle end
        later asks again.
        """
        if any(cut.residual_roots for cut in cuts):
            return False
        counts = self._input_counts
        for input_id in self.splittable_inputs:
            if input_id not in counts:  # once per bundle (a refused split is asked again)
                counts[input_id] = self._count(input_id, data)
        desired = {
            input_id: beam_fn_api_pb2.ProcessBundleSplitRequest.DesiredSplit(
                fraction_of_remainder=_CHECKPOINT_FRACTION,
                estimated_input_elements=counts[input_id])
            for input_id in self.splittable_inputs
        }
        cut = processor.try_split(beam_fn_api_pb2.ProcessBundleSplitRequest(
            instruction_id=instruction_id, desired_splits=desired))
        if cut.residual_roots or cut.channel_splits:
            cuts.append(cut)
        return bool(cut.residual_roots)

    def _steps_after_sources(self, ops) -> dict[str, list[str]]:
        """Per `SourceBundleBoundary` (and bulk bounded read), the steps a source
        bundle's end finishes, in the harness's order: every step downstream of its
        splittable DoFn except the data outputs (their stream closes only with the
        harness bundle)."""
        if self._bundle_steps is None:
            transforms = self._descriptor_view.process_bundle_descriptor.transforms
            consumers = collections.defaultdict(list)
            producers = {}
            for transform_id, transform in transforms.items():
                for pcollection in transform.inputs.values():
                    consumers[pcollection].append(transform_id)
                for pcollection in transform.outputs.values():
                    producers[pcollection] = transform_id
            skipped = {bundle_processor.DATA_OUTPUT_URN, SOURCE_BUNDLES_URN}
            self._bundle_steps = {}
            for boundary_id, boundary in transforms.items():
                if boundary.spec.urn == SOURCE_BUNDLES_URN:
                    frontier = [producers[next(iter(boundary.inputs.values()))]]
                elif boundary.spec.urn == BOUNDED_READ_URN:
                    frontier = [boundary_id]
                else:
                    continue
                below: set[str] = set()
                while frontier:
                    for pcollection in transforms[frontier.pop()].outputs.values():
                        for consumer in consumers[pcollection]:
                            if consumer not in below:
                                below.add(consumer)
                                frontier.append(consumer)
                self._bundle_steps[boundary_id] = [
                    step for step in ops
                    if step in below and transforms[step].spec.urn not in skipped]
        return self._bundle_steps

    def _input_of(self, root: beam_fn_api_pb2.DelayedBundleApplication) -> str:
        """The stage input a residual root of the harness goes back to."""
        application = root.application
        key = (application.transform_id, application.input_id)
        input_id = self._inputs_of_roots.get(key)
        if input_id is None:
            input_id = self._inputs_of_roots[key] = BundleContextManager.input_for(
                self._descriptor_view, *key)
        return input_id

    def _count(self, input_id: str, data) -> int:
        coder = self._runtime.coder_impl(self._stage.input_coders[input_id])
        return sum(1 for chunk in data.get(input_id, ()) for _ in decode_with_raw(coder, chunk))

    def _unread(self, channel_splits, data) -> dict[str, list[bytes]]:
        """The input elements a split left unread. A split inside the bundle's last
        element (by the bundle's input counts, when known) leaves none: its input is
        not decoded again to find that out."""
        unread: dict[str, list[bytes]] = {}
        for channel in channel_splits:
            input_id = channel.transform_id
            if channel.first_residual_element >= self._input_counts.get(input_id, sys.maxsize):
                continue
            coder = self._runtime.coder_impl(self._stage.input_coders[input_id])
            raw = [encoded for chunk in data.get(input_id, ())
                   for _, encoded in decode_with_raw(coder, chunk)]
            unread.setdefault(input_id, []).extend(raw[channel.first_residual_element:])
        return unread


def _splittable_inputs(descriptor_view) -> set[str]:
    """The inputs read by a splittable DoFn (sources, after their initial split)."""
    inputs = set()
    for transform_id, transform in descriptor_view.process_bundle_descriptor.transforms.items():
        if transform.spec.urn in _READS:
            for input_tag in transform.inputs:
                try:
                    inputs.add(BundleContextManager.input_for(
                        descriptor_view, transform_id, input_tag))
                except RuntimeError:
                    continue  # a side input
    return inputs
