"""One NEXMark run: a query on a runner, in this process or in a child Python, and the
cache of batch reference runs.

`run_query` builds Beam's query (`apache_beam.testing.benchmarks.nexmark.queries.queryN
.load`, unchanged, with the query arguments of Beam's Python launcher) over the
generated events, bounded (`sources.ReadNexmarkEvents`) or unbounded
(`sources.ReadUnboundedNexmarkEvents`, with Beam's `--streaming`), runs it and returns
its sorted canonical lines (`capture`). `run_subprocess` runs one in a child Python
(`python -m benchmarks.nexmark.launcher --run-one ...`), so its wall time includes
start-up and no two runs share a JVM.

Reference runs are batch runs of a reference runner; their output depends only on the
events, the query and the code that makes them, so `cached_run` keeps each in
`.cache/nexmark-references/` (or `$NEXMARK_REFERENCE_CACHE`), keyed by all of those, and
a later comparison over the same events reuses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.nexmark.capture import (
    capture_side_effect,
    format_output_fn,
    lines_file_writer,
)
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.java_runners import check_job_server
from benchmarks.nexmark.native import NATIVE_SPARK, REPO_ROOT, run_logged, run_native_spark
from benchmarks.nexmark.verdicts import RunResult, first_line

# Every query runs with this: Q11's trigger is "unsafe" for Beam's checks.
COMMON_ARGS = ('--allow_unsafe_triggers',)
# The code a reference run's output depends on besides Beam: the events and the capture.
_OUTPUT_MODULES = ('capture', 'config', 'early_bids', 'generator', 'java_random',
                   'query6_corrected', 'sources')


def make_runner(name: str, args: Sequence[str] = ()) -> Any:
    """A runner instance (StreamsSparkRunner, dotted class) or a name Beam knows.

    A Java-backed runner (FlinkRunner, SparkRunner, PortableRunner) whose job server,
    jar or master `args` leave out of reach raises `JobServerUnavailable` here, naming
    what is missing, instead of Beam's waiting minutes for it (`java_runners`).
    """
    check_job_server(name, args)
    if name == 'StreamsSparkRunner':
        from beam_streams_runner import StreamsSparkRunner
        return StreamsSparkRunner()
    if '.' in name:
        module, _, cls = name.rpartition('.')
        return getattr(importlib.import_module(module), cls)()
    return name


def run_query(query: int, runner: Any, config: NexmarkConfig,
              args: Sequence[str] = (), work_dir: str | None = None,
              streaming: bool = False, rate: float | None = None,
              corrected_q6: bool = False, without_early_bids: bool = False,
              tap: Callable[[Any], Any] | None = None,
              input_path: str | None = None) -> RunResult:
    """Run Beam's query `query` on `runner` in this process; capture its sorted output.

    `streaming`: read the unbounded source (at `rate` events/s, None = as fast as
    possible) and run with Beam's `--streaming` option. `corrected_q6`: Q6 is
    `query6_corrected` (Beam's query fails on every runner). `without_early_bids`: the
    events lose the bids whose window ends before their auction is created
    (`early_bids`). `tap`, if given, is applied to the query's output PCollection too
    (e.g. a latency sink). `input_path`: a batch run reads the events from that
    JSON-lines file (`event_file`) instead of generating them. Failures (e.g. Beam's Q6
    negating a Timestamp, a runner that cannot stream) are caught and reported in the
    result.
    """
    runner_name = runner if isinstance(runner, str) else type(runner).__name__
    result = RunResult(query, runner_name, config.num_events, ok=False)
    own_dir = work_dir is None
    work_dir = work_dir or tempfile.mkdtemp(prefix=f'nexmark-q{query}-')
    os.makedirs(work_dir, exist_ok=True)
    prefix = os.path.join(work_dir, 'part')
    try:
        _run_pipeline(query, runner, config, args, prefix, streaming, rate, corrected_q6,
                      without_early_bids, tap, input_path)
        lines: list[str] = []
        for path in sorted(glob.glob(prefix + '*')):
            with open(path, encoding='utf-8') as f:
                lines.extend(line.rstrip('\n') for line in f)
        result.lines = sorted(lines)
        result.output_count = len(lines)
        result.ok = True
    except Exception as e:  # noqa: BLE001 - any failure of the query is a result
        result.error = f'{type(e).__name__}: {first_line(str(e))}'
    finally:
        if own_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    return result


def _run_pipeline(query: int, runner: Any, config: NexmarkConfig, args: Sequence[str],
                  prefix: str, streaming: bool, rate: float | None, corrected_q6: bool,
                  without_early_bids: bool, tap: Callable[[Any], Any] | None,
                  input_path: str | None = None) -> None:
    """Build and run the pipeline of `run_query`, writing its lines to `prefix*`."""
    import apache_beam as beam
    from apache_beam.io import WriteToText
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.benchmarks.nexmark import nexmark_util
    from apache_beam.transforms.window import GlobalWindows

    from benchmarks.nexmark.early_bids import ExcludeEarlyBids
    from benchmarks.nexmark.event_file import ReadNexmarkEventsFromFile
    from benchmarks.nexmark.sources import ReadNexmarkEvents, ReadUnboundedNexmarkEvents

    nexmark_util.setup_coder()
    module = importlib.import_module(
        'benchmarks.nexmark.query6_corrected' if query == 6 and corrected_q6
        else f'apache_beam.testing.benchmarks.nexmark.queries.query{query}')
    streaming_args = ['--streaming'] if streaming else []
    options = PipelineOptions(list(COMMON_ARGS) + streaming_args + list(args))
    with beam.Pipeline(runner=runner, options=options) as p:
        if streaming:
            events = p | 'Events' >> ReadUnboundedNexmarkEvents(config, rate)
        elif input_path is not None:
            events = p | 'Events' >> ReadNexmarkEventsFromFile(input_path)
        else:
            events = p | 'Events' >> ReadNexmarkEvents(config)
        if without_early_bids:
            events = events | 'ExcludeEarlyBids' >> beam.ParDo(ExcludeEarlyBids(config))
        output = module.load(events, config.query_args(), options)
        if tap is not None:
            tap(output)
        lines_pc = capture_side_effect(query, p)
        if lines_pc is None:
            lines_pc = output | 'Canonical' >> beam.ParDo(format_output_fn())
        if streaming:
            _ = lines_pc | 'Write' >> beam.ParDo(lines_file_writer(prefix))
        else:
            _ = (lines_pc
                 | 'Global' >> beam.WindowInto(GlobalWindows())
                 | 'Write' >> WriteToText(prefix))


def run_one(argv: Sequence[str]) -> int:
    """The `--run-one` child: run one query, write its lines and a JSON result."""
    parser = argparse.ArgumentParser(prog='launcher --run-one')
    parser.add_argument('--run-one', action='store_true')
    parser.add_argument('--query', type=int, required=True)
    parser.add_argument('--runner', required=True)
    parser.add_argument('--result', required=True, help='JSON result file')
    parser.add_argument('--lines', required=True, help='sorted output lines file')
    parser.add_argument('--streaming', action='store_true')
    parser.add_argument('--rate', type=float, default=None)
    parser.add_argument('--corrected-q6', action='store_true')
    parser.add_argument('--without-early-bids', action='store_true')
    parser.add_argument('--input', default=None, help="the events' JSON-lines file")
    known, rest = parser.parse_known_args(argv)
    config, rest = NexmarkConfig.from_args(rest)
    try:
        if known.runner == NATIVE_SPARK:
            result = run_native_spark(known.query, config, rest, input_path=known.input)
        else:
            runner = make_runner(known.runner, rest)
            result = run_query(known.query, runner, config, rest,
                               streaming=known.streaming, rate=known.rate,
                               corrected_q6=known.corrected_q6,
                               without_early_bids=known.without_early_bids,
                               input_path=known.input)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        result = RunResult(known.query, known.runner, config.num_events, ok=False,
                           error=f'{type(e).__name__}: {first_line(str(e))}')
    result.runner = known.runner
    _write_result(result, known.result, known.lines)
    if result.error:
        print(f'Q{known.query} failed: {result.error}', file=sys.stderr)
    return 0


def _write_result(result: RunResult, result_path: str, lines_path: str) -> None:
    with open(lines_path, 'w', encoding='utf-8') as f:
        f.writelines(line + '\n' for line in result.lines)
    payload = dataclasses.asdict(result)
    payload.pop('lines')
    with open(result_path, 'w', encoding='utf-8') as f:
        json.dump(payload, f)


def _read_result(result_path: str, lines_path: str) -> RunResult:
    with open(result_path, encoding='utf-8') as f:
        result = RunResult(**json.load(f))
    if result.ok:
        with open(lines_path, encoding='utf-8') as f:
            result.lines = [line.rstrip('\n') for line in f]
    return result


def run_subprocess(query: int, runner: str, config_args: Sequence[str],
                   runner_args: Sequence[str], out_dir: str, events: int,
                   timeout_s: float, tag: str | None = None) -> RunResult:
    """Run one (query, runner) in a child Python; wall time measured around it. Its
    lines go to `out_dir/outputs/<tag>.txt`, its log to `out_dir/logs/<tag>.log`."""
    tag = tag or f'q{query}-{runner.rsplit(".", 1)[-1]}'
    lines_path = os.path.join(out_dir, 'outputs', f'{tag}.txt')
    result_path = os.path.join(out_dir, 'logs', f'{tag}.json')
    log_path = os.path.join(out_dir, 'logs', f'{tag}.log')
    for path in (lines_path, result_path):
        if os.path.exists(path):
            os.remove(path)
    cmd = [sys.executable, '-m', 'benchmarks.nexmark.launcher', '--run-one',
           f'--query={query}', f'--runner={runner}', f'--result={result_path}',
           f'--lines={lines_path}', *config_args, *runner_args]
    start = time.perf_counter()
    try:
        run_logged(cmd, log_path, timeout_s)
    except subprocess.TimeoutExpired:
        return RunResult(query, runner, events, ok=False,
                         error=f'timeout after {timeout_s:.0f} s',
                         wall_s=time.perf_counter() - start)
    wall = time.perf_counter() - start
    if not os.path.exists(result_path):
        return RunResult(query, runner, events, ok=False, wall_s=wall,
                         error=f'child process died (see {log_path})')
    result = _read_result(result_path, lines_path)
    result.wall_s = wall
    return result


# ---------------------------------------------------------------- reference cache


def ship_benchmarks(runner_args: Sequence[str], out_dir: str) -> list[str]:
    """`runner_args` with this package shipped to a cluster's executors the PySpark way
    (a zip of `benchmarks/` added to `spark.submit.pyFiles`): the queries' sources and
    output capture are functions of this package, which executors on other hosts lack.
    A local master's workers import it from the driver's path and need nothing."""
    masters = [a.partition('=')[2] for a in runner_args if a.startswith('--spark_master=')]
    if not masters or masters[-1].startswith('local'):
        return list(runner_args)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = os.path.join(out_dir, 'benchmarks.zip')
    with zipfile.ZipFile(archive, 'w', zipfile.ZIP_DEFLATED) as zipped:
        for path in glob.glob(os.path.join(package, '**', '*.py'), recursive=True):
            zipped.write(path, os.path.relpath(path, os.path.dirname(package)))
    given = [a.partition('=')[2].partition('=')[2] for a in runner_args
             if a.startswith('--spark_conf=spark.submit.pyFiles=')]
    files = ','.join([*given, archive])
    return [*runner_args, f'--spark_conf=spark.submit.pyFiles={files}']


def reference_cache_dir() -> str:
    """Where reference runs are kept: `$NEXMARK_REFERENCE_CACHE` or the repository's
    `.cache/nexmark-references`."""
    return (os.environ.get('NEXMARK_REFERENCE_CACHE')
            or os.path.join(REPO_ROOT, '.cache', 'nexmark-references'))


def reference_key(query: int, runner: str, config: NexmarkConfig,
                  runner_args: Sequence[str]) -> str:
    """The cache key of a batch reference run: everything its output depends on."""
    from importlib import metadata
    here = os.path.dirname(os.path.abspath(__file__))
    code = hashlib.sha256()
    for name in _OUTPUT_MODULES:
        with open(os.path.join(here, f'{name}.py'), 'rb') as f:
            code.update(f.read())
    fields = {
        'query': query, 'runner': runner, 'args': sorted(runner_args),
        'config': dataclasses.asdict(config), 'apache-beam': metadata.version('apache-beam'),
        'code': code.hexdigest(),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()
                          ).hexdigest()[:24]


def cached_run(query: int, runner: str, config: NexmarkConfig, config_args: Sequence[str],
               runner_args: Sequence[str], out_dir: str, timeout_s: float,
               tag: str) -> tuple[RunResult, bool]:
    """A batch reference run from the cache, or run now and cached; (result, from the
    cache). A run that timed out or whose child died is not kept."""
    entry = os.path.join(reference_cache_dir(),
                         reference_key(query, runner, config, runner_args))
    result_path, lines_path = entry + '.json', entry + '.txt'
    if os.path.exists(result_path) and os.path.exists(lines_path):
        result = _read_result(result_path, lines_path)
        # The launcher's outputs folder holds every compared output, cached or not.
        shutil.copyfile(lines_path, os.path.join(out_dir, 'outputs', f'{tag}.txt'))
        return result, True
    result = run_subprocess(query, runner, config_args, runner_args, out_dir,
                            config.num_events, timeout_s, tag)
    if result.ok or not result.error.startswith(('timeout', 'child process died')):
        os.makedirs(reference_cache_dir(), exist_ok=True)
        _write_result(result, result_path + '.tmp', lines_path + '.tmp')
        # Lines first: a result file names a complete entry.
        os.replace(lines_path + '.tmp', lines_path)
        os.replace(result_path + '.tmp', result_path)
    return result, False
