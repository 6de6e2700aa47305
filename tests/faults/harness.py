"""The fault-injection harness: a run's spec, its sinks, and how it is run.

Design sections 8, 11 and 12. A fault test runs one small streaming pipeline of
`pipelines.py` (P1-P8) with consistent regions on (`--checkpoint_period_s` well under
a second), injects one fault (`injection.py`) in the middle of it, and compares what
the pipeline's exactly-once sinks published with the golden result computed from the
definition of the input (`judging.py`): nothing lost, nothing duplicated, nothing
half-written left behind.

A pipeline's lines (one label, or `a` and `b` for two sinks) go through one kind of
publishing sink:

* `text`: `WriteToText(out/part, triggering_frequency=1, num_shards=1)` (one final
  file per window, its temporary directory under `out/`);
* `files`: `fileio.WriteToFiles(out, shards=1)` (for P3 a destination per line; its
  temporary files elsewhere, so that `out` holds only final files);
* `redis`: `beam_streams_runner.io.WriteToRedis` (a key per line's identity).

A label's sink writes to `out` (`out-a`, `out-b`), or under the key prefix
`key_prefix` (`key_prefix` + `a:`, `b:`).

The module is also a program: `python harness.py SPEC_FILE [runner flags...]` runs
one spec (the driver-kill tests and the fault matrix run it as a subprocess;
`run_subprocess`). Test modules are not importable in Spark's Python workers: this
module ships its code to them by value.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.value_provider import StaticValueProvider

import beam_streams_runner  # noqa: F401 - makes --runner=StreamsSparkRunner known
from beam_streams_runner.regions.fault_points import KILL_AT_ENV, LATE_WRITE_ENV
from tests.faults import pipelines
from tests.faults.injection import Fault, FaultyNaming, Inject, crashing_write_to_redis, file_naming
from tests.faults.pipelines import PIPELINES

SPAN_S = 6
TEXT_PREFIX = 'part'
FILES_TEMP = 'fileio-temp'  # WriteToFiles' temporary directory, next to `out`, not in it
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class SecondRunFailed(AssertionError):
    """The run started again after a driver kill failed."""


# The definition of a run --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Spec:
    """A pipeline, its input and its sink (see the module docstring)."""

    pipeline: str  # 'combine' | 'stateful'
    sink: str  # 'text' | 'files' | 'redis'
    out: str  # a directory (text, files) or a Redis URL (redis)
    start: int  # the first element's timestamp, a whole second
    span_s: int = SPAN_S
    key_prefix: str = ''  # redis: the prefix of the keys written
    fault: Fault | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        fields = json.loads(text)
        if fields['fault'] is not None:
            fields['fault'] = Fault(**fields['fault'])
        return cls(**fields)


def stream_start(lag_s: int = 1) -> int:
    """A whole second `lag_s` seconds ago: one window's elements are there at once."""
    return int(time.time()) - lag_s


# Golden output ------------------------------------------------------------------------------
def golden(spec: Spec) -> dict[str, list[str]]:
    """Each label's lines the sink must hold at the end, sorted (see `pipelines`)."""
    return PIPELINES[spec.pipeline].golden(spec)


def golden_redis(spec: Spec, label: str = '') -> dict[str, str]:
    """The Redis keys (without the prefix) and values a label's sink must hold."""
    return {pipelines.identity(line): line for line in golden(spec)[label]}


# Sinks --------------------------------------------------------------------------------------
def out_of(spec: Spec, label: str = '') -> str:
    """Where a label's sink writes: a directory (text, files) or a Redis key prefix."""
    if spec.sink == 'redis':
        return spec.key_prefix + (f'{label}:' if label else '')
    return f'{spec.out}-{label}' if label else spec.out


def per_line(line: str) -> str:
    return pipelines.identity(line).replace(':', '_')


def to_redis(line: str) -> tuple[str, str]:
    return pipelines.identity(line), line


def write(lines, spec: Spec, label: str, fault: Fault | None, pid: int):
    """Publishes a label's lines through the sink of `spec`; returns what it outputs."""
    step = f'Write-{label}' if label else 'Write'
    out = out_of(spec, label)
    if spec.sink == 'text':
        return lines | step >> beam.io.WriteToText(
            os.path.join(out, TEXT_PREFIX), triggering_frequency=1, num_shards=1)
    if spec.sink == 'files':
        faulty = fault is not None and fault.where == 'publish' and label in ('', 'a')
        temp = os.path.join(os.path.dirname(spec.out), FILES_TEMP + (f'-{label}' if label
                                                                     else ''))
        # A window's panes (P3) go to a destination of their own per line, published once.
        destination = per_line if PIPELINES[spec.pipeline].panes else None
        return lines | step >> fileio.WriteToFiles(
            path=out, shards=1, destination=destination,
            file_naming=FaultyNaming(fault, pid, spec.start) if faulty else file_naming,
            temp_directory=StaticValueProvider(str, temp))
    if spec.sink == 'redis':
        from beam_streams_runner.io import WriteToRedis
        faulty = fault is not None and fault.where == 'publish' and label in ('', 'a')
        sink = (crashing_write_to_redis(spec.out, out, fault, pid, spec.start) if faulty
                else WriteToRedis(spec.out, key_prefix=out))
        return lines | f'ToRedis{label}' >> beam.Map(to_redis) | step >> sink
    raise ValueError(spec.sink)


def hooks(spec: Spec, pid: int) -> pipelines.Hooks:
    """Where `spec`'s fault goes in (see `Fault`) and its sinks."""
    fault = spec.fault

    def at(where: str, step: str):
        if fault is None or fault.where != where:
            return lambda pcoll: pcoll
        return lambda pcoll: pcoll | step >> beam.ParDo(Inject(fault, pid, spec.start))

    def write_label(lines, label: str = '') -> None:
        published = write(lines, spec, label, fault, pid)
        if label in ('', 'a'):
            at('published', 'InjectAtPublished')(published)

    return pipelines.Hooks(at('source', 'InjectAtSource'), at('keyed', 'InjectAtKeyed'),
                           write_label)


def build(p: beam.Pipeline, spec: Spec, driver_pid: int | None = None) -> None:
    """Adds the pipeline of `spec`, its fault and its sinks to `p`."""
    pid = os.getpid() if driver_pid is None else driver_pid
    PIPELINES[spec.pipeline].build(p, spec, hooks(spec, pid))


def pipeline_flags(spec: Spec) -> list[str]:
    """The runner flags the pipeline of `spec` needs (its regions, its period)."""
    return list(PIPELINES[spec.pipeline].flags)


def runner_flags(job: str, store: str, *, period_s: float = 0.5, mode: str = 'blocking',
                 master: str = 'local[2,4]', extra: Sequence[str] = ()) -> list[str]:
    # On a cluster the executors import the tests' pipelines the way a user's modules
    # reach them: from a path given to the executors (the driver's is not theirs).
    shipped = () if master.startswith('local') else (
        f'--spark_conf=spark.executorEnv.PYTHONPATH={REPO}',)
    return ['--streaming', f'--spark_master={master}', f'--job_name={job}', *shipped,
            f'--checkpoint_store={store}', f'--checkpoint_period_s={period_s}',
            f'--checkpoint_mode={mode}', '--target_latency_ms=300', '--bundle_size=50',
            *extra]


def run_in_process(spec: Spec, flags: Sequence[str]) -> None:
    """Runs `spec` on StreamsSparkRunner in this process (the active SparkSession)."""
    from beam_streams_runner import StreamsSparkRunner
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions([*flags, *pipeline_flags(spec)]))
    build(p, spec)
    p.run().wait_until_finish()


def run_subprocess(spec_file: str, flags: Sequence[str], kill_at: str | None = None,
                   timeout: float = 300, late_write: str | None = None
                   ) -> subprocess.CompletedProcess:
    """Runs the spec in `spec_file` as a program of its own, whose driver a fault may
    kill (see `main`); with `kill_at`, `BEAM_STREAMS_RUNNER_KILL_AT=kill_at` in its
    environment, with `late_write`, `BEAM_STREAMS_RUNNER_LATE_WRITE=late_write` (never
    inherited otherwise; see `fault_points`). Each run is a plain new interpreter, with
    its own string hashes and address layout, as every run of a user's command is.
    Raises `subprocess.TimeoutExpired` after `timeout` seconds (the run killed)."""
    env = dict(os.environ)
    for name in (KILL_AT_ENV, LATE_WRITE_ENV, 'PYTHONHASHSEED'):
        env.pop(name, None)
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    if late_write:
        env[LATE_WRITE_ENV] = late_write
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH')]))
    command = [sys.executable, os.path.abspath(__file__), spec_file,
               '--runner=StreamsSparkRunner', *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)


def write_spec(spec: Spec, path: str) -> str:
    with open(path, 'w', encoding='utf-8') as f:
        f.write(spec.to_json())
    return path


def read_spec(path: str) -> Spec:
    with open(path, encoding='utf-8') as f:
        return Spec.from_json(f.read())


def warm_up(spark) -> None:
    """Starts Spark's Python workers (one job of a task per core), so that the first
    epoch of a run does not read the whole stream while they start."""
    sc = spark.sparkContext
    slots = max(2, sc.defaultParallelism)
    sc.parallelize(range(slots), slots).map(lambda x: x).collect()


def task_attempts(spark) -> int:
    """How many times Spark runs a failing task before the job fails (local[N,F]: F,
    local[N]: 1, a cluster: spark.task.maxFailures)."""
    sc = spark.sparkContext
    master = sc.master
    found = re.fullmatch(r'local\[[^,\]]+,\s*(\d+)\]', master)
    if found:
        return int(found.group(1))
    if master.startswith('local'):
        return 1
    return int(sc.getConf().get('spark.task.maxFailures', '4'))


def planned_graph(spec: Spec) -> list[list]:
    """The stages the runner plans for `spec` as the stored graph records them (name,
    kind, sorted steps), sorted (what a restarted driver compares; no Spark)."""
    from beam_streams_runner.runner import plan_pipeline
    p = beam.Pipeline(options=PipelineOptions(['--streaming']))
    build(p, spec, driver_pid=0)
    _, plan, _ = plan_pipeline(p, p.options)
    try:
        return sorted([stage.name, stage.kind, sorted(stage.step_names)]
                      for stage in plan.stages)
    finally:
        plan.close()


def plans_in_a_new_process(specs: Sequence[Spec]) -> subprocess.Popen:
    """Starts `harness.py --plans` (a fresh interpreter, Python's own hash randomization
    and address layout) printing `planned_graph` of each spec as JSON."""
    env = dict(os.environ)
    env.pop('PYTHONHASHSEED', None)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH')]))
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), '--plans',
         json.dumps([spec.to_json() for spec in specs])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def main(argv: list[str]) -> None:
    """`harness.py SPEC_FILE [flags]`: runs the spec; a spec whose `start` is 0 gets one
    (the current second) once Spark and its workers are up, written back to SPEC_FILE, so
    that a run started again with the same file reads the same input."""
    if argv[0] == '--plans':
        specs = [Spec.from_json(text) for text in json.loads(argv[1])]
        print(json.dumps([planned_graph(spec) for spec in specs]))
        return
    spec_file, *flags = argv
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger('beam_streams_runner').setLevel(logging.INFO)  # the resume line
    from beam_streams_runner.driver.spark_session import get_or_create_spark
    spec = read_spec(spec_file)
    options = PipelineOptions([*flags, *pipeline_flags(spec)])
    spark = get_or_create_spark(options, app_name='beam-streams-runner-fault-test')
    spark.sparkContext.setLogLevel('ERROR')
    warm_up(spark)
    if not spec.start:
        # Now, not a second ago: more epochs (and cuts) before a fault in the middle.
        spec = dataclasses.replace(spec, start=stream_start(lag_s=0))
        write_spec(spec, spec_file)
    with beam.Pipeline(options=options) as p:
        build(p, spec, driver_pid=os.getpid())


if __name__ == '__main__':
    main(sys.argv[1:])
else:
    # Spark's Python workers cannot import the tests: ship this module's code by value.
    from apache_beam.internal import cloudpickle as _beam_cloudpickle
    _beam_cloudpickle.register_pickle_by_value(sys.modules[__name__])
