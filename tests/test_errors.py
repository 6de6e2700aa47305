"""How failures reach the launching program.

* A user DoFn raising inside a Spark task: `with beam.Pipeline(...)` raises
  `PipelineExecutionError` naming the Beam step and carrying the user's
  traceback (function name, message), and nothing hangs.
* A grouping step whose key coder is not deterministic:
  `NonDeterministicKeyCoderError` naming the step, before any Spark job.
* Invalid runner options: an error before any Spark job.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.userstate import BagStateSpec
from pyspark import SparkContext
from pyspark.rdd import RDD

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.errors import (
    NonDeterministicKeyCoderError,
    PipelineExecutionError,
    StoreNotSharedError,
    pipeline_error_from_spark,
)
from beam_streams_runner.options import InvalidOptionsError

pytestmark = pytest.mark.timeout(120)


def _pipeline(spark_args, *extra):
    return beam.Pipeline(runner=StreamsSparkRunner(),
                         options=PipelineOptions(list(spark_args) + list(extra)))


def explode_on_three(element):
    if element == 3:
        raise ValueError(f'user failure on element {element}')
    return element


class _FailingAfterGroup(beam.DoFn):
    def process(self, element):
        key, values = element
        if key == 'bad':
            self.reject_bad_group(values)
        yield key

    def reject_bad_group(self, values):
        raise RuntimeError(f'bad group of {len(list(values))} values')


def test_user_error_names_step_and_user_function(spark_session, spark_args):
    with pytest.raises(PipelineExecutionError) as info:
        with _pipeline(spark_args) as p:
            (p
             | beam.Create(range(6))
             | 'FailingStep' >> beam.Map(explode_on_three)
             | 'After' >> beam.Map(lambda x: x + 1))
    message = str(info.value)
    assert 'FailingStep' in message
    assert 'explode_on_three' in message
    assert 'user failure on element 3' in message
    assert 'ValueError' in message
    # The user sees the Python story, not the JVM's stack.
    assert 'at org.apache.spark' not in message


def test_user_error_after_a_shuffle(spark_session, spark_args):
    with pytest.raises(PipelineExecutionError) as info:
        with _pipeline(spark_args) as p:
            (p
             | beam.Create([('ok', 1), ('bad', 2), ('bad', 3)])
             | beam.GroupByKey()
             | 'RejectBadGroups' >> beam.ParDo(_FailingAfterGroup()))
    message = str(info.value)
    assert 'RejectBadGroups' in message
    assert 'reject_bad_group' in message
    assert 'bad group of 2 values' in message


def test_failed_run_result_and_later_runs(spark_session, spark_args):
    """p.run() returns; wait_until_finish raises; the next pipeline runs normally."""
    p = _pipeline(spark_args)
    p | beam.Create(range(5)) | 'FailingStep' >> beam.Map(explode_on_three)
    result = p.run()
    with pytest.raises(PipelineExecutionError, match='FailingStep'):
        result.wait_until_finish()
    assert result.state == 'FAILED'

    p = _pipeline(spark_args)
    p | beam.Create(range(3)) | beam.Map(lambda x: x)
    assert p.run().wait_until_finish() == 'DONE'


class _Point:
    """A key type whose coder is not deterministic."""

    def __init__(self, x):
        self.x = x


class _NonDeterministicPointCoder(coders.Coder):
    def encode(self, value):
        return str(value.x).encode()

    def decode(self, encoded):
        return _Point(int(encoded))

    def is_deterministic(self):
        return False


@pytest.fixture
def no_spark_jobs(monkeypatch, spark_session):
    """Fails the test if the runner starts any Spark job."""
    def fail(*args, **kwargs):
        raise AssertionError('a Spark job was started')

    monkeypatch.setattr(RDD, 'collect', fail)
    monkeypatch.setattr(RDD, 'foreach', fail)
    monkeypatch.setattr(RDD, 'count', fail)
    monkeypatch.setattr(SparkContext, 'runJob', fail)


@pytest.fixture
def point_coder():
    registry = beam.coders.registry
    registry.register_coder(_Point, _NonDeterministicPointCoder)
    yield
    # Beam has no unregister: undo what register_coder did (the coder map and
    # the custom-type list pipelines later read).
    registry._coders.pop(_Point, None)
    if _Point in registry.custom_types:
        registry.custom_types.remove(_Point)


def test_non_deterministic_key_coder_in_group_by_key(spark_args, no_spark_jobs, point_coder):
    # Beam itself rejects the coder unless told to allow it; the runner must
    # reject it either way, since equal keys could land in different partitions.
    with pytest.raises(NonDeterministicKeyCoderError) as info:
        with _pipeline(spark_args, '--allow_non_deterministic_key_coders') as p:
            (p
             | beam.Create([1, 2, 1])
             | beam.Map(lambda x: (_Point(x), x)).with_output_types(tuple[_Point, int])
             | 'GroupByPoint' >> beam.GroupByKey())
    assert 'GroupByPoint' in str(info.value)


def test_non_deterministic_key_coder_rejected_by_default(spark_args, no_spark_jobs,
                                                         point_coder):
    with pytest.raises(ValueError, match='GroupByPoint'):
        with _pipeline(spark_args) as p:
            (p
             | beam.Create([1, 2, 1])
             | beam.Map(lambda x: (_Point(x), x)).with_output_types(tuple[_Point, int])
             | 'GroupByPoint' >> beam.GroupByKey())


class _RememberPoints(beam.DoFn):
    SEEN = BagStateSpec('seen', coders.VarIntCoder())

    def process(self, element, seen=beam.DoFn.StateParam(SEEN)):
        seen.add(element[1])
        yield element[1]


def test_non_deterministic_key_coder_in_stateful_dofn(spark_args, no_spark_jobs, point_coder):
    with pytest.raises(NonDeterministicKeyCoderError) as info:
        with _pipeline(spark_args, '--allow_non_deterministic_key_coders') as p:
            (p
             | beam.Create([1, 2, 1])
             | beam.Map(lambda x: (_Point(x), x)).with_output_types(tuple[_Point, int])
             | 'StatefulByPoint' >> beam.ParDo(_RememberPoints()))
    assert 'StatefulByPoint' in str(info.value)


@pytest.mark.parametrize('flag', ['--bundle_size=0', '--bundle_size=-5'])
def test_invalid_options_fail_before_any_job(spark_args, no_spark_jobs, flag):
    with pytest.raises(InvalidOptionsError) as info:
        with _pipeline(spark_args, flag) as p:
            p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
    assert 'bundle_size' in str(info.value)


def test_a_store_the_tasks_do_not_see_comes_back_as_its_own_error():
    """Raised in a task, wrapped by Spark: the driver gets the runner's error, whose
    message is the task's, without Spark's trace."""
    text = ('Job aborted due to stage failure: Lost task 0.3 in stage 4.0 (TID 9) '
            '(127.0.0.3 executor 1): org.apache.spark.api.python.PythonException: '
            'Traceback (most recent call last):\n  File "x.py", line 1\n'
            'beam_streams_runner.errors.StoreNotSharedError: The keyed state of this run '
            'is kept in LocalDirectoryStore(/tmp/s) ... Give --checkpoint_store=redis://...\n'
            '\tat org.apache.spark.api.python.BasePythonRunner\n')
    error = pipeline_error_from_spark(RuntimeError(text))
    assert isinstance(error, StoreNotSharedError)
    assert str(error).startswith('The keyed state of this run is kept in')
    assert str(error).endswith('redis://...') and 'org.apache' not in str(error)
