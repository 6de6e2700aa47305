"""`StreamsSparkRunner`: runs a Beam Python pipeline on Apache Spark through PySpark.

The runner validates the options, turns the pipeline into a plan of fused
stages (`plan`), checks what must be checked before anything runs
(deterministic key coders, features of this release), gets or creates the
SparkSession and hands the plan to the batch driver on a driver thread; the
returned `StreamsSparkPipelineResult` follows the run.
"""

from __future__ import annotations

import logging
import pickle

from apache_beam.options.pipeline_options import (
    DebugOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)
from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.pipeline import Pipeline
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.pipeline_utils import (
    group_by_key_input_visitor,
    merge_common_environments,
    merge_superset_dep_environments,
)
from apache_beam.runners.runner import PipelineRunner
from apache_beam.transforms import environments

from beam_streams_runner.driver.batch import BatchDriver
from beam_streams_runner.driver.construction_checks import check_applied
from beam_streams_runner.driver.plan import (
    PipelinePlan,
    build_plan,
    check_deterministic_keys,
    needs_streaming,
)
from beam_streams_runner.driver.progress import find_endpoints
from beam_streams_runner.driver.spark_session import get_or_create_spark
from beam_streams_runner.driver.streaming import StreamingDriver
from beam_streams_runner.errors import UnpicklableUserCodeError
from beam_streams_runner.options import (
    StreamsSparkOptions,
    checkpoint_settings,
    spark_parallelism,
    validate_streams_spark_options,
)
from beam_streams_runner.regions.file_sinks import REPUBLISH_SAFE_FILE_SINKS
from beam_streams_runner.regions.publishing import publishing_steps
from beam_streams_runner.result import StreamsSparkPipelineResult
from beam_streams_runner.translators.file_commits import commit_batch_file_writes

_LOGGER = logging.getLogger(__name__)


class StreamsSparkRunner(PipelineRunner):
    """A Beam runner executing pipelines as Spark jobs, in PySpark."""

    def __init__(self, is_drain: bool = False) -> None:
        super().__init__()
        self._is_drain = is_drain

    def apply_PTransform(self, transform, input, options):
        # Before Beam expands it: a cross-language transform would start a Java service.
        check_applied(transform, input)
        return super().apply_PTransform(transform, input, options)

    def run_pipeline(
        self, pipeline: Pipeline, options: PipelineOptions
    ) -> StreamsSparkPipelineResult:
        spark_options = validate_streams_spark_options(options)
        RuntimeValueProvider.set_runtime_options({})
        proto, plan, streaming = plan_pipeline(pipeline, options, is_drain=self._is_drain)
        try:
            check_deterministic_keys(proto, plan.execution_context.pipeline_context)
            spark = get_or_create_spark(spark_options, app_name='beam-streams-runner')
            if streaming:
                driver = StreamingDriver(
                    spark.sparkContext, plan,
                    bundle_size=spark_options.bundle_size,
                    bundle_time_ms=spark_options.bundle_time_ms,
                    num_partitions=spark_parallelism(options),
                    on_progress=_log_progress,
                    target_latency_ms=spark_options.target_latency_ms,
                    keyed_state_gc=spark_options.keyed_state_gc,
                    endpoints=find_endpoints(proto),
                    checkpoint=checkpoint_settings(options))
                progress = driver.progress.records
                drain, drained = driver.drain, driver.drained
            else:
                driver = BatchDriver(
                    spark.sparkContext, plan,
                    bundle_size=spark_options.bundle_size,
                    num_partitions=spark_parallelism(options),
                    on_progress=_log_progress)
                # One Spark job: Spark's console progress bar and UI follow it.
                progress = list
                drain = drained = None  # nothing to drain: result.drain() says so
        except BaseException:
            plan.close()
            raise
        return StreamsSparkPipelineResult(
            run=driver.run,
            cancel=driver.cancel,
            metric_totals=lambda: driver.metrics.value,
            on_done=plan.close,
            progress=progress,
            drain=drain,
            drained=drained,
        ).start()


def plan_pipeline(pipeline: Pipeline, options: PipelineOptions, is_drain: bool = False
                  ) -> tuple[beam_runner_api_pb2.Pipeline, PipelinePlan, bool]:
    """The pipeline's proto and plan of fused stages, and whether the streaming driver
    runs it: what every driver process makes of the same pipeline."""
    debug = options.view_as(DebugOptions)
    experiments = debug.experiments or []
    if 'beam_fn_api' not in experiments:
        experiments.append('beam_fn_api')
    debug.experiments = experiments
    pipeline.visit(group_by_key_input_visitor(
        not options.view_as(TypeOptions).allow_non_deterministic_key_coders))
    pipeline.replace_all(REPUBLISH_SAFE_FILE_SINKS)
    commit_batch_file_writes(pipeline, options.view_as(StandardOptions).streaming)
    try:
        proto = pipeline.to_runner_api(
            default_environment=environments.EmbeddedPythonEnvironment.default())
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        if 'pickle' not in str(exc).lower():
            raise
        raise UnpicklableUserCodeError(
            f'The pipeline holds user code that cannot be serialized for Spark workers: '
            f'{exc}. Keep DoFns free of open files, locks, sockets and clients: create '
            'them in DoFn.setup() instead of __init__.') from exc
    proto = merge_common_environments(merge_superset_dep_environments(proto))
    streaming = needs_streaming(proto, options.view_as(StandardOptions).streaming)
    plan = build_plan(proto, is_drain=is_drain, streaming=streaming,
                      publishing=publishing_steps(pipeline),
                      stateless_chains=options.view_as(StreamsSparkOptions).stateless_chains)
    return proto, plan, streaming


def _log_progress(message: str) -> None:
    _LOGGER.info('StreamsSparkRunner: %s', message)
