"""From a Beam pipeline to a plan of fused stages (design section 3).

The pipeline proto (after Beam's runner-API round trip) goes through Beam's own
fusion phases (`apache_beam.runners.portability.fn_api_runner.translations`:
combiner packing and lifting, SDF expansion, GroupByKey and Flatten expansion,
greedy fusion, ...), with three runner primitives kept for the runner itself:
GroupByKey, Flatten and Reshuffle. Stateful ParDos are forced to start a stage
(they need their input partitioned by key). Each resulting stage becomes a
`StagePlan`: the process-bundle descriptor the SDK harness runs, and where its
inputs come from and its outputs go to (buffer ids shared between producer and
consumer stages). How each runner primitive crosses Spark lives in
`translators/`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Callable, Iterable

from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_provision_api_pb2,
    beam_runner_api_pb2,
)
from apache_beam.runners.portability.fn_api_runner import execution, translations, worker_handlers
from apache_beam.runners.portability.fn_api_runner.fn_runner import ExtendedProvisionInfo
from apache_beam.runners.worker import bundle_processor
from apache_beam.utils import proto_utils

from beam_streams_runner.errors import NonDeterministicKeyCoderError, UnsupportedFeatureError
from beam_streams_runner.translators.bounded_reads import bulk_bounded_reads
from beam_streams_runner.translators.create_slices import sliced_creates
from beam_streams_runner.translators.file_commits import COMMIT_FILES_URN
from beam_streams_runner.translators.file_writes import batch_file_writes
from beam_streams_runner.translators.read import is_source_bundle_boundary, mark_source_bundles
from beam_streams_runner.translators.stateless_chain import fuse_stateless_chains, main_input

RESHUFFLE_URN = common_urns.composites.RESHUFFLE.urn
TEST_STREAM_URN = common_urns.primitives.TEST_STREAM.urn
RUNNER_PRIMITIVES = frozenset([
    common_urns.primitives.FLATTEN.urn,
    common_urns.primitives.GROUP_BY_KEY.urn,
    RESHUFFLE_URN,
    TEST_STREAM_URN,
    COMMIT_FILES_URN,
])

PHASES = [
    translations.annotate_downstream_side_inputs,
    translations.annotate_stateful_dofns_as_roots,
    translations.fix_side_input_pcoll_coders,
    translations.pack_combiners,
    translations.lift_combiners,
    translations.expand_sdf,
    translations.expand_gbk,
    translations.sink_flattens,
    translations.greedily_fuse,
    mark_source_bundles,
    translations.read_to_impulse,
    translations.impulse_to_input,
    translations.sort_stages,
    translations.add_impulse_to_dangling_transforms,
    translations.setup_timer_mapping,
    translations.populate_data_channel_coders,
]

IMPULSE_BUFFER = translations.IMPULSE_BUFFER


@dataclasses.dataclass
class StagePlan:
    """One fused stage: what the SDK harness runs and how it is wired."""

    name: str
    index: int
    # 'sdk' (runs in the SDK harness); runner-only: 'reshuffle', 'test_stream',
    # 'commit_files'
    kind: str
    step_names: list[str]
    inputs: dict[str, bytes]  # DATA_INPUT transform id -> buffer id
    outputs: dict[str, bytes]  # DATA_OUTPUT transform id -> buffer id
    input_coders: dict[str, str]  # DATA_INPUT transform id -> coder id
    output_coders: dict[str, str]  # DATA_OUTPUT transform id -> coder id
    timer_families: dict[tuple[str, str], tuple[str, int]]  # -> (coder id, time domain)
    side_inputs: dict[tuple[str, str], tuple[bytes, bytes]]  # -> (buffer id, access pattern)
    stateful: bool
    key_coders: dict[str, str]  # stateful: DATA_INPUT transform id -> key coder id
    descriptor: bytes | None  # serialized ProcessBundleDescriptor ('sdk' stages)
    # 'test_stream' stages: the TestStreamPayload, and output tag -> DATA_OUTPUT id.
    test_stream: bytes | None = None
    test_stream_outputs: dict[str, str] = dataclasses.field(default_factory=dict)
    # 'commit_files' stages: the sink and its temporary directory (`file_commits`).
    commit_files: bytes | None = None
    # Its first step publishes (see `regions.publishing`): with consistent regions on,
    # its input waits for the cut covering it (`translators/publish_gate`).
    publishes: bool = False
    # A Create's values read in slices (`translators/create_slices`): batch sends its
    # Impulse input one impulse per partition.
    impulse_slices: bool = False

    @property
    def display_name(self) -> str:
        steps = ', '.join(self.step_names) or self.name
        return f'Beam stage {self.index}: {steps}'


@dataclasses.dataclass
class PipelinePlan:
    stages: list[StagePlan]
    components: bytes  # serialized beam_runner_api_pb2.Components
    execution_context: execution.FnApiRunnerExecutionContext
    gbk_transforms: dict[bytes, str]  # group buffer id -> original GroupByKey transform id
    worker_handler_manager: worker_handlers.WorkerHandlerManager

    def close(self) -> None:
        self.worker_handler_manager.close_all()
        # Beam's merging-WindowFn handles live as long as the execution context.
        self.execution_context = None

    def producers(self, buffer_id: bytes) -> list[StagePlan]:
        return [s for s in self.stages if buffer_id in s.outputs.values()]

    def consumers(self, buffer_id: bytes) -> list[StagePlan]:
        return [s for s in self.stages if buffer_id in s.inputs.values()]

    def side_input_consumers(self, buffer_id: bytes) -> list[StagePlan]:
        return [
            s for s in self.stages
            if any(b == buffer_id for b, _ in s.side_inputs.values())
        ]


def needs_streaming(pipeline_proto: beam_runner_api_pb2.Pipeline, streaming: bool) -> bool:
    """Whether the streaming driver runs the pipeline: `--streaming`, or a TestStream.

    An unbounded source that ends by itself (e.g. `PeriodicImpulse` with a stop
    time) still runs to completion on the batch driver without `--streaming`,
    as on Beam's FnApiRunner.
    """
    return streaming or any(
        t.spec.urn == TEST_STREAM_URN for t in pipeline_proto.components.transforms.values())


def stateful_main_input(transform: beam_runner_api_pb2.PTransform) -> str | None:
    """The main-input PCollection of a stateful ParDo; None for any other transform."""
    if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
        return None
    payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
    if not (payload.state_specs or payload.timer_family_specs):
        return None
    return main_input(transform)


def check_deterministic_keys(
    pipeline_proto: beam_runner_api_pb2.Pipeline, context
) -> None:
    """A GroupByKey or stateful ParDo needs a deterministic key coder (section 3.4)."""
    components = pipeline_proto.components
    for transform in components.transforms.values():
        if transform.spec.urn == common_urns.primitives.GROUP_BY_KEY.urn:
            main_input = next(iter(transform.inputs.values()))
        else:
            main_input = stateful_main_input(transform)
            if main_input is None:
                continue
        kv_coder = components.coders[components.pcollections[main_input].coder_id]
        if kv_coder.spec.urn != common_urns.coders.KV.urn:
            continue
        key_coder = context.coders[kv_coder.component_coder_ids[0]]
        if not key_coder.is_deterministic():
            raise NonDeterministicKeyCoderError(
                f"Step '{transform.unique_name}' groups by key with the non-deterministic key "
                f"coder {key_coder!r}: equal keys could be sent to different partitions. Use "
                'keys of a type with a deterministic coder (str, bytes, int, tuples of those), '
                'or register a deterministic coder for the key type with '
                'beam.coders.registry.register_coder(KeyType, YourCoder).')


def keep_timestamped_combines_unlifted(
    stages: Iterable[translations.Stage], context: translations.TransformContext
) -> Iterable[translations.Stage]:
    """Streaming fusion phase: a CombinePerKey whose output timestamp depends on its
    elements (any timestamp combiner but end-of-window) is not lifted.

    The partial combine before the shuffle merges the timestamps of all the
    bundle's elements, but in streaming the trigger driver must leave out those
    already behind the output watermark when it sets the watermark hold (Beam's
    transcript `known_late_data_watermark`); the unlifted GroupByKey sees every
    element's own timestamp. In batch the output watermark never holds anything
    back, so lifting stays exact there.
    """
    end_of_window = beam_runner_api_pb2.OutputTime.END_OF_WINDOW
    components = context.components
    for stage in stages:
        transform = stage.transforms[0] if len(stage.transforms) == 1 else None
        if (transform is not None
                and transform.spec.urn == common_urns.composites.COMBINE_PER_KEY.urn):
            input_pcoll = components.pcollections[next(iter(transform.inputs.values()))]
            strategy = components.windowing_strategies[input_pcoll.windowing_strategy_id]
            if strategy.output_time != end_of_window:
                for sub in transform.subtransforms:
                    yield translations.Stage(
                        sub, [components.transforms[sub]],
                        downstream_side_inputs=stage.downstream_side_inputs,
                        must_follow=stage.must_follow, parent=stage.name,
                        environment=stage.environment)
                continue
        yield stage


def annotate_side_input_consumers_as_roots(
    stages: Iterable[translations.Stage], context: translations.TransformContext
) -> Iterable[translations.Stage]:
    """Streaming fusion phase: a ParDo reading side inputs starts its own stage.

    Its main-input elements wait in the stage's Pending States Graph until
    their side-input windows are ready (`translators/side_input_gate`), so
    they must arrive at the stage boundary as the ParDo's own input.
    """
    for stage in stages:
        for transform in stage.transforms:
            if transform.spec.urn in translations.PAR_DO_URNS and proto_utils.parse_Bytes(
                    transform.spec.payload, beam_runner_api_pb2.ParDoPayload).side_inputs:
                stage.forced_root = True
        yield stage


def annotate_publishing_steps_as_roots(
    publishing: frozenset[str]
) -> Callable[[Iterable[translations.Stage], translations.TransformContext],
              Iterable[translations.Stage]]:
    """Streaming fusion phase: a step that publishes (`regions.publishing`) starts its
    own stage, so that its input arrives at the stage boundary, where it waits for the
    consistent cut covering it (`translators/publish_gate`)."""
    def phase(stages, context):
        for stage in stages:
            if any(t.unique_name in publishing for t in stage.transforms):
                stage.forced_root = True
            yield stage
    return phase


STREAMING_PHASES = [
    keep_timestamped_combines_unlifted if phase is translations.lift_combiners else phase
    for phase in PHASES
]
STREAMING_PHASES.insert(STREAMING_PHASES.index(keep_timestamped_combines_unlifted) + 1,
                        translations.lift_combiners)
STREAMING_PHASES.insert(
    STREAMING_PHASES.index(translations.annotate_stateful_dofns_as_roots) + 1,
    annotate_side_input_consumers_as_roots)


def build_plan(
    pipeline_proto: beam_runner_api_pb2.Pipeline, is_drain: bool = False,
    streaming: bool = False, publishing: frozenset[str] = frozenset(),
    stateless_chains: bool = True,
) -> PipelinePlan:
    """The plan of `pipeline_proto`; in streaming, the steps named in `publishing` each
    start a stage of their own, marked `publishes`. With `stateless_chains`, runs of
    stateless steps in a stage run as one composed operation
    (`translators.stateless_chain`)."""
    phases = PHASES
    if streaming:
        phases = list(STREAMING_PHASES)
        phases.insert(phases.index(annotate_side_input_consumers_as_roots) + 1,
                      annotate_publishing_steps_as_roots(publishing))
    stage_context, stages = translations.create_and_optimize_stages(
        copy.deepcopy(pipeline_proto),
        phases=phases,
        known_runner_urns=RUNNER_PRIMITIVES,
        use_state_iterables=False,
        is_drain=is_drain)
    manager = worker_handlers.WorkerHandlerManager(
        stage_context.components.environments,
        ExtendedProvisionInfo(
            beam_provision_api_pb2.ProvisionInfo(retrieval_token='unused-retrieval-token')))
    context = execution.FnApiRunnerExecutionContext(
        stages,
        manager,
        stage_context.components,
        stage_context.safe_coders,
        stage_context.data_channel_coders,
        num_workers=1)
    # Rewrites every data endpoint's payload to the coder it carries.
    context.setup()
    gbk_transforms: dict[bytes, str] = {}
    plans = [
        _stage_plan(context, stage, index, gbk_transforms, stateless_chains)
        for index, stage in enumerate(stages)
    ]
    if streaming:
        for stage_plan in plans:
            stage_plan.publishes = any(s in publishing for s in stage_plan.step_names)
    return PipelinePlan(
        stages=plans,
        components=stage_context.components.SerializeToString(),
        execution_context=context,
        gbk_transforms=gbk_transforms,
        worker_handler_manager=manager)


def stable_stage_name(transforms: Iterable[beam_runner_api_pb2.PTransform]) -> str:
    """The stage's name: the same in every driver process that plans the pipeline.

    Beam's fused stage names, and the order of stages that do not depend on each
    other, follow the order in which its greedy fusion merged them, which depends on
    the process's string hashes and object addresses. A restarted driver finds a
    stage's keyed state, revisions and source positions, and compares the stored
    graph, by this name: a digest of the ids of the transforms fused into it."""
    ids = sorted(t.unique_name for t in transforms)
    return 'stage-' + hashlib.sha256('\n'.join(ids).encode()).hexdigest()[:16]


def _user_step_names(transforms: Iterable[beam_runner_api_pb2.PTransform]) -> list[str]:
    hidden = {bundle_processor.DATA_INPUT_URN, bundle_processor.DATA_OUTPUT_URN}
    return [t.unique_name for t in transforms
            if t.spec.urn not in hidden and not is_source_bundle_boundary(t)]


def _stage_plan(
    context: execution.FnApiRunnerExecutionContext,
    stage: translations.Stage,
    index: int,
    gbk_transforms: dict[bytes, str],
    stateless_chains: bool = True,
) -> StagePlan:
    inputs: dict[str, bytes] = {}
    outputs: dict[str, bytes] = {}
    input_coders: dict[str, str] = {}
    output_coders: dict[str, str] = {}
    is_reshuffle = any(t.spec.urn == RESHUFFLE_URN for t in stage.transforms)
    test_stream = next((t for t in stage.transforms if t.spec.urn == TEST_STREAM_URN), None)
    commit = next((t for t in stage.transforms if t.spec.urn == COMMIT_FILES_URN), None)
    for transform in stage.transforms:
        if transform.spec.urn == bundle_processor.DATA_INPUT_URN:
            buffer_id = context.input_transform_to_buffer_id[transform.unique_name]
            inputs[transform.unique_name] = buffer_id
            input_coders[transform.unique_name] = beam_fn_api_pb2.RemoteGrpcPort.FromString(
                transform.spec.payload).coder_id
            kind, name = translations.split_buffer_id(buffer_id) \
                if buffer_id != IMPULSE_BUFFER else ('impulse', '')
            if kind == 'group':
                gbk_transforms[buffer_id] = name
        elif transform.spec.urn == bundle_processor.DATA_OUTPUT_URN:
            port = beam_fn_api_pb2.RemoteGrpcPort.FromString(transform.spec.payload)
            outputs[transform.unique_name] = _output_buffer_id(context, stage, transform)
            output_coders[transform.unique_name] = port.coder_id
    manager = context.bundle_manager_for(stage)
    timer_families = {}
    for (transform_id, family), (_, domain) in manager.stage_timer_outputs.items():
        descriptor = manager.process_bundle_descriptor
        payload = proto_utils.parse_Bytes(
            descriptor.transforms[transform_id].spec.payload, beam_runner_api_pb2.ParDoPayload)
        timer_families[(transform_id, family)] = (
            payload.timer_family_specs[family].timer_family_coder_id, domain)
    side_inputs = {}
    for transform in stage.transforms:
        if transform.spec.urn in translations.PAR_DO_URNS:
            payload = proto_utils.parse_Bytes(
                transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
            for tag, spec in payload.side_inputs.items():
                side_inputs[(transform.unique_name, tag)] = (
                    translations.create_buffer_id(transform.inputs[tag]),
                    spec.access_pattern.SerializeToString())
    stateful = stage.is_stateful()
    key_coders = {}
    if stateful:
        for transform_id, coder_id in input_coders.items():
            key_coders[transform_id] = kv_component_coder_ids(context, coder_id)[0]
    test_stream_outputs = {}
    impulse_slices = False
    if test_stream is not None:
        # A runner-only stage: the driver feeds its events (see translators/test_stream).
        descriptor = None
        kind = 'test_stream'
        writers = {next(iter(t.inputs.values())): t.unique_name for t in stage.transforms
                   if t.spec.urn == bundle_processor.DATA_OUTPUT_URN}
        test_stream_outputs = {tag: writers[pcoll] for tag, pcoll in test_stream.outputs.items()
                               if pcoll in writers}
    elif is_reshuffle or commit is not None:
        # A runner-only stage: the SDK harness never sees it.
        descriptor = None
        kind = 'reshuffle' if is_reshuffle else 'commit_files'
    else:
        descriptor = manager.process_bundle_descriptor
        sliced = sliced_creates(descriptor, {input_id for input_id, buffer_id in inputs.items()
                                             if buffer_id == IMPULSE_BUFFER})
        impulse_slices = sliced is not None
        descriptor = sliced or descriptor
        if stateless_chains:
            descriptor = batch_file_writes(fuse_stateless_chains(bulk_bounded_reads(descriptor)))
        descriptor = descriptor.SerializeToString()
        kind = 'sdk'
    return StagePlan(
        name=stable_stage_name(stage.transforms),
        index=index,
        kind=kind,
        step_names=_user_step_names(stage.transforms),
        inputs=inputs,
        outputs=outputs,
        input_coders=input_coders,
        output_coders=output_coders,
        timer_families=timer_families,
        side_inputs=side_inputs,
        stateful=stateful,
        key_coders=key_coders,
        descriptor=descriptor,
        test_stream=test_stream.spec.payload if test_stream is not None else None,
        test_stream_outputs=test_stream_outputs,
        commit_files=commit.spec.payload if commit is not None else None,
        impulse_slices=impulse_slices)


def _output_buffer_id(context, stage, transform) -> bytes:
    # setup() replaced the payload with the port; the stage's data outputs keep
    # the buffer ids.
    manager = context.bundle_manager_for(stage)
    return manager.stage_data_outputs[transform.unique_name]


def kv_component_coder_ids(context: execution.FnApiRunnerExecutionContext,
                           windowed_coder_id: str) -> tuple[str, str]:
    """The key and value coder ids of windowed key-value elements."""
    components = context.pipeline_components
    windowed = components.coders[windowed_coder_id]
    kv = components.coders[windowed.component_coder_ids[0]]
    if kv.spec.urn == common_urns.coders.LENGTH_PREFIX.urn:
        kv = components.coders[kv.component_coder_ids[0]]
    if kv.spec.urn != common_urns.coders.KV.urn:
        raise UnsupportedFeatureError(
            f'A stateful DoFn needs key-value input; got elements coded by {kv.spec.urn}.')
    key_coder_id, value_coder_id = kv.component_coder_ids
    return key_coder_id, value_coder_id
