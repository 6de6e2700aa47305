"""This runner's side of the streaming comparison: Beam's own NEXMark queries on
StreamsSparkRunner in streaming, reading the events directory as a stream.

    python -m benchmarks.nexmark.beam_streaming --query=5 --events_dir=DIR \\
        --records=R.jsonl --summary=S.json [--checkpoint_dir=D --checkpoint_period_s=P] \\
        [--ready_file=F] [--parallelism=2] [NEXMark config options] [runner options]

The common interface of the comparison's programs (`stream_files`): the events of DIR
(`file_stream_source.ReadNexmarkEventFiles`, one part per core) go through Beam's query
module `apache_beam.testing.benchmarks.nexmark.queries.queryN` unchanged, applied as
`runs._run_pipeline` applies it, on `StreamsSparkRunner` with `--streaming` and
`--spark_master=local[2]` unless given. With `--checkpoint_dir` and
`--checkpoint_period_s` consistent regions are on (`--checkpoint_store=D`), else off
(`--checkpoint_period_s=0`); every run is a new job (a unique `--job_name`). Other
options (`--target_latency_ms`, `--spark_conf`, ...) go to the runner.

Output: a sink DoFn (`RecordSink`) turns each output element, in Spark's Python
workers, into a `stream_files` record (`output_record`: `native.flink_record_line` of it
is the element's `capture.output_line`) stamped `emitted` when it reached the sink, and
appends it to a file of its DoFn instance's own; the files are merged into `--records`
after the run. Summary: the events read, `wall_s` from the first `process` call of the
source (`started-*` marker files) to the pipeline's end, `setup_s` before it, and the
checkpoints the consistent regions completed (counted from the runner's log).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam

from benchmarks.nexmark import file_stream_source as fss
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.flink_baselines import model_fields
from benchmarks.nexmark.native import NATIVE_QUERIES
from benchmarks.nexmark.runs import COMMON_ARGS
from benchmarks.nexmark.stream_files import (
    add_program_arguments,
    checkpoint_arguments_error,
    write_record,
    write_summary,
)

QUERIES = (*NATIVE_QUERIES, 8)  # those the engines' streaming APIs express too
DEFAULT_MASTER = 'local[2]'
# The runner logs each completed checkpoint of a consistent region with this message.
_CHECKPOINT_LOGGER = 'beam_streams_runner.regions.controller'
_CHECKPOINT_MESSAGE = 'Consistent region %r: checkpoint %d after epoch %d is consistent'
_MODEL_MODULE = 'apache_beam.testing.benchmarks.nexmark'


# ---------------------------------------------------------------- records


def output_record(element: Any, window: Any, timestamp: Any, emitted: float
                  ) -> dict[str, Any]:
    """The `stream_files` record of one output element of a query, in `window` at
    `timestamp` (Beam's), reaching the sink at wall time `emitted`.

    Elements: a NEXMark model object as `{"model", "fields"}` (`date_time`/`expires` in
    micros), a dict as `{"dict"}`. Window: null (global) or [start_ms, end_ms].
    Timestamp: micros, or "end" at the window's end-of-window timestamp to the ms (Beam's
    coders carry ms), which `native.flink_record_line` gives back as that timestamp.
    """
    return {'element': _element(element), 'window': _window(window),
            'timestamp': _timestamp(window, timestamp), 'emitted': emitted}


def _element(element: Any) -> dict[str, Any]:
    if isinstance(element, dict):
        return {'dict': element}
    module = type(element).__module__ or ''
    if module.startswith(_MODEL_MODULE) and hasattr(element, '__dict__'):
        return {'model': type(element).__name__, 'fields': model_fields(element)}
    raise TypeError(f'cannot write a {type(element).__name__} output as a stream_files '
                    f'record (only NEXMark model objects and dicts): queries {QUERIES} '
                    'are supported')


def _window(window: Any) -> list[int] | None:
    if isinstance(window, beam.window.GlobalWindow):
        return None
    if isinstance(window, beam.window.IntervalWindow):
        return [window.start.micros // 1000, window.end.micros // 1000]
    raise TypeError(f'unsupported window {window!r}: only the global window and '
                    'interval windows are recorded')


def _timestamp(window: Any, timestamp: Any) -> int | str:
    end_ms = window.max_timestamp().micros // 1000 * 1000
    return 'end' if timestamp.micros >= end_ms else timestamp.micros


class RecordSink(beam.DoFn):
    """Each output as its `output_record`, appended and flushed at the end of each
    bundle to a file of this DoFn instance's own under `records_dir` (the sink runs in
    Spark's Python workers, several processes: one file each, merged after the run)."""

    def __init__(self, records_dir: str) -> None:
        super().__init__()
        self._records_dir = records_dir

    def setup(self) -> None:
        self._file = None
        self._records: list[dict[str, Any]] = []

    def start_bundle(self) -> None:
        self._records = []

    def process(self, element, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam) -> None:
        self._records.append(output_record(element, window, timestamp, time.time()))

    def finish_bundle(self) -> None:
        if not self._records:
            return
        if self._file is None:
            self._file = open(os.path.join(self._records_dir, f'part-{uuid.uuid4().hex}'),
                              'a', encoding='utf-8')
        for record in self._records:
            write_record(self._file, record)
        self._file.flush()
        self._records = []

    def teardown(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def merge_records(records_dir: str, path: str) -> int:
    """Concatenates the sink's files into `path`; returns the number of records."""
    count = 0
    with open(path, 'w', encoding='utf-8') as out:
        for part in sorted(glob.glob(os.path.join(records_dir, 'part-*'))):
            with open(part, encoding='utf-8') as f:
                for line in f:
                    out.write(line)
                    count += 1
    return count


# ---------------------------------------------------------------- the program


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m benchmarks.nexmark.beam_streaming',
        description="Beam's NEXMark query on StreamsSparkRunner in streaming over an "
                    'events directory (benchmarks/nexmark/stream_files.py).')
    add_program_arguments(parser, QUERIES)
    return parser


def parse_args(argv: Sequence[str] | None
               ) -> tuple[argparse.Namespace, NexmarkConfig, list[str]]:
    """(program options, NEXMark config, runner options); bad input exits with usage."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    config, runner_args = NexmarkConfig.from_args(rest)
    if error := checkpoint_arguments_error(args):
        parser.error(error)
    if args.parallelism < 1:
        parser.error(f'--parallelism must be at least 1, got {args.parallelism}')
    if not os.path.isdir(args.events_dir):
        parser.error(f'--events_dir {args.events_dir!r} is not a directory: write the '
                     'events first (stream_files.write_event_files or feed)')
    return args, config, runner_args


def runner_options(args: argparse.Namespace, runner_args: Sequence[str]) -> list[str]:
    """Beam and runner options of the run (see the module docstring)."""
    options = [*COMMON_ARGS, '--streaming', f'--parallelism={args.parallelism}',
               f'--job_name=nexmark-q{args.query}-{uuid.uuid4().hex[:12]}']
    if not any(a.startswith('--spark_master') for a in runner_args):
        options.append(f'--spark_master={DEFAULT_MASTER}')
    # Spark's console progress bar would fill the program's stderr (a later
    # --spark_conf of the same key wins).
    options.append('--spark_conf=spark.ui.showConsoleProgress=false')
    if args.checkpoint_dir is not None:
        options += [f'--checkpoint_store={os.path.abspath(args.checkpoint_dir)}',
                    f'--checkpoint_period_s={args.checkpoint_period_s:g}']
    else:
        options.append('--checkpoint_period_s=0')
    return options + list(runner_args)


class _CheckpointCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == _CHECKPOINT_MESSAGE:
            self.count += 1


@contextlib.contextmanager
def counting_checkpoints() -> Iterator[_CheckpointCounter]:
    """Counts the checkpoints the runner's consistent regions complete meanwhile."""
    logger = logging.getLogger(_CHECKPOINT_LOGGER)
    counter, level = _CheckpointCounter(), logger.level
    logger.addHandler(counter)
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    try:
        yield counter
    finally:
        logger.removeHandler(counter)
        logger.setLevel(level)


def run(args: argparse.Namespace, config: NexmarkConfig, runner_args: Sequence[str],
        work_dir: str, program_start: float) -> dict[str, Any]:
    """Runs the query over the events directory; returns the summary's fields."""
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.runner import PipelineState
    from apache_beam.testing.benchmarks.nexmark import nexmark_util

    from beam_streams_runner import StreamsSparkRunner

    records_dir = os.path.join(work_dir, 'records')
    os.makedirs(records_dir)
    nexmark_util.setup_coder()
    module = importlib.import_module(
        f'apache_beam.testing.benchmarks.nexmark.queries.query{args.query}')
    options = PipelineOptions(runner_options(args, runner_args))
    pipeline = beam.Pipeline(runner=StreamsSparkRunner(), options=options)
    source = fss.ReadNexmarkEventFiles(
        args.events_dir, config.num_events, config, parts=args.parallelism,
        started_dir=work_dir, ready_file=args.ready_file)
    output = module.load(pipeline | 'Events' >> source, config.query_args(), options)
    _ = output | 'Records' >> beam.ParDo(RecordSink(records_dir))
    with counting_checkpoints() as checkpoints:
        result = pipeline.run()
        state = result.wait_until_finish()
    end = time.time()
    if state != PipelineState.DONE:
        raise RuntimeError(f'the pipeline ended {state}, not DONE')
    started = fss.started_time(work_dir) or end
    counters = result.metrics().query(MetricsFilter().with_namespace(
        fss.METRICS_NAMESPACE).with_name(fss.EVENTS_COUNTER))['counters']
    events = sum(c.committed or 0 for c in counters)
    if events != config.num_events:
        raise RuntimeError(
            f'read {events} events from {args.events_dir}, the config says '
            f'{config.num_events}: give --num_events of the directory the events were '
            'written with')
    merge_records(records_dir, args.records)
    summary: dict[str, Any] = {'events': events, 'wall_s': end - started,
                               'setup_s': started - program_start}
    if args.checkpoint_dir is not None:
        summary['checkpoints'] = checkpoints.count
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """The program (module docstring); returns its exit status."""
    program_start = time.time()
    args, config, runner_args = parse_args(argv)
    records_parent = os.path.dirname(os.path.abspath(args.records))
    os.makedirs(records_parent, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix=f'.beam-streaming-q{args.query}-', dir=records_parent)
    try:
        summary = run(args, config, runner_args, work_dir, program_start)
    except Exception as e:  # noqa: BLE001 - any failure is reported in the summary
        message = f'{type(e).__name__}: {e}'.splitlines()[0]
        write_summary(args.summary, events=config.num_events, wall_s=0.0,
                      setup_s=time.time() - program_start, error=message)
        print(f'beam_streaming: Q{args.query} failed: {message}', file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    write_summary(args.summary, **summary)
    print(json.dumps(summary), file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
