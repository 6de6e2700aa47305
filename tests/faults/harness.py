"""The fault-injection harness: pipelines, faults, golden outputs and output readers.

Design sections 8, 11 and 12. A fault test runs one small streaming pipeline with
consistent regions on (`--checkpoint_period_s` well under a second), injects one
fault in the middle of it, and compares what the pipeline's exactly-once sink
published with the golden result computed here from the definition of the input:
nothing lost, nothing duplicated, nothing half-written left behind.

The input: a `PeriodicImpulse` from `start` (a whole second, one second ago: the
first window's elements are there at once, the others come in real time) over
`span_s` seconds, one element every 10 ms. Element i has the timestamp
`start + i / 100` (exact in microseconds), the key `i % KEYS` and falls in the
1-second fixed window `i // 100`. Two pipelines aggregate it per key and window:

* `combine`: `CombinePerKey` of (count, sum of i);
* `stateful`: a stateful DoFn (a `ReadModifyWriteState` count, a `BagState` of the
  elements, an event-time timer at the end of the window) emitting the count, the
  number of distinct elements and their sum: state duplicated by a replay shows as
  count != distinct, lost state as a wrong sum.

Each emits one line per (window, key), `w<window start> k<key> n<count>
s<sum> [d<distinct>]`, through one publishing sink:

* `text`: `WriteToText(out/part, triggering_frequency=1, num_shards=1)` (one final
  file per window, its temporary directory under `out/`);
* `files`: `fileio.WriteToFiles(out, shards=1)` (its temporary files elsewhere, so
  that `out` holds only final files);
* `redis`: `beam_streams_runner.io.WriteToRedis` (a key per window and key).

A fault (`Fault`) is injected at one place: at element `at` of the source
(`where='source'`: before the shuffle), at the aggregate of window `at // 100` and key
0 (`'keyed'`: in the stage after the shuffle), inside WriteToFiles' publishing step
while it names window `at // 100`'s file (`'publish'`), or on what the file sink
outputs once it has published that window (`'published'`). Kinds: `kill_worker` (the
Python worker SIGKILLs itself), `raise` (an exception), `kill_driver` (SIGKILL to the
driver's pid); `times` faults in a row, counted in marker files, so that the replay
after them passes. `check_exact` compares the sink with the golden output,
`check_subset` checks that a run that failed published golden lines only, each once.

The module is also a program: `python harness.py SPEC_FILE [runner flags...]` runs
one spec (the driver-kill tests run it as a subprocess, twice; `run_subprocess`).
Test modules are not importable in Spark's Python workers: this module ships its
code to them by value.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.value_provider import StaticValueProvider
from apache_beam.transforms import userstate, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.timeutil import TimeDomain

import beam_streams_runner  # noqa: F401 - makes --runner=StreamsSparkRunner known
from beam_streams_runner.regions.fault_points import KILL_AT_ENV

INTERVAL = 0.01
PER_SECOND = 100  # elements per 1-second window
KEYS = 3
SPAN_S = 6
TEXT_PREFIX = 'part'
FILES_TEMP = 'fileio-temp'  # WriteToFiles' temporary directory, next to `out`, not in it
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class SecondRunFailed(AssertionError):
    """The run started again after a driver kill failed."""


# The definition of a run --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: `kind` at element/aggregate `at`, `times` in a row (see the docstring)."""

    kind: str  # 'kill_worker' | 'raise' | 'kill_driver'
    marker: str  # path prefix of the marker files counting the faults done
    at: int = 250
    where: str = 'source'  # 'source' | 'keyed' | 'publish' (files) | 'published'
    times: int = 1

    def done(self) -> int:
        return len(glob.glob(self.marker + '.*'))


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


def elements(span_s: int) -> int:
    """How many elements `PeriodicImpulse` emits over `span_s` seconds (as Beam counts)."""
    return math.ceil(span_s * 1_000_000 / round(INTERVAL * 1_000_000))


# Golden output ------------------------------------------------------------------------------
def golden_aggregates(spec: Spec) -> dict[tuple[int, int], tuple[int, int]]:
    """(window start in seconds, key) -> (count, sum of the element indices)."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for i in range(elements(spec.span_s)):
        key = (spec.start + i // PER_SECOND, i % KEYS)
        count, total = out.get(key, (0, 0))
        out[key] = (count + 1, total + i)
    return out


def format_line(pipeline: str, window_start: int, key: int, count: int, total: int,
                distinct: int | None = None) -> str:
    line = f'w{window_start} k{key} n{count} s{total}'
    return line if pipeline == 'combine' else f'{line} d{distinct}'


def golden_lines(spec: Spec) -> list[str]:
    """The lines the sink must hold at the end: one per (window, key), sorted."""
    return sorted(format_line(spec.pipeline, w, k, n, s, n)
                  for (w, k), (n, s) in golden_aggregates(spec).items())


def golden_redis(spec: Spec) -> dict[str, str]:
    """The Redis keys (without the prefix) and values the sink must hold at the end."""
    return {f'w{w}:k{k}': format_line(spec.pipeline, w, k, n, s, n)
            for (w, k), (n, s) in golden_aggregates(spec).items()}


# Pipelines ----------------------------------------------------------------------------------
class Index(beam.DoFn):
    """The impulse's timestamp -> (key, element index)."""

    def __init__(self, start: int) -> None:
        self.start = start

    def process(self, t):
        i = round((float(t) - self.start) * PER_SECOND)
        yield i % KEYS, i


def inject(fault: Fault, driver_pid: int, what: object) -> None:
    """Does `fault` unless it was done `times` times already (see `Fault`)."""
    done = fault.done()
    if done >= fault.times:
        return
    with open(f'{fault.marker}.{done}', 'w') as f:
        f.write(f'{os.getpid()} {time.time()} {what!r}\n')
    if fault.kind == 'kill_worker':
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == 'kill_driver':
        os.kill(driver_pid, signal.SIGKILL)
    elif fault.kind == 'raise':
        raise RuntimeError(f'injected fault {done + 1} at {what!r}')
    else:
        raise ValueError(fault.kind)


class Inject(beam.DoFn):
    """Injects `fault` at its element (see `Fault`); passes every element on.

    At the source, the element is (key, index) and the fault hits index `at`; after
    the aggregate ('keyed': a line; 'published': what the sink outputs once it has
    published a window) it hits window `at // 100` (and key 0 for a line)."""

    def __init__(self, fault: Fault, driver_pid: int, start: int) -> None:
        self.fault = fault
        self.driver_pid = driver_pid
        self.window = start + fault.at // PER_SECOND

    def process(self, element, w=beam.DoFn.WindowParam):
        fault = self.fault
        if fault.where == 'source':
            hit = element[1] == fault.at
        elif fault.where == 'keyed':
            hit = element.startswith(f'w{self.window} k0 ')
        else:
            hit = w.start.micros // 1_000_000 == self.window
        if hit:
            inject(fault, self.driver_pid, element)
        yield element


class FaultyNaming:
    """WriteToFiles' file naming (the default one), injecting `fault` when it names a
    file of window `at // 100`: inside the publishing step, before its rename."""

    def __init__(self, fault: Fault, driver_pid: int, start: int) -> None:
        self.fault = fault
        self.driver_pid = driver_pid
        self.window = start + fault.at // PER_SECOND
        self.naming = fileio.default_file_naming('output')

    def __call__(self, window, pane, shard_index, total_shards, compression, destination):
        if window.start.micros // 1_000_000 == self.window:
            inject(self.fault, self.driver_pid, f'naming {window}')
        return self.naming(window, pane, shard_index, total_shards, compression, destination)


class CountAndSum(beam.CombineFn):
    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, i):
        return acc[0] + 1, acc[1] + i

    def merge_accumulators(self, accs):
        accs = list(accs)
        return sum(a[0] for a in accs), sum(a[1] for a in accs)

    def extract_output(self, acc):
        return acc


class FormatCombined(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam):
        key, (count, total) = kv
        yield format_line('combine', w.start.micros // 1_000_000, key, count, total)


class CountInState(beam.DoFn):
    """Counts a key's elements in its window in state; emits at the window's end."""

    COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
    SEEN = userstate.BagStateSpec('seen', VarIntCoder())
    FLUSH = userstate.TimerSpec('flush', TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, count=beam.DoFn.StateParam(COUNT),
                seen=beam.DoFn.StateParam(SEEN), flush=beam.DoFn.TimerParam(FLUSH)):
        count.write((count.read() or 0) + 1)
        seen.add(kv[1])
        flush.set(w.max_timestamp())

    @userstate.on_timer(FLUSH)
    def emit(self, key=beam.DoFn.KeyParam, w=beam.DoFn.WindowParam,
             count=beam.DoFn.StateParam(COUNT), seen=beam.DoFn.StateParam(SEEN)):
        items = list(seen.read())
        yield format_line('stateful', w.start.micros // 1_000_000, key, count.read() or 0,
                          sum(items), len(set(items)))
        count.clear()
        seen.clear()


def to_redis(line: str) -> tuple[str, str]:
    w, k = line.split()[:2]
    return f'{w}:{k}', line


def build(p: beam.Pipeline, spec: Spec, driver_pid: int | None = None) -> None:
    """Adds the pipeline of `spec` to `p`."""
    fault = spec.fault
    pid = os.getpid() if driver_pid is None else driver_pid
    keyed = (p
             | 'Impulse' >> PeriodicImpulse(spec.start, spec.start + spec.span_s, INTERVAL)
             | 'Index' >> beam.ParDo(Index(spec.start)))
    if fault is not None and fault.where == 'source':
        keyed = keyed | 'InjectAtSource' >> beam.ParDo(Inject(fault, pid, spec.start))
    keyed = keyed | 'Window' >> beam.WindowInto(window.FixedWindows(1))
    if spec.pipeline == 'combine':
        lines = (keyed
                 | 'Count' >> beam.CombinePerKey(CountAndSum())
                 | 'Format' >> beam.ParDo(FormatCombined()))
    elif spec.pipeline == 'stateful':
        lines = keyed | 'CountInState' >> beam.ParDo(CountInState())
    else:
        raise ValueError(spec.pipeline)
    if fault is not None and fault.where == 'keyed':
        lines = lines | 'InjectAtKeyed' >> beam.ParDo(Inject(fault, pid, spec.start))
    if spec.sink == 'text':
        published = lines | 'Write' >> beam.io.WriteToText(
            os.path.join(spec.out, TEXT_PREFIX), triggering_frequency=1, num_shards=1)
    elif spec.sink == 'files':
        naming = (FaultyNaming(fault, pid, spec.start)
                  if fault is not None and fault.where == 'publish' else None)
        published = lines | 'Write' >> fileio.WriteToFiles(
            path=spec.out, shards=1, file_naming=naming,
            temp_directory=StaticValueProvider(
                str, os.path.join(os.path.dirname(spec.out), FILES_TEMP)))
    elif spec.sink == 'redis':
        from beam_streams_runner.io import WriteToRedis
        published = (lines
                     | 'ToRedis' >> beam.Map(to_redis)
                     | 'Write' >> WriteToRedis(spec.out, key_prefix=spec.key_prefix))
    else:
        raise ValueError(spec.sink)
    if fault is not None and fault.where == 'published':
        published | 'InjectAtPublished' >> beam.ParDo(Inject(fault, pid, spec.start))


def runner_flags(job: str, store: str, *, period_s: float = 0.5, mode: str = 'blocking',
                 master: str = 'local[2,4]', extra: Sequence[str] = ()) -> list[str]:
    return ['--streaming', f'--spark_master={master}', f'--job_name={job}',
            f'--checkpoint_store={store}', f'--checkpoint_period_s={period_s}',
            f'--checkpoint_mode={mode}', '--target_latency_ms=300', '--bundle_size=50',
            *extra]


def run_in_process(spec: Spec, flags: Sequence[str]) -> None:
    """Runs `spec` on StreamsSparkRunner in this process (the active SparkSession)."""
    from beam_streams_runner import StreamsSparkRunner
    p = beam.Pipeline(runner=StreamsSparkRunner(), options=PipelineOptions(list(flags)))
    build(p, spec)
    p.run().wait_until_finish()


def run_subprocess(spec_file: str, flags: Sequence[str], kill_at: str | None = None,
                   timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs the spec in `spec_file` as a program of its own, whose driver a fault may
    kill (see `main`); with `kill_at`, `BEAM_STREAMS_RUNNER_KILL_AT=kill_at` in its
    environment (never inherited otherwise). Each run is a plain new interpreter, with
    its own string hashes and address layout, as every run of a user's command is."""
    env = dict(os.environ)
    env.pop(KILL_AT_ENV, None)
    env.pop('PYTHONHASHSEED', None)
    if kill_at:
        env[KILL_AT_ENV] = kill_at
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


# Output readers -----------------------------------------------------------------------------
# WriteToText's final names for a window: part-[1795567632.0, 1795567633.0)-00000-of-00001
_TEXT_FINAL = re.compile(re.escape(TEXT_PREFIX) + r'-\[[0-9.]+, [0-9.]+\)-00000-of-00001$')
# WriteToFiles' final names: output-<start>-<end>-<shard>-of-<shards>
_FILES_FINAL = re.compile(r'output-[0-9T:.-]+-[0-9T:.-]+-\d{5}-of-\d{5}$')


@dataclasses.dataclass
class FileOutput:
    lines: list[str]  # every line of every final file, sorted
    finals: list[str]  # the final files' names
    others: list[str]  # anything else under the output directory (temporary leftovers)


def read_files(spec: Spec) -> FileOutput:
    """What a file sink left in `spec.out`: final files' lines, and everything else."""
    pattern = _TEXT_FINAL if spec.sink == 'text' else _FILES_FINAL
    lines: list[str] = []
    finals: list[str] = []
    others: list[str] = []
    if not os.path.isdir(spec.out):
        return FileOutput([], [], [])
    for root, dirs, files in os.walk(spec.out):
        for name in dirs:
            others.append(os.path.relpath(os.path.join(root, name), spec.out) + '/')
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, spec.out)
            if root == spec.out and pattern.match(name):
                finals.append(relative)
                with open(path, encoding='utf-8') as f:
                    lines.extend(line for line in f.read().splitlines())
            else:
                others.append(relative)
    return FileOutput(sorted(lines), sorted(finals), sorted(others))


def read_redis(spec: Spec, client) -> dict[str, str]:
    """The sink's keys (without the prefix) -> their values."""
    keys = client.keys(spec.key_prefix.encode() + b'*')
    values = client.mget(keys) if keys else []
    return {key.decode()[len(spec.key_prefix):]: value.decode()
            for key, value in zip(keys, values, strict=True)}


@dataclasses.dataclass
class Comparison:
    """A sink's output against the golden one: results missing, published more than
    once, or that no golden run has, and files left behind, each also in words."""

    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    leftovers: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems


def compare(spec: Spec, redis_client=None) -> Comparison:
    """The sink's output against the golden output (see `Comparison`): a window's
    final file written twice shows as an extra file or line, a temporary file of a
    failed attempt as a leftover, an empty output as everything lost."""
    if spec.sink == 'redis':
        got, expected = read_redis(spec, redis_client), golden_redis(spec)
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        wrong = sorted((k, got[k], expected[k]) for k in set(got) & set(expected)
                       if got[k] != expected[k])
        result = Comparison(lost=len(missing), wrong=len(extra) + len(wrong))
        if missing or extra or wrong:
            result.problems.append(
                f'Redis output differs from the golden one: missing {missing}, extra '
                f'{extra}, wrong (key, got, expected) {wrong}')
        return result
    out = read_files(spec)
    expected = golden_lines(spec)
    g, e = collections.Counter(out.lines), collections.Counter(expected)
    surplus = g - e
    result = Comparison(lost=sum((e - g).values()),
                        duplicated=sum(n for line, n in surplus.items() if line in e),
                        wrong=sum(n for line, n in surplus.items() if line not in e),
                        leftovers=len(out.others))
    if not out.lines:
        result.problems.append(f'the sink published nothing (left: {out.others})')
    elif out.lines != expected:
        result.problems.append(
            f'{len(out.lines)} lines, {len(expected)} expected; missing '
            f'{sorted((e - g).elements())}, extra or duplicated {sorted(surplus.elements())}')
    if out.lines and len(out.finals) != spec.span_s:
        result.duplicated += max(0, len(out.finals) - spec.span_s)
        result.problems.append(
            f'{len(out.finals)} final files for {spec.span_s} windows: {out.finals}')
    if out.others:
        result.problems.append(f'left in the output directory: {out.others}')
    return result


def check_exact(spec: Spec, redis_client=None) -> None:
    """Asserts the sink holds exactly the golden output (see `compare`)."""
    problems = compare(spec, redis_client).problems
    assert not problems, '; '.join(problems)


def check_subset(spec: Spec, redis_client=None) -> None:
    """Asserts that what the sink holds is a part of the golden output without
    duplicates (a run that failed published only what its cuts covered)."""
    result = compare(spec, redis_client)
    assert not (result.duplicated or result.wrong), (
        f'published twice, or what no golden run has: {result.problems}')


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
    options = PipelineOptions(flags)
    spark = get_or_create_spark(options, app_name='beam-streams-runner-fault-test')
    spark.sparkContext.setLogLevel('ERROR')
    warm_up(spark)
    spec = read_spec(spec_file)
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
