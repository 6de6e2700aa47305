"""NEXMark launcher: Beam's Python queries on any runner, timed, with a cross-runner check.

    python -m benchmarks.nexmark --runner=StreamsSparkRunner --query=0-12 --events=10000 \\
           --compare DirectRunner --out bench-out/ [--spark_master=local[2] ...]

For each query of `--query` it runs Beam's own implementation
(`apache_beam.testing.benchmarks.nexmark.queries.queryN.load`, unchanged, with the
query arguments of Beam's Python launcher) over the generated events
(`sources.ReadNexmarkEvents`) on the runner under test and on the reference runner
(`--compare`). Every (query, runner) run is its own subprocess
(`python -m benchmarks.nexmark.launcher --run-one ...`), so the wall time includes
start-up and no two runs share a JVM. Options the launcher does not know (e.g.
`--spark_master`, `--bundle_size`) go to the runner under test only.

Output capture: every output element is written (`WriteToText`, all shards read back)
as one line `canonical(element) TAB window TAB timestamp`, where `canonical` does not
depend on the order of unordered parts (dicts by key, lists/sets sorted, model objects by
their fields); the lines are sorted. Two runs are equal when their sorted lines are.
Q12 fires on processing time, so its panes differ between runs: it is compared on its
deterministic part, the total bid count per bidder over all panes (`deterministic_lines`).

Streaming (`--streaming [--rate=N]`): the queries read the unbounded source
(`sources.ReadUnboundedNexmarkEvents`, N events/s over all its parts or as fast as
possible) and every run gets Beam's `--streaming` option; a finite `--events` ends the
stream, so the run ends. The output is captured by a DoFn appending each bundle's lines
to a file of its own instance (`_lines_file_writer`; no GroupByKey: Beam refuses one on
an unbounded global-window collection with the default trigger). Q3's panes
(`AfterCount(30)`) then depend on arrival order: when its outputs differ, both are
checked against the full join (`arrival_order_verdict`). The BundleBasedDirectRunner
cannot run the unbounded source at all, so as a reference (Q4/Q6/Q9, or `--compare
BundleBasedDirectRunner`) it runs in batch over the same events (`batch_reference`).

`--corrected-q6`: Q6 runs `query6_corrected` (Beam's query with its `Timestamp` negation
fixed) instead of Beam's, which fails on every runner. In streaming its accumulating
panes are checked against the batch reference with `accumulating_panes_verdict`.

The parent prints a progress line per run and a table at the end, and writes
`OUT/results.csv`, `OUT/report.md`, `OUT/nexmark.png` (see `report`), the sorted outputs
(`OUT/outputs/`) and each run's log (`OUT/logs/`).
"""

from __future__ import annotations

import argparse
import ast
import collections
import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.nexmark.config import NexmarkConfig

ALL_QUERIES = tuple(range(13))
# The DirectRunner (FnApiRunner) cannot run the custom merging window of Q4/Q6/Q9.
MERGING_WINDOW_QUERIES = (4, 6, 9)
PROCESSING_TIME_QUERIES = (12,)
RUNNER_ALIASES = ('StreamsSparkRunner', 'DirectRunner', 'BundleBasedDirectRunner',
                  'DaskRunner')
# Every query runs with this: Q11's trigger is "unsafe" for Beam's checks.
COMMON_ARGS = ('--allow_unsafe_triggers',)
ORACLE = 'generator oracle'
# `--native spark`: the hand-written PySpark programs of `spark_baselines`, as this runner.
NATIVE_SPARK = 'SparkNative'
NATIVE_QUERIES = (0, 1, 2, 3, 5, 7)
# `--native flink`: the PyFlink programs of `flink_baselines`, run by the python of a
# separate virtualenv (PyFlink pins an old apache-beam); FLINK_VENV overrides its place.
NATIVE_FLINK = 'FlinkNative'
FLINK_SETUP = 'bash benchmarks/nexmark/setup_flink_venv.sh'
# Queries whose streaming output depends on the order elements arrive in (AfterCount panes).
ARRIVAL_ORDER_QUERIES = (3,)
# Queries whose streaming output has a line per ACCUMULATING pane (Q6, `--corrected-q6`).
ACCUMULATING_PANE_QUERIES = (6,)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE_RUNNERS = {'spark': NATIVE_SPARK, 'flink': NATIVE_FLINK}


def flink_python() -> str:
    """The python of the PyFlink virtualenv (`$FLINK_VENV` or `<repo>/.venv-flink`)."""
    venv = os.environ.get('FLINK_VENV') or os.path.join(REPO_ROOT, '.venv-flink')
    return os.path.join(venv, 'bin', 'python')


# ---------------------------------------------------------------- parsing


def parse_queries(spec: str) -> list[int]:
    """`'0-3,5'` -> `[0, 1, 2, 3, 5]` (sorted, without duplicates)."""
    queries: set[int] = set()
    for part in spec.replace(' ', '').split(','):
        if not part:
            continue
        low, sep, high = part.partition('-')
        if sep:
            if int(low) > int(high):
                raise ValueError(f'empty query range: {part!r}')
            queries.update(range(int(low), int(high) + 1))
        else:
            queries.add(int(low))
    if not queries:
        raise ValueError(f'no query in {spec!r}')
    unknown = sorted(q for q in queries if q not in ALL_QUERIES)
    if unknown:
        raise ValueError(f'no such NEXMark queries: {unknown} (known: 0-12)')
    return sorted(queries)


def reference_for(query: int, reference: str) -> str:
    """The reference runner of `query`: BundleBasedDirectRunner for Q4/Q6/Q9 if DirectRunner.

    (Q6 fails everywhere, but on the BundleBasedDirectRunner with its own reason.)
    """
    if reference == 'DirectRunner' and query in MERGING_WINDOW_QUERIES:
        return 'BundleBasedDirectRunner'
    return reference


def batch_reference(reference: str, streaming: bool) -> bool:
    """Whether the reference `reference` runs in batch although the tested run streams:
    the BundleBasedDirectRunner cannot run the unbounded source (its splittable DoFn fails
    with `... was not replaced as expected`), so it reads the bounded one, same events."""
    return streaming and reference == 'BundleBasedDirectRunner'


def make_runner(name: str) -> Any:
    """A runner instance (StreamsSparkRunner, dotted class) or a name Beam knows."""
    if name == 'StreamsSparkRunner':
        from beam_streams_runner import StreamsSparkRunner
        return StreamsSparkRunner()
    if '.' in name:
        module, _, cls = name.rpartition('.')
        return getattr(importlib.import_module(module), cls)()
    return name


# ---------------------------------------------------------------- canonical form


def canonical(value: Any) -> str:
    """A text form of `value` independent of the order of its unordered parts.

    Dicts are sorted by key (and stay `ast.literal_eval`-able when their items are
    plain), lists, sets and Beam's lazy iterables are sorted, tuples keep their order,
    NEXMark model objects (Person, Auction, Bid, AuctionBid, ...) print as
    `Class(field=value, ...)` with their fields sorted.
    """
    if isinstance(value, dict):
        items = sorted((canonical(k), canonical(v)) for k, v in value.items())
        return '{' + ', '.join(f'{k}: {v}' for k, v in items) + '}'
    if isinstance(value, tuple) and not hasattr(value, '_fields'):
        parts = [canonical(v) for v in value]
        return '(' + ', '.join(parts) + (',)' if len(parts) == 1 else ')')
    if isinstance(value, (list, set, frozenset)) or _is_beam_iterable(value):
        return '[' + ', '.join(sorted(canonical(v) for v in value)) + ']'
    if _is_model(value):
        fields = ', '.join(f'{k}={canonical(v)}' for k, v in sorted(vars(value).items()))
        return f'{type(value).__name__}({fields})'
    return repr(value)


def _is_model(value: Any) -> bool:
    module = type(value).__module__ or ''
    return module.startswith('apache_beam.testing.benchmarks.nexmark') and hasattr(
        value, '__dict__')


def _is_beam_iterable(value: Any) -> bool:
    # GroupByKey values may be a lazy iterable (e.g. `_UnwindowedValues`).
    return (not isinstance(value, (str, bytes, dict, tuple))
            and hasattr(value, '__iter__') and not hasattr(value, '__next__')
            and (type(value).__module__ or '').startswith('apache_beam'))


def output_line(element: Any, window: Any, timestamp: Any) -> str:
    """One captured output: `canonical(element) TAB window TAB timestamp`."""
    return f'{canonical(element)}\t{window!r}\t{timestamp!r}'


def deterministic_lines(query: int, lines: Iterable[str]) -> list[str]:
    """The part of a query's output that does not depend on processing time, sorted.

    Q12 (processing-time trigger, discarding panes): the total bid count per bidder
    summed over all panes, as `bidder_id=N TAB bid_count=M`. Other queries: all lines.
    """
    if query not in PROCESSING_TIME_QUERIES:
        return sorted(lines)
    totals: collections.Counter[int] = collections.Counter()
    for line in lines:
        element = ast.literal_eval(line.split('\t', 1)[0])
        totals[element['bidder_id']] += element['bid_count']
    return sorted(f'bidder_id={b}\tbid_count={n}' for b, n in totals.items())


def oracle_lines(query: int, config: NexmarkConfig) -> list[str]:
    """Q12's deterministic part computed straight from the generator (no pipeline)."""
    from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Bid

    from benchmarks.nexmark.generator import events
    if query != 12:
        raise ValueError(f'no oracle for Q{query}')
    totals: collections.Counter[int] = collections.Counter(
        e.event.bidder for e in events(config) if isinstance(e.event, Bid))
    return sorted(f'bidder_id={b}\tbid_count={n}' for b, n in totals.items())


_TIMESTAMP = re.compile(r'Timestamp\((-?\d+)\.(\d{3})\d{3}\)')
# Beam's Timestamp repr leaves out the fraction of a whole second: Timestamp(5).
_WHOLE_SECONDS = re.compile(r'Timestamp\((-?\d+)\)')


def truncate_to_millis(lines: Iterable[str]) -> list[str]:
    """`lines` with every `Timestamp(s.uuuuuu)` cut to milliseconds, sorted.

    Runners that encode elements between steps (FnApiRunner, StreamsSparkRunner) carry
    timestamps in ms (Beam's WindowedValue coder), so an end-of-window timestamp becomes
    `end - 1 ms`; the BundleBasedDirectRunner never encodes and keeps `end - 1 us`.
    """
    return sorted(_TIMESTAMP.sub(r'Timestamp(\1.\g<2>000)',
                                 _WHOLE_SECONDS.sub(r'Timestamp(\1.000000)', line))
                  for line in lines)


@dataclass
class Comparison:
    """Result of comparing two sorted outputs as multisets of lines."""

    equal: bool
    only_in_tested: list[str] = field(default_factory=list)
    only_in_reference: list[str] = field(default_factory=list)

    def summary(self, limit: int = 3, width: int = 200) -> str:
        """The counts of differing lines, with up to `limit` examples of each side."""
        if self.equal:
            return 'equal'

        def examples(lines: list[str]) -> str:
            return ' | '.join(line if len(line) <= width else line[:width - 3] + '...'
                              for line in lines[:limit])
        return (f'{len(self.only_in_tested)} lines only in the tested run '
                f'(e.g. {examples(self.only_in_tested)}), {len(self.only_in_reference)} '
                f'only in the reference (e.g. {examples(self.only_in_reference)})')


def compare_outputs(tested: Sequence[str], reference: Sequence[str]) -> Comparison:
    """Compare two outputs line by line, as multisets (sorted lines equal)."""
    a, b = collections.Counter(tested), collections.Counter(reference)
    if a == b:
        return Comparison(True)
    return Comparison(False, sorted((a - b).elements()), sorted((b - a).elements()))


# ---------------------------------------------------------------- one run


@dataclass
class RunResult:
    """What one (query, runner) run produced."""

    query: int
    runner: str
    events: int
    ok: bool
    output_count: int = 0
    error: str = ''
    lines: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def _format_output_fn() -> Any:
    import apache_beam as beam

    class FormatOutput(beam.DoFn):
        """Each element as its `output_line` (with its window and timestamp)."""

        def process(self, element, window=beam.DoFn.WindowParam,
                    timestamp=beam.DoFn.TimestampParam):
            yield output_line(element, window, timestamp)

    return FormatOutput()


def _lines_file_writer(prefix: str) -> Any:
    import apache_beam as beam

    class WriteLinesFiles(beam.DoFn):
        """Each bundle's lines, appended and flushed at the bundle's end to a file of
        this DoFn instance's own (`prefix-<uuid>`), for streaming runs: no GroupByKey,
        so no trigger or watermark decides when lines are written. A file per instance,
        not per bundle: a file per bundle (create, write, rename) was 15% of the worker
        time of a streaming ParDo at bundle size 10, an instrument cost that grew as the
        bundles shrank. Only whole lines are written, and they are read after the run.
        """

        def setup(self):
            self._file = None

        def start_bundle(self):
            self._lines = []

        def process(self, line):
            self._lines.append(line)

        def finish_bundle(self):
            import uuid
            if self._lines:
                if self._file is None:
                    self._file = open(f'{prefix}-{uuid.uuid4().hex}', 'a', encoding='utf-8')
                self._file.write(''.join(line + '\n' for line in self._lines))
                self._file.flush()
            self._lines = []

        def teardown(self):
            if self._file is not None:
                self._file.close()
                self._file = None

    return WriteLinesFiles()


def run_query(query: int, runner: Any, config: NexmarkConfig,
              args: Sequence[str] = (), work_dir: str | None = None,
              streaming: bool = False, rate: float | None = None,
              corrected_q6: bool = False,
              tap: Callable[[Any], Any] | None = None) -> RunResult:
    """Run Beam's query `query` on `runner` in this process; capture its sorted output.

    `streaming`: read the unbounded source (at `rate` events/s, None = as fast as
    possible) and run with Beam's `--streaming` option. `corrected_q6`: Q6 is
    `query6_corrected` (Beam's query fails on every runner). `tap`, if given, is
    applied to the query's output PCollection too (e.g. a latency sink).
    Failures (e.g. Beam's Q6 negating a Timestamp, a runner that cannot stream) are
    caught and reported in the result.
    """
    import apache_beam as beam
    from apache_beam.io import WriteToText
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.benchmarks.nexmark import nexmark_util
    from apache_beam.transforms.window import GlobalWindows

    from benchmarks.nexmark.sources import ReadNexmarkEvents, ReadUnboundedNexmarkEvents

    runner_name = runner if isinstance(runner, str) else type(runner).__name__
    result = RunResult(query, runner_name, config.num_events, ok=False)
    own_dir = work_dir is None
    work_dir = work_dir or tempfile.mkdtemp(prefix=f'nexmark-q{query}-')
    prefix = os.path.join(work_dir, 'part')
    try:
        nexmark_util.setup_coder()
        module = importlib.import_module(
            'benchmarks.nexmark.query6_corrected' if query == 6 and corrected_q6
            else f'apache_beam.testing.benchmarks.nexmark.queries.query{query}')
        streaming_args = ['--streaming'] if streaming else []
        options = PipelineOptions(list(COMMON_ARGS) + streaming_args + list(args))
        with beam.Pipeline(runner=runner, options=options) as p:
            if streaming:
                events = p | 'Events' >> ReadUnboundedNexmarkEvents(config, rate)
            else:
                events = p | 'Events' >> ReadNexmarkEvents(config)
            output = module.load(events, config.query_args(), options)
            if tap is not None:
                tap(output)
            lines_pc = output | 'Canonical' >> beam.ParDo(_format_output_fn())
            if streaming:
                _ = lines_pc | 'Write' >> beam.ParDo(_lines_file_writer(prefix))
            else:
                _ = (lines_pc
                     | 'Global' >> beam.WindowInto(GlobalWindows())
                     | 'Write' >> WriteToText(prefix))
        lines: list[str] = []
        for path in sorted(glob.glob(prefix + '*')):
            with open(path, encoding='utf-8') as f:
                lines.extend(line.rstrip('\n') for line in f)
        result.lines = sorted(lines)
        result.output_count = len(lines)
        result.ok = True
    except Exception as e:  # noqa: BLE001 - any failure of the query is a result
        result.error = f'{type(e).__name__}: {_first_line(str(e))}'
    finally:
        if own_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    return result


def run_native_spark(query: int, config: NexmarkConfig, args: Sequence[str] = ()) -> RunResult:
    """Run the hand-written PySpark baseline of `query` (`spark_baselines`) in this process.

    `args` may hold `--spark_master=...` (default `local[*]`); others are ignored.
    """
    from benchmarks.nexmark import spark_baselines
    result = RunResult(query, NATIVE_SPARK, config.num_events, ok=False)
    master = 'local[*]'
    for arg in args:
        if arg.startswith('--spark_master='):
            master = arg.split('=', 1)[1]
    try:
        lines = spark_baselines.run_baseline(query, config,
                                             spark_baselines.spark_session(master))
        result.lines, result.output_count, result.ok = lines, len(lines), True
    except Exception as e:  # noqa: BLE001 - any failure of the baseline is a result
        result.error = f'{type(e).__name__}: {_first_line(str(e))}'
    return result


def _first_line(text: str, limit: int = 160) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    # Beam wraps worker errors; the root cause is usually the last line.
    line = lines[-1] if lines else ''
    return line if len(line) <= limit else line[:limit - 3] + '...'


def _run_one(argv: Sequence[str]) -> int:
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
    known, rest = parser.parse_known_args(argv)
    config, rest = NexmarkConfig.from_args(rest)
    try:
        if known.runner == NATIVE_SPARK:
            result = run_native_spark(known.query, config, rest)
        else:
            runner = make_runner(known.runner)
            result = run_query(known.query, runner, config, rest,
                               streaming=known.streaming, rate=known.rate,
                               corrected_q6=known.corrected_q6)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        result = RunResult(known.query, known.runner, config.num_events, ok=False,
                           error=f'{type(e).__name__}: {_first_line(str(e))}')
    result.runner = known.runner
    with open(known.lines, 'w', encoding='utf-8') as f:
        f.writelines(line + '\n' for line in result.lines)
    payload = asdict(result)
    payload.pop('lines')
    with open(known.result, 'w', encoding='utf-8') as f:
        json.dump(payload, f)
    if result.error:
        print(f'Q{known.query} failed: {result.error}', file=sys.stderr)
    return 0


def flink_record_line(record: dict[str, Any]) -> str:
    """The canonical line of one `flink_baselines` output record (see that module)."""
    from apache_beam.testing.benchmarks.nexmark.models import nexmark_model
    from apache_beam.transforms.window import GlobalWindow, IntervalWindow
    from apache_beam.utils.timestamp import Timestamp

    element = record['element']
    if 'model' in element:
        cls = getattr(nexmark_model, element['model'])
        value: Any = cls.__new__(cls)
        for k, v in element['fields'].items():
            setattr(value, k, Timestamp(micros=v) if k in ('date_time', 'expires') else v)
    else:
        value = element['dict']
    if record['window'] is None:
        window: Any = GlobalWindow()
    else:
        start, end = record['window']
        window = IntervalWindow(Timestamp(micros=start * 1000), Timestamp(micros=end * 1000))
    if record['timestamp'] == 'end':
        # Beam's WindowedValue coder carries ms: end-of-window is floored to ms.
        timestamp = Timestamp(micros=window.max_timestamp().micros // 1000 * 1000)
    else:
        timestamp = Timestamp(micros=record['timestamp'])
    return output_line(value, window, timestamp)


def run_native_flink(query: int, config_args: Sequence[str], out_dir: str, events: int,
                     timeout_s: float, flink_args: Sequence[str] = ()) -> RunResult:
    """Run the PyFlink baseline of `query` with the PyFlink venv's python; wall time
    around that subprocess. A missing venv or a failure is a failed result, never raised."""
    result = RunResult(query, NATIVE_FLINK, events, ok=False)
    python = flink_python()
    if not os.path.exists(python):
        result.error = (f'PyFlink virtualenv missing ({os.path.dirname(os.path.dirname(python))}); '
                        f'create it with `{FLINK_SETUP}` (optional extra)')
        return result
    tag = f'q{query}-{NATIVE_FLINK}'
    records_path = os.path.join(out_dir, 'outputs', f'{tag}.jsonl')
    log_path = os.path.join(out_dir, 'logs', f'{tag}.log')
    if os.path.exists(records_path):
        os.remove(records_path)
    cmd = [python, '-m', 'benchmarks.nexmark.flink_baselines', f'--query={query}',
           f'--records={records_path}', *flink_args, *config_args]
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO_ROOT, env.get('PYTHONPATH')) if p)
    start = time.perf_counter()
    try:
        with open(log_path, 'w', encoding='utf-8') as log:
            log.write(' '.join(cmd) + '\n')
            log.flush()
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  cwd=REPO_ROOT, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        result.error = f'timeout after {timeout_s:.0f} s'
        result.wall_s = time.perf_counter() - start
        return result
    except OSError as e:
        result.error = f'{type(e).__name__}: {e}'
        return result
    result.wall_s = time.perf_counter() - start
    if proc.returncode != 0 or not os.path.exists(records_path):
        result.error = f'PyFlink run failed (exit {proc.returncode}): {_log_tail(log_path)}'
        return result
    with open(records_path, encoding='utf-8') as f:
        result.lines = sorted(flink_record_line(json.loads(line)) for line in f if line.strip())
    result.output_count = len(result.lines)
    result.ok = True
    return result


def _log_tail(path: str) -> str:
    """The last error-looking line of a log (for a failed run's reason)."""
    try:
        with open(path, encoding='utf-8', errors='replace') as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return f'see {path}'
    errors = [line for line in lines if 'Error' in line or 'Exception' in line]
    return _first_line((errors or lines or [f'see {path}'])[-1]) + f' (log: {path})'


def run_subprocess(query: int, runner: str, config_args: Sequence[str],
                   runner_args: Sequence[str], out_dir: str, events: int,
                   timeout_s: float, tag_suffix: str = '') -> RunResult:
    """Run one (query, runner) in a child Python; wall time measured around it."""
    tag = f'q{query}-{runner.rsplit(".", 1)[-1]}{tag_suffix}'
    lines_path = os.path.join(out_dir, 'outputs', f'{tag}.txt')
    result_path = os.path.join(out_dir, 'logs', f'{tag}.json')
    log_path = os.path.join(out_dir, 'logs', f'{tag}.log')
    for path in (lines_path, result_path):
        if os.path.exists(path):
            os.remove(path)
    cmd = [sys.executable, '-m', 'benchmarks.nexmark.launcher', '--run-one',
           f'--query={query}', f'--runner={runner}', f'--result={result_path}',
           f'--lines={lines_path}', *config_args, *runner_args]
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO_ROOT, env.get('PYTHONPATH')) if p)
    start = time.perf_counter()
    try:
        with open(log_path, 'w', encoding='utf-8') as log:
            log.write(' '.join(cmd) + '\n')
            log.flush()
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                           cwd=REPO_ROOT, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return RunResult(query, runner, events, ok=False,
                         error=f'timeout after {timeout_s:.0f} s',
                         wall_s=time.perf_counter() - start)
    wall = time.perf_counter() - start
    if not os.path.exists(result_path):
        return RunResult(query, runner, events, ok=False, wall_s=wall,
                         error=f'child process died (see {log_path})')
    with open(result_path, encoding='utf-8') as f:
        payload = json.load(f)
    payload['wall_s'] = wall
    result = RunResult(**payload)
    if result.ok:
        with open(lines_path, encoding='utf-8') as f:
            result.lines = [line.rstrip('\n') for line in f]
    return result


# ---------------------------------------------------------------- comparison of runs


def q3_full_join_lines(config: NexmarkConfig) -> list[str]:
    """Every pair Q3 can output (persons of OR/ID/CA with their category-10 auctions), as
    canonical lines in the global window at its end (ms), from the generator."""
    from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Auction, Person
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import Timestamp

    from benchmarks.nexmark.generator import events
    persons: dict[int, Any] = {}
    auctions = []
    for e in events(config):
        x = e.event
        if isinstance(x, Person) and x.state in ('OR', 'ID', 'CA'):
            persons[x.id] = x
        elif isinstance(x, Auction) and x.category == 10:
            auctions.append(x)
    window = GlobalWindow()
    timestamp = Timestamp(micros=window.max_timestamp().micros // 1000 * 1000)
    return sorted(output_line({'name': persons[a.seller].name, 'city': persons[a.seller].city,
                               'state': persons[a.seller].state, 'auction_id': a.id},
                              window, timestamp)
                  for a in auctions if a.seller in persons)


def arrival_order_verdict(query: int, tested: list[str], reference: list[str],
                          config: NexmarkConfig) -> tuple[str, str] | None:
    """For a streaming Q3 whose output differs from the reference's: if both are
    duplicate-free parts of the full join, ('no (arrival order)', why); else None."""
    if query != 3:
        return None
    full = set(q3_full_join_lines(config))

    def valid(lines: list[str]) -> bool:
        return len(set(lines)) == len(lines) and set(lines) <= full
    if not (valid(tested) and valid(reference)):
        return None
    return 'no (arrival order)', (
        f'both outputs are duplicate-free parts of the full join ({len(full)} pairs): '
        f'{len(tested)} pairs here, {len(reference)} in the reference; which pairs the '
        f'AfterCount(30) panes release depends on the order elements arrive in')


def accumulating_panes_verdict(tested: list[str], reference: list[str]
                               ) -> tuple[str, str] | None:
    """For a streaming Q6 (`--corrected-q6`) whose output differs from a batch reference
    (one line per seller: its mean after all its winning bids): if, to the millisecond,
    every reference line is among the tested lines and the tested lines name no other
    seller, ('no (accumulating panes)', why); else None.

    Streaming fires `Repeatedly(AfterCount(1))` as the winning bids arrive, each
    ACCUMULATING pane giving the mean so far, so a seller has a line per pane and its last
    pane is the batch line; which other panes there are depends on arrival order.
    """
    def seller(line: str) -> Any:
        return ast.literal_eval(line.split('\t', 1)[0])['seller']

    tested, reference = truncate_to_millis(tested), truncate_to_millis(reference)
    try:
        by_seller = collections.Counter(seller(line) for line in reference)
        tested_sellers = {seller(line) for line in tested}
    except (ValueError, SyntaxError, KeyError, TypeError):
        return None
    if (any(n != 1 for n in by_seller.values()) or tested_sellers != set(by_seller)
            or not set(reference) <= set(tested)):
        return None
    return 'no (accumulating panes)', (
        f'every seller\'s batch line (its mean after all its winning bids) is one of its '
        f'streaming panes, and no other seller appears: {len(tested)} panes for '
        f'{len(by_seller)} sellers here, one line per seller in the batch reference; which '
        'earlier panes there are depends on the order the winning bids arrive in')


def equality_verdict(query: int, tested: RunResult, reference: RunResult | None,
                     config: NexmarkConfig, streaming: bool = False) -> tuple[str, str]:
    """(`yes`/`no`/`failed: reason`, note) for `tested` against `reference`.

    Q12: compared on `deterministic_lines`; if the reference fails on it, against
    `oracle_lines` (the count per bidder straight from the generator). In streaming, a
    differing Q3 is checked with `arrival_order_verdict`.
    """
    if not tested.ok:
        return f'failed: {tested.error}', ''
    ref_lines: list[str] | None = None
    note = ''
    if reference is not None and reference.ok:
        ref_lines = deterministic_lines(query, reference.lines)
    elif query in PROCESSING_TIME_QUERIES:
        ref_lines = oracle_lines(query, config)
        reason = reference.error if reference is not None else 'no reference run'
        note = f'reference failed ({reason}); compared with the {ORACLE}'
    else:
        reason = reference.error if reference is not None else 'no reference run'
        return f'no reference: {reason}', ''
    comparison = compare_outputs(deterministic_lines(query, tested.lines), ref_lines)
    if query in PROCESSING_TIME_QUERIES:
        note = ('; '.join(p for p in (note, 'compared on the total count per bidder')
                          if p))
    if comparison.equal:
        return 'yes', note
    to_the_ms = compare_outputs(truncate_to_millis(deterministic_lines(query, tested.lines)),
                                truncate_to_millis(ref_lines))
    if to_the_ms.equal:
        note = '; '.join(p for p in (note, MS_NOTE, comparison.summary(1)) if p)
        return 'no (equal to the ms)', note
    if streaming and query in ARRIVAL_ORDER_QUERIES:
        verdict = arrival_order_verdict(query, tested.lines, ref_lines, config)
        if verdict is not None:
            return verdict
    if streaming and query in ACCUMULATING_PANE_QUERIES:
        verdict = accumulating_panes_verdict(tested.lines, ref_lines)
        if verdict is not None:
            return verdict
    if len(to_the_ms.only_in_tested) < len(comparison.only_in_tested):
        # Sub-ms timestamps (a BundleBasedDirectRunner reference) differ on every
        # windowed line: show what differs to the millisecond.
        return 'no', '; '.join(p for p in (note, 'to the ms: ' + to_the_ms.summary()) if p)
    return 'no', '; '.join(p for p in (note, comparison.summary()) if p)


MS_NOTE = ('elements and windows equal, timestamps differ below 1 ms: the reference keeps '
           'end-of-window timestamps at end - 1 us (it never encodes elements), the tested '
           'runner has end - 1 ms (Beam\'s WindowedValue coder carries ms, as on the '
           'DirectRunner)')


@dataclass
class Row:
    """One line of the results table."""

    query: int
    runner: str
    events: int
    wall_s: float
    events_per_s: float
    output_count: int
    equal: str
    note: str = ''


STREAMING_ROW = 'streaming'  # plan entry of --with-streaming: the tested runner, streaming


def streaming_row(query: int, streamed: RunResult, batch: RunResult,
                  reference: RunResult | None, config: NexmarkConfig) -> Row:
    """The `--with-streaming` row of `query`: compared with the batch reference (the
    tested runner's own batch run when there is none), events/s as a ratio to batch."""
    equal, note = equality_verdict(query, streamed, reference or batch, config,
                                   streaming=True)
    row = make_row(streamed, equal, note)
    if row.events_per_s and batch.ok and batch.wall_s > 0:
        ratio = row.events_per_s / (batch.events / batch.wall_s)
        row.note = '; '.join(p for p in (f'{ratio:.2f}x the events/s of its batch run',
                                          row.note) if p)
    row.runner = f'{streamed.runner} (streaming)'
    return row


def make_row(result: RunResult, equal: str, note: str = '') -> Row:
    eps = result.events / result.wall_s if result.ok and result.wall_s > 0 else 0.0
    return Row(result.query, result.runner, result.events, round(result.wall_s, 2),
               round(eps, 1), result.output_count if result.ok else 0, equal, note)


# ---------------------------------------------------------------- report

COLUMNS = ('query', 'runner', 'events', 'wall time s', 'events/s', 'output count',
           'equal to reference')

NOTES = """\
* **Equality**: each run's output is captured as sorted lines `element TAB window TAB
  timestamp` (dicts sorted by key, lists/sets sorted, model objects by their fields) and
  compared with the reference runner's sorted lines.
* **Q4, Q6, Q9**: Beam's DirectRunner (FnApiRunner) cannot run their custom merging
  window (`Cannot convert _OpaqueWindow`), so their reference is the
  `BundleBasedDirectRunner` when `--compare DirectRunner`. Their `AuctionOrBidWindow`
  ignores the auction id in its equality, so in principle their output can depend on how
  a runner merges windows; any disagreement is listed below.
* **"no (equal to the ms)"**: elements and windows are equal but output timestamps differ
  below 1 ms. Beam's WindowedValue coder carries timestamps in milliseconds, so runners
  that encode elements between steps (DirectRunner/FnApiRunner, StreamsSparkRunner) give
  an end-of-window output timestamp of `end - 1 ms`, while the BundleBasedDirectRunner,
  which passes Python objects between steps without encoding them, keeps Python's
  `IntervalWindow.max_timestamp()` = `end - 1 us`. This is the Q4/Q9 difference against
  the BundleBasedDirectRunner; on the DirectRunner the same windowed queries (Q5, Q7, ...)
  agree exactly.
* **Q6** fails on every runner: Beam's `query6` negates a `Timestamp`
  (`TypeError: bad operand type for unary -`); it is reported as failing, not skipped.
  With `--corrected-q6` it runs `benchmarks/nexmark/query6_corrected.py` instead: Beam's
  query with the sort key negating the bid time in micros, nothing else changed.
* **Q10** writes its log files through a stub (`open_writable_gcs_file` does nothing) and
  its last step emits nothing, so its output is empty on every runner.
* **Q12** fires on processing time (`Repeatedly(AfterProcessingTime)`, discarding panes):
  the number and contents of its panes depend on timing, so it is compared on its
  deterministic part, the total bid count per bidder summed over all panes. The
  DirectRunner fails on it in batch (`'NoneType' object has no attribute 'time'`); when
  the reference fails, the totals are compared with counts taken straight from the
  generator (the "generator oracle").
* **SparkNative** (`--native spark`): hand-written PySpark RDD programs for Q0, Q1, Q2,
  Q3, Q5, Q7 (`benchmarks/nexmark/spark_baselines.py`) over the same events, generated in
  the Spark tasks; their output is written as the same canonical lines and compared
  exactly. Q3 reproduces Beam's batch behaviour of its `AfterCount(30)` trigger (only
  sellers with >= 30 grouped elements produce output; see that module).
* **FlinkNative** (`--native flink`, optional extra): hand-written PyFlink DataStream
  programs (batch execution mode) for the same six queries
  (`benchmarks/nexmark/flink_baselines.py`), run by the python of the separate
  virtualenv `.venv-flink` (`bash benchmarks/nexmark/setup_flink_venv.sh`; PyFlink pins
  an old apache-beam); events generated in the Flink tasks, output records turned into
  the same canonical lines and compared exactly. Its wall time includes starting Flink's
  local cluster and its Python workers (about 15-25 s on this machine).
* Wall time is measured around a fresh Python subprocess per (query, runner), so it
  includes interpreter and (for StreamsSparkRunner) JVM/Spark start-up; events/s =
  events / wall time.
* **"(streaming)" rows** (`--with-streaming`): the tested runner again, with
  `--streaming` over the unbounded source as fast as possible (Q6 as
  `query6_corrected`), compared with the batch reference (with the same allowances as a
  streaming run: accumulating panes for Q6, arrival order for Q3); the note gives its
  events/s as a ratio to the same runner's batch row.
"""

STREAMING_NOTES = """* **Streaming** (`--streaming`): Beam runs read the unbounded source
  (`ReadUnboundedNexmarkEvents`: a splittable DoFn over parts of whole generator
  timelines, watermark = event time of the last emitted event minus the out-of-order
  bound, +inf at the end of a part) with Beam's `--streaming` option; with `--rate` the
  source paces itself to that many events/s over all parts (self-checkpointing with
  resume delays), so events/s cannot exceed the rate. The native baselines stay batch
  programs over the same events.
* **DirectRunner in streaming** (Beam 2.77): Beam's DirectRunner does not switch to the
  BundleBasedDirectRunner on `--streaming`; without TestStream/PubSub it runs the
  pipeline on the FnApiRunner, which runs the unbounded splittable DoFn to the end
  (ignoring resume delays: a paced source is polled) and then the rest, stage by stage.
  So it runs the same queries as in batch, with the same output: not Q4/Q6/Q9 (custom
  merging window) and not Q12 (processing-time trigger, checked against the generator
  oracle). The BundleBasedDirectRunner cannot run a splittable DoFn in streaming at all
  (`Transform node ...ProcessKeyedElements/GroupByKey... was not replaced as expected`),
  so where it is the reference (Q4/Q6/Q9) it runs in batch over the same events, marked
  "reference (batch)": a streaming runner must give the same windows, elements and
  timestamps (to the ms) for Q4/Q9, whose panes fire on the watermark only.
* **Q6 in streaming** (`--corrected-q6`): `Repeatedly(AfterCount(1))` with ACCUMULATING
  panes emits the moving mean each time a seller's winning bids arrive; the batch
  reference fires once per seller. When every batch line is one of the seller's streaming
  panes (its last) and no other seller appears, it is reported as "no (accumulating
  panes)".
* **Q3 in streaming**: its `Repeatedly(AfterCount(30))` panes hold whichever 30 elements
  of a seller arrived first, so a streaming runner's output depends on arrival order;
  when it differs from the reference, both are checked to be duplicate-free parts of the
  full join and reported as "no (arrival order)".
"""


def _cells(row: Row) -> list[str]:
    return [f'Q{row.query}', row.runner, str(row.events), f'{row.wall_s:.2f}',
            f'{row.events_per_s:.0f}' if row.events_per_s else '-',
            str(row.output_count), row.equal]


def format_table(rows: Sequence[Row]) -> str:
    """The results as an aligned plain-text table."""
    table = [list(COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    out = ['  '.join(c.ljust(w) for c, w in zip(line, widths, strict=True))
           .rstrip() for line in table]
    out.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(out)


def markdown_table(rows: Sequence[Row]) -> str:
    """The results as a Markdown table."""
    lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
    for row in rows:
        cells = [c.replace('|', '\\|') for c in _cells(row)]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def write_csv(path: str, rows: Sequence[Row]) -> None:
    import csv
    with open(path, 'w', newline='', encoding='utf-8') as f:
        writer = csv.writer(f)
        writer.writerow(['query', 'runner', 'events', 'wall_s', 'events_per_s',
                         'output_count', 'equal_to_reference', 'note'])
        for r in rows:
            writer.writerow([r.query, r.runner, r.events, r.wall_s, r.events_per_s,
                             r.output_count, r.equal, r.note])


def write_plot(path: str, rows: Sequence[Row]) -> None:
    """Grouped bar chart of events/s per query per runner, log scale (failed: no bar)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    queries = sorted({r.query for r in rows})
    runners = list(dict.fromkeys(r.runner for r in rows))
    rate = {(r.query, r.runner): r.events_per_s for r in rows}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(queries) + 2), 4.5))
    # Each query groups only the runners that ran it (Q4/Q9 have another reference).
    present = {q: [r for r in runners if (q, r) in rate] for q in queries}
    width = 0.8 / max(1, max(len(v) for v in present.values()))
    for runner in runners:
        xs, ys = [], []
        for q in queries:
            if runner in present[q]:
                i, n = present[q].index(runner), len(present[q])
                xs.append(q + (i - (n - 1) / 2) * width)
                ys.append(rate[(q, runner)] or float('nan'))
        ax.bar(xs, ys, width=width, label=runner)
    ax.set_yscale('log')
    ax.set_xticks(queries)
    ax.set_xticklabels([f'Q{q}' for q in queries])
    ax.set_ylabel('events/s (wall time incl. start-up)')
    events = sorted({r.events for r in rows})
    ax.set_title(f'NEXMark, {", ".join(map(str, events))} events (missing bar = failed)')
    ax.legend()
    ax.grid(axis='y', which='both', alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def environment() -> dict[str, str]:
    """Date, versions and cores for the report."""
    import datetime
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return 'not installed'

    return {
        'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        'Apache Beam': version('apache-beam'),
        'PySpark': version('pyspark'),
        'Python': platform.python_version(),
        'machine': f'{platform.machine()}, {os.cpu_count()} cores, {platform.system()}',
    }


def write_report(out_dir: str, rows: Sequence[Row], command: str,
                 mode: str = 'batch') -> None:
    """Write `results.csv`, `report.md` and `nexmark.png` into `out_dir`."""
    write_csv(os.path.join(out_dir, 'results.csv'), rows)
    write_plot(os.path.join(out_dir, 'nexmark.png'), rows)
    env = environment()
    findings = [f'* Q{r.query} on {r.runner}: {r.equal}' + (f' -- {r.note}' if r.note else '')
                for r in rows if r.note or r.equal.startswith(('no', 'failed'))]
    text = ['# NEXMark results', '']
    text += [f'* {k}: {v}' for k, v in env.items()]
    text += [f'* mode: {mode}']
    notes = NOTES + (STREAMING_NOTES if mode.startswith('streaming') else '')
    text += ['', 'Command:', '', '```', command, '```', '', markdown_table(rows), '',
             '![events/s per query](nexmark.png)', '', '## Notes', '', notes, '## Findings', '']
    text += findings or ['* every query equal to its reference']
    with open(os.path.join(out_dir, 'report.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(text) + '\n')


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m benchmarks.nexmark',
        description='Run Beam NEXMark queries on a runner and compare with a reference. '
                    'Unknown options go to the runner under test (e.g. --spark_master); '
                    'NEXMark configuration options (--num_event_generators, ...) to all.')
    parser.add_argument('--runner', default='StreamsSparkRunner',
                        help=f'{", ".join(RUNNER_ALIASES)} or a dotted runner class')
    parser.add_argument('--query', default='0-12', help='e.g. 0-12 or 0,3,5')
    parser.add_argument('--events', type=int, default=None,
                        help='number of events (default: NEXMark\'s 100000)')
    parser.add_argument('--compare', default=None, metavar='RUNNER',
                        help='reference runner (Q4/Q9 use BundleBasedDirectRunner when '
                             'this is DirectRunner)')
    parser.add_argument('--out', default='bench-out', help='output directory')
    parser.add_argument('--native', action='append', default=[], choices=['spark', 'flink'],
                        help='also run native baselines (repeatable; spark: hand-written '
                             f'PySpark, {NATIVE_SPARK} rows; flink: hand-written PyFlink in '
                             f'.venv-flink, {NATIVE_FLINK} rows; for '
                             f'Q{",".join(map(str, NATIVE_QUERIES))}) and compare them with '
                             'the reference')
    parser.add_argument('--streaming', action='store_true',
                        help='read the unbounded source and run Beam runners with '
                             '--streaming (the stream ends after --events)')
    parser.add_argument('--rate', type=float, default=None,
                        help='with --streaming: events/s over all source parts '
                             '(default: as fast as possible)')
    parser.add_argument('--timeout', type=float, default=3600.0,
                        help='seconds per run before it counts as failed')
    parser.add_argument('--corrected-q6', action='store_true',
                        help='run Q6 as query6_corrected (Beam\'s query with its Timestamp '
                             'negation fixed) instead of Beam\'s, which fails everywhere')
    parser.add_argument('--with-streaming', action='store_true',
                        help='in batch: also run --runner with --streaming over the '
                             'unbounded source (as fast as possible), as rows "<runner> '
                             '(streaming)" compared with the batch reference, with their '
                             'events/s as a ratio to the same runner\'s batch run; Q6 runs '
                             'as query6_corrected there')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The launcher's command line; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--run-one' in argv:
        return _run_one(argv)
    args, rest = build_parser().parse_known_args(argv)
    if args.events is not None:
        rest = [f'--num_events={args.events}', *rest]
    config, runner_args = NexmarkConfig.from_args(rest)
    config_args = [a for a in rest if a not in runner_args]
    queries = parse_queries(args.query)
    if args.rate is not None and not args.streaming:
        build_parser().error('--rate needs --streaming')
    if args.rate is not None and args.rate <= 0:
        build_parser().error('--rate must be positive')
    if args.with_streaming and args.streaming:
        build_parser().error('--with-streaming adds streaming rows to a batch run: '
                             'leave out --streaming')
    stream_args = (['--streaming'] + ([f'--rate={args.rate}'] if args.rate else [])
                   if args.streaming else [])
    mode = ('streaming, ' + (f'{args.rate:g} events/s' if args.rate else 'as fast as possible')
            if args.streaming else 'batch')
    out_dir = os.path.abspath(args.out)
    for sub in ('outputs', 'logs'):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)

    plan: list[tuple[int, str, list[str]]] = []
    for q in queries:
        q6_args = ['--corrected-q6'] if q == 6 and args.corrected_q6 else []
        plan.append((q, args.runner, stream_args + runner_args + q6_args))
        ref_runner = reference_for(q, args.compare) if args.compare else None
        if ref_runner is not None and ref_runner != args.runner:
            ref_mode = [] if batch_reference(ref_runner, args.streaming) else stream_args
            plan.append((q, ref_runner, list(ref_mode) + q6_args))
        if 'spark' in args.native and q in NATIVE_QUERIES:
            plan.append((q, NATIVE_SPARK,
                         [a for a in runner_args if a.startswith('--spark_master=')]))
        if 'flink' in args.native and q in NATIVE_QUERIES:
            plan.append((q, NATIVE_FLINK, []))
        if args.with_streaming:
            plan.append((q, STREAMING_ROW, ['--streaming', *runner_args]
                         + (['--corrected-q6'] if q == 6 else [])))
    results: dict[tuple[int, str], RunResult] = {}
    for i, (q, runner, extra) in enumerate(plan, 1):
        if runner == STREAMING_ROW:
            print(f'[{i}/{len(plan)}] Q{q} on {args.runner} --streaming ...', end=' ',
                  flush=True)
            result = run_subprocess(q, args.runner, config_args, extra, out_dir,
                                    config.num_events, args.timeout, tag_suffix='-streaming')
            results[(q, runner)] = result
            status = f'{result.output_count} outputs' if result.ok else f'FAILED {result.error}'
            print(f'{result.wall_s:.1f} s, {status}', flush=True)
            continue
        print(f'[{i}/{len(plan)}] Q{q} on {runner} ...', end=' ', flush=True)
        if runner == NATIVE_FLINK:
            result = run_native_flink(q, config_args, out_dir, config.num_events,
                                      args.timeout, extra)
        else:
            result = run_subprocess(q, runner, config_args, extra, out_dir,
                                    config.num_events, args.timeout)
        results[(q, runner)] = result
        status = f'{result.output_count} outputs' if result.ok else f'FAILED {result.error}'
        print(f'{result.wall_s:.1f} s, {status}', flush=True)

    rows: list[Row] = []
    for q in queries:
        tested = results[(q, args.runner)]
        reference = None
        if args.compare:
            ref_name = reference_for(q, args.compare)
            reference = results[(q, ref_name)]
            if ref_name == args.runner:
                reference = None
        if args.compare and reference is not None:
            equal, note = equality_verdict(q, tested, reference, config, args.streaming)
            if batch_reference(reference.runner, args.streaming):
                note = '; '.join(p for p in (f'reference: {reference.runner} in batch (it '
                                              'cannot run the unbounded source)', note) if p)
        elif args.compare is None and q in PROCESSING_TIME_QUERIES:
            equal, note = equality_verdict(q, tested, None, config, args.streaming)
        else:
            equal, note = ('failed: ' + tested.error if not tested.ok else '-'), ''
        rows.append(make_row(tested, equal, note))
        if reference is not None:
            rows.append(make_row(reference, ('reference' if reference.ok
                                             else f'failed: {reference.error}')
                                 + (' (batch)' if batch_reference(reference.runner,
                                                                  args.streaming) else '')))
        for native_runner in (NATIVE_SPARK, NATIVE_FLINK):
            native = results.get((q, native_runner))
            if native is None or args.runner == native_runner:
                continue
            if args.compare:
                ref = results[(q, reference_for(q, args.compare))]
                equal, note = equality_verdict(q, native, ref, config, args.streaming)
            else:
                equal, note = ('failed: ' + native.error if not native.ok else '-'), ''
            rows.append(make_row(native, equal, note))
        streamed = results.get((q, STREAMING_ROW))
        if streamed is not None:
            rows.append(streaming_row(q, streamed, tested, reference, config))

    print()
    print(format_table(rows))
    command = 'python -m benchmarks.nexmark ' + ' '.join(argv)
    write_report(out_dir, rows, command, mode)
    print(f'\nwrote {out_dir}/results.csv, report.md, nexmark.png')
    return 0


if __name__ == '__main__':
    sys.exit(main())
