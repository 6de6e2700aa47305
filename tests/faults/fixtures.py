"""Fixtures of the fault-injection tests (see `harness.py`), made known to pytest by the
tests' conftest.py (a conftest.py here would shadow that one's module name, which
other tests import as `conftest`).

* `fault_spark`: the SparkSession of the in-process runs, `local[2,4]` (a failed task
  runs up to 4 times, as on a cluster; plain `local[N]` never retries) unless the
  test session already runs one (then that one, and `attempts` says how many times
  it runs a failing task), with its Python workers started.
* `fault_run(pipeline, sink, store, ...)`: the spec, the runner flags and the output
  reader of one run in a fresh job, its checkpoint store a directory under
  `tmp_path` or a database of the session's redis-server.
* `own_redis`: a `RedisServer` of the test's own (to kill, flush or restart), always
  stopped and removed at the end.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from tests.faults import harness, judging

STORE_DB = 2  # the session's redis-server: checkpoints of the fault tests
SINK_DB = 3  # and what their WriteToRedis sinks publish


@pytest.fixture(scope='session')
def fault_spark():
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_streams_runner.driver.spark_session import get_or_create_spark
    session = get_or_create_spark(
        PipelineOptions(['--spark_master=local[2,4]',
                         '--spark_conf=spark.ui.showConsoleProgress=false']),
        app_name='beam-streams-runner-fault-tests')
    session.sparkContext.setLogLevel('ERROR')
    harness.warm_up(session)
    yield session


@pytest.fixture
def attempts(fault_spark) -> int:
    """How many times the session's Spark runs a failing task before the epoch fails."""
    return harness.task_attempts(fault_spark)




@dataclasses.dataclass
class FaultRun:
    """One run's spec, flags and output check (see `fault_run`)."""

    spec: harness.Spec
    flags: list[str]
    job: str
    store: str
    sink_client: object | None  # a redis client of the sink's database

    def run(self) -> None:
        harness.run_in_process(self.spec, self.flags)

    def check_exact(self) -> None:
        judging.check_exact(self.spec, self.sink_client)

    def check_subset(self) -> None:
        judging.check_subset(self.spec, self.sink_client)

    def output(self):
        """A snapshot of the sink's output (to compare before and after a refused run)."""
        if self.spec.sink == 'redis':
            return judging.read_redis(self.spec, self.sink_client)
        return judging.read_files(self.spec)


@pytest.fixture
def fault_run(tmp_path, request, fault_spark):
    """`fault_run(pipeline, sink, store, mode='blocking', fault=None, start=None,
    period_s=0.5, extra=(), store_url=None, job=None, sink_server=None) -> FaultRun`;
    `fault` is `(kind, where, at, times)` and its marker files go under `tmp_path`; a
    `redis` sink writes to database SINK_DB of `sink_server` (default: the session's
    redis-server)."""
    clients = []

    def make(pipeline: str, sink: str, store: str, mode: str = 'blocking',
             fault: tuple | None = None, start: int | None = None, period_s: float = 0.5,
             extra=(), store_url: str | None = None, job: str | None = None,
             sink_server=None) -> FaultRun:
        run_id = uuid.uuid4().hex[:8]
        job = job or f'faults-{run_id}'
        client = None
        if sink == 'redis':
            server = sink_server or request.getfixturevalue('redis_server')
            out = server.url_of(SINK_DB)
            client = server.client(db=SINK_DB)
            clients.append(client)
        else:
            out = str(tmp_path / f'out-{run_id}' / 'out')
        if store_url is None:
            if store == 'redis':
                store_url = request.getfixturevalue('redis_server').url_of(STORE_DB)
            else:
                store_url = str(tmp_path / f'store-{run_id}')
        injected = None
        if fault is not None:
            kind, where, at, times = fault
            injected = harness.Fault(kind, str(tmp_path / f'fault-{run_id}'), at, where, times)
        spec = harness.Spec(pipeline, sink, out, harness.stream_start() if start is None
                            else start, key_prefix=f'{run_id}:', fault=injected)
        flags = harness.runner_flags(job, store_url, period_s=period_s, mode=mode,
                                     extra=extra)
        return FaultRun(spec, flags, job, store_url, client)

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def own_redis():
    from beam_streams_runner.stores.redis_server import RedisServer
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()
