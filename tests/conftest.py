"""Shared fixtures and helpers of the StreamsSparkRunner tests.

* One SparkSession (`local[2]`) for the whole test session: the runner reuses
  the active session, so every pipeline of every test runs on it and Spark
  starts once.
* `run_both(build)` runs the same pipeline builder on Beam's DirectRunner and on
  StreamsSparkRunner and returns both outputs, each as the sorted list of the
  canonical text form of its elements. Outputs go through `WriteToText` into a
  temporary directory and are read back from all shards: a Python list cannot
  collect elements produced in Spark's worker processes. `assert_same_as_direct`
  asserts that both are equal.
* `same_as_direct_streaming(build)` runs a pipeline with `--streaming` on both
  runners; outputs are written by a side-effect DoFn (`WriteLines`, one file per
  bundle, with window, timestamp and pane), so it needs no file sink.
* `streaming_stage(p, select)` (module fixture): the worker runtime and the one
  stage `select` picks of pipeline `p`, planned for streaming, to drive a
  stage's operators directly; `stateful_stage(p)` (module fixture): for the
  stateful stage of `p`, an operator factory (`make(state=None)`: a streaming
  operator over a keyed-state backend) and an encoder of its keyed input.
* Test modules under `tests/` are pickled by value (not by reference), so the
  DoFns and functions they define at module level can be unpickled in Spark's
  Python workers, which cannot import the test modules.
"""

from __future__ import annotations

import glob
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence

import apache_beam as beam
import pytest
from apache_beam.internal import cloudpickle as beam_cloudpickle
from apache_beam.io import WriteToText
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.testing import test_stream
from apache_beam.transforms import environments, window
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner.driver.lineage import worker_plan
from beam_streams_runner.driver.plan import build_plan
from beam_streams_runner.state.backend import KeyedStateBackend
from beam_streams_runner.translators.operator import OperatorServices
from beam_streams_runner.translators.par_do import FusedStageOperator
from beam_streams_runner.translators.read import ReadInEpochs

SPARK_ARGS = ['--spark_master=local[2]']


def pytest_configure(config: pytest.Config) -> None:
    # Streaming runs keep checkpoints and a journal under the runner's home: one of the
    # test session's own, so no test sees another session's jobs (or the user's).
    import tempfile
    os.environ['BEAM_STREAMS_RUNNER_HOME'] = tempfile.mkdtemp(prefix='bsr-home-')
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

Outputs = dict[str, list[str]]
Builder = Callable[[beam.Pipeline], 'beam.PCollection | Mapping[str, beam.PCollection]']


def canonical(value) -> str:
    """A text form of `value` that does not depend on the order of unordered parts.

    Lists (e.g. the values of a GroupByKey) and sets are sorted, dicts by key;
    tuples keep their order. Timestamps and windows use their repr.
    """
    return repr(_canonical(value))


def _canonical(value):
    if isinstance(value, tuple) and not hasattr(value, '_fields'):
        return tuple(_canonical(v) for v in value)
    if isinstance(value, (list, set, frozenset)) or _is_iterable_view(value):
        return sorted((_canonical(v) for v in value), key=repr)
    if isinstance(value, dict):
        return sorted(((_canonical(k), _canonical(v)) for k, v in value.items()), key=repr)
    return value


def _is_iterable_view(value) -> bool:
    # GroupByKey values may come as a lazy iterable (e.g. `_UnwindowedValues`).
    return (not isinstance(value, (str, bytes, dict, tuple))
            and hasattr(value, '__iter__') and not hasattr(value, '__next__')
            and type(value).__module__.startswith('apache_beam'))


def read_shards(prefix: str) -> list[str]:
    lines: list[str] = []
    for path in sorted(glob.glob(prefix + '*')):
        if os.path.isfile(path):
            with open(path, encoding='utf-8') as f:
                lines.extend(line.rstrip('\n') for line in f)
    return sorted(lines)


def run_pipeline(build: Builder, runner, out_dir: str, args: Sequence[str] = (),
                 fmt: Callable[[object], str] = canonical) -> Outputs:
    """Runs `build` on `runner`; returns each output's sorted text lines.

    All outputs go to one `WriteToText` (each line prefixed by its output's
    name): every file sink costs the runner a Spark job of its own (its files are
    committed after it), so one sink per pipeline keeps the tests fast.
    """
    options = PipelineOptions(list(args))
    with beam.Pipeline(runner=runner, options=options) as p:
        outputs = build(p)
        if not isinstance(outputs, Mapping):
            outputs = {'out': outputs}
        names = list(outputs)
        # Outputs may be windowed differently; Flatten needs one windowing.
        lines = [
            pcoll
            | f'Format {name}' >> beam.Map(_tagged_line, name, fmt)
            | f'Rewindow {name}' >> beam.WindowInto(window.GlobalWindows())
            for name, pcoll in outputs.items()
        ]
        merged = lines[0] if len(lines) == 1 else lines | 'Outputs' >> beam.Flatten()
        merged | 'Write' >> WriteToText(os.path.join(out_dir, 'part'))
    result: Outputs = {name: [] for name in names}
    for line in read_shards(os.path.join(out_dir, 'part')):
        name, _, text = line.partition('\t')
        result[name].append(text)
    return result


def _tagged_line(element, name: str, fmt: Callable[[object], str]) -> str:
    return f'{name}\t{fmt(element)}'


def spark_runner() -> StreamsSparkRunner:
    return StreamsSparkRunner()


@pytest.fixture(scope='session')
def spark_args() -> list[str]:
    return list(SPARK_ARGS)


@pytest.fixture(scope='session')
def spark_session():
    """The SparkSession shared by every test (the runner reuses the active one), started
    the way the runner starts its own, so the tests run with the runner's defaults."""
    from beam_streams_runner.driver.spark_session import get_or_create_spark
    session = get_or_create_spark(
        PipelineOptions(['--spark_master=local[2]',
                         '--spark_conf=spark.ui.showConsoleProgress=false']),
        app_name='beam-streams-runner-tests')
    session.sparkContext.setLogLevel('ERROR')
    yield session
    # Left running: other test sessions in this process (conformance) reuse it,
    # and the JVM goes down with the interpreter.


@pytest.fixture(scope='session', autouse=True)
def _pickle_test_modules_by_value():
    """Ship module-level test code to Spark workers by value."""
    for module in list(sys.modules.values()):
        path = getattr(module, '__file__', None) or ''
        if (path.startswith(TESTS_DIR + os.sep)
                and os.path.basename(path).startswith(('test_', 'conftest'))):
            beam_cloudpickle.register_pickle_by_value(module)
    yield


@pytest.fixture
def run_both(tmp_path, spark_session, spark_args):
    """`run_both(build, args=(), fmt=canonical) -> (direct outputs, spark outputs)`.

    `build(p)` adds the pipeline under test to `p` and returns a PCollection or
    a dict of named PCollections; each is written to text and read back sorted.
    `args` are extra pipeline options for both runners.
    """
    def run(build: Builder, args: Sequence[str] = (),
            fmt: Callable[[object], str] = canonical) -> tuple[Outputs, Outputs]:
        run_id = uuid.uuid4().hex[:8]
        direct = run_pipeline(build, 'DirectRunner', str(tmp_path / f'direct-{run_id}'),
                              list(args), fmt)
        spark = run_pipeline(build, spark_runner(), str(tmp_path / f'spark-{run_id}'),
                             list(spark_args) + list(args), fmt)
        return direct, spark
    return run


@pytest.fixture
def assert_same_as_direct(run_both):
    """Runs `build` on both runners and asserts equal, non-trivial outputs."""
    def check(build: Builder, args: Sequence[str] = (),
              fmt: Callable[[object], str] = canonical, allow_empty: bool = False) -> Outputs:
        direct, spark = run_both(build, args, fmt)
        if not allow_empty:
            assert any(direct.values()), f'the DirectRunner produced no output: {direct}'
        assert spark == direct
        return spark
    return check


class WriteLines(beam.DoFn):
    """Writes each element's canonical form, window, timestamp and pane, a file per bundle."""

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def start_bundle(self) -> None:
        self._lines = []

    def process(self, element, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam,
                pane=beam.DoFn.PaneInfoParam):
        # Milliseconds: Beam's coders keep timestamps to the millisecond, and the
        # DirectRunner's streaming mode never encodes (so it keeps microseconds).
        self._lines.append(
            f'{canonical(element)} {w} {ts.micros // 1000} {pane.timing} {pane.index}')

    def finish_bundle(self) -> None:
        if self._lines:
            path = os.path.join(self._directory, f'{os.getpid()}-{uuid.uuid4().hex}')
            with open(path, 'w', encoding='utf-8') as f:
                f.write('\n'.join(self._lines) + '\n')


def run_streaming(build, runner, directory: str, args=()) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    options = PipelineOptions(['--streaming', *args])
    with beam.Pipeline(runner=runner, options=options) as p:
        build(p) | beam.ParDo(WriteLines(directory))
    lines: list[str] = []
    for path in glob.glob(os.path.join(directory, '*')):
        with open(path, encoding='utf-8') as f:
            lines.extend(f.read().splitlines())
    return sorted(lines)


@pytest.fixture
def same_as_direct_streaming(tmp_path, spark_session):
    """`same_as_direct_streaming(build, args=())`: asserts equal streaming outputs."""
    def check(build, args=()) -> list[str]:
        direct = run_streaming(build, 'DirectRunner', str(tmp_path / 'direct'), args)
        spark = run_streaming(build, StreamsSparkRunner(), str(tmp_path / 'spark'),
                              [*SPARK_ARGS, *args])
        assert direct, 'the DirectRunner produced no output'
        assert spark == direct
        return spark
    return check


def events_with_late_data() -> test_stream.TestStream:
    """Two keys over three epochs of watermarks, with one late element."""
    return (test_stream.TestStream()
            .add_elements([window.TimestampedValue(('a', 1), 1),
                           window.TimestampedValue(('b', 2), 2)])
            .advance_watermark_to(4)
            .add_elements([window.TimestampedValue(('a', 3), 3),
                           window.TimestampedValue(('a', 7), 7)])
            .advance_watermark_to(12)
            .add_elements([window.TimestampedValue(('a', 2), 2)])  # late: dropped
            .add_elements([window.TimestampedValue(('b', 11), 11)])
            .advance_watermark_to_infinity())


@pytest.fixture(scope='module')
def streaming_stage():
    """`plan(p, select) -> (runtime, stage)`: pipeline `p` planned for streaming, its
    worker runtime and the one stage `select(stage)` picks; plans close with the module."""
    plans = []

    def plan(p: beam.Pipeline, select: Callable) -> tuple:
        p.visit(group_by_key_input_visitor(True))
        built = build_plan(p.to_runner_api(
            default_environment=environments.EmbeddedPythonEnvironment.default()),
            streaming=True)
        plans.append(built)
        runtime = worker_plan(built, f'test-{uuid.uuid4().hex}', 100, 1).runtime()
        stage, = [s for s in built.stages if select(s)]
        return runtime, stage

    yield plan
    for built in plans:
        built.close()


@pytest.fixture(scope='module')
def stateful_stage(streaming_stage):
    """`operators(p) -> (make, encode)` for the stateful stage of `p`.

    `make(state=None)` builds a FusedStageOperator of the stage as a streaming epoch
    does (bundles of 100, sources read in epochs) over the keyed-state backend
    `state`, a fresh `KeyedStateBackend(track_changes=True)` if None (a test restores
    a backend, or takes its deltas, through the backend itself); `encode` turns
    `(key, value, t)` elements in 10 s fixed windows into its keyed input records."""
    return lambda p: _fused_operators(*streaming_stage(p, lambda s: s.stateful))


def _fused_operators(runtime, stage) -> tuple[Callable, Callable]:
    (input_id, _), = stage.inputs.items()
    coder = runtime.coder_impl(stage.input_coders[input_id])

    def make(state: KeyedStateBackend | None = None) -> FusedStageOperator:
        if state is None:
            state = KeyedStateBackend(track_changes=True)
        return FusedStageOperator(runtime, stage, OperatorServices(
            bundle_size=100, state=state, source=ReadInEpochs(0)))

    def encode(elements) -> list[tuple[str, bytes]]:
        if not elements:
            return []
        return [(input_id, b''.join(
            coder.encode_nested(WindowedValue(
                (key, value), Timestamp(t),
                (window.IntervalWindow(t - t % 10, t - t % 10 + 10),)))
            for key, value, t in elements))]

    return make, encode


# Redis checkpoint stores --------------------------------------------------------------------
@pytest.fixture(scope='session')
def redis_server():
    """A real `redis-server` (AOF on, no password) shared by the session's tests, always
    stopped, its directory removed, at the end. Tests that kill, pause or restart a
    server start their own `RedisServer` instead."""
    from beam_streams_runner.stores.redis_server import RedisServer
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_db(redis_server, request):
    """(url, client) of database `DB` of `redis_server`, where `DB` is the test module's
    own number (so modules do not flush each other's data), flushed before the test."""
    db = request.module.DB
    client = redis_server.client(db=db)
    client.flushdb()
    yield redis_server.url_of(db), client
    client.close()


@pytest.fixture
def redis_store(redis_server):
    """A `RedisStore` on db 0 of `redis_server`, emptied (FLUSHDB) before the test."""
    from beam_streams_runner.stores.redis_store import RedisStore
    client = redis_server.client()
    try:
        client.flushdb()
    finally:
        client.close()
    store = RedisStore(redis_server.url)
    yield store
    store.close()


# The fault-injection and cluster tests' fixtures: a conftest.py of their own would take this
# module's name `conftest`, which the other tests import from.
from tests.cluster.fixtures import local_cluster, words, words_direct  # noqa: E402, F401
from tests.faults.fixtures import attempts, fault_run, fault_spark, own_redis  # noqa: E402, F401
