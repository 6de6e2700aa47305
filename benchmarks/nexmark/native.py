"""Hand-written native baselines of the NEXMark launcher: PySpark and PyFlink programs.

`run_native_spark` runs a `spark_baselines` program in this process; `run_native_flink`
runs a `flink_baselines` program with the python of the PyFlink virtualenv
(`.venv-flink`, made by `bash benchmarks/nexmark/setup_flink_venv.sh`; PyFlink pins an
old apache-beam) and turns its output records into the launcher's canonical lines
(`flink_record_line`). Either returns a failed `RunResult` instead of raising.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.children import REPO_ROOT, child_environment
from benchmarks.nexmark.capture import output_line
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.verdicts import RunResult, first_line

# `--native spark`: the hand-written PySpark programs of `spark_baselines`, as this runner.
NATIVE_SPARK = 'SparkNative'
# `--native flink`: the PyFlink programs of `flink_baselines`, run by the python of a
# separate virtualenv (PyFlink pins an old apache-beam); FLINK_VENV overrides its place.
NATIVE_FLINK = 'FlinkNative'
NATIVE_QUERIES = (0, 1, 2, 3, 5, 7)
FLINK_SETUP = 'bash benchmarks/nexmark/setup_flink_venv.sh'


def flink_python() -> str:
    """The python of the PyFlink virtualenv (`$FLINK_VENV` or `<repo>/.venv-flink`)."""
    venv = os.environ.get('FLINK_VENV') or os.path.join(REPO_ROOT, '.venv-flink')
    return os.path.join(venv, 'bin', 'python')


def run_native_spark(query: int, config: NexmarkConfig, args: Sequence[str] = (),
                     input_path: str | None = None) -> RunResult:
    """Run the hand-written PySpark baseline of `query` (`spark_baselines`) in this process.

    `args` may hold `--spark_master=...` (default `local[*]`); others are ignored.
    `input_path`: the events' JSON-lines file (None: the generated events).
    """
    from benchmarks.nexmark import spark_baselines
    result = RunResult(query, NATIVE_SPARK, config.num_events, ok=False)
    master = 'local[*]'
    for arg in args:
        if arg.startswith('--spark_master='):
            master = arg.split('=', 1)[1]
    try:
        lines = spark_baselines.run_baseline(query, config,
                                             spark_baselines.spark_session(master),
                                             input_path=input_path)
        result.lines, result.output_count, result.ok = lines, len(lines), True
    except Exception as e:  # noqa: BLE001 - any failure of the baseline is a result
        result.error = f'{type(e).__name__}: {first_line(str(e))}'
    return result


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


def run_logged(cmd: Sequence[str], log_path: str, timeout_s: float
               ) -> subprocess.CompletedProcess:
    """Run `cmd` from the repository with it on the PYTHONPATH, its output (after the
    command line) in `log_path`; raises `subprocess.TimeoutExpired` after `timeout_s`."""
    env = child_environment()
    with open(log_path, 'w', encoding='utf-8') as log:
        log.write(' '.join(cmd) + '\n')
        log.flush()
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                              cwd=REPO_ROOT, timeout=timeout_s, check=False)


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
    start = time.perf_counter()
    try:
        proc = run_logged(cmd, log_path, timeout_s)
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
    return first_line((errors or lines or [f'see {path}'])[-1]) + f' (log: {path})'
