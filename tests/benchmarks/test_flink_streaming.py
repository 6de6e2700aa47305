"""The PyFlink streaming programs (`benchmarks/nexmark/flink_streaming*.py`, `flink_stream_io`).

Each program runs as the streaming comparison runs it: a subprocess with the PyFlink
virtualenv's python over a directory of event files (`stream_files`), its records
compared with Beam's batch output on the DirectRunner (`verdicts.equality_verdict`,
streaming). The runs are skipped without the venv (`.venv-flink`, made by
`bash benchmarks/nexmark/setup_flink_venv.sh`); the conversions and the command line's
checks run always. Tiny event sets: 4,000 events at 1,000 events/s with windows of 2 s
every 1 s (several windows, a few outputs each); Q3 needs 20,000 for two sellers to fill
a 30-element pane.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading

import pytest

from benchmarks.children import REPO_ROOT, child_environment
from benchmarks.nexmark import (
    flink_baselines,
    flink_stream_io,
    flink_streaming,
    flink_streaming_datastream,
    stream_files,
)
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.event_file import json_line
from benchmarks.nexmark.generator import events
from benchmarks.nexmark.native import flink_python
from benchmarks.sweep import nexmark_latency_config
from tests.benchmarks.stream_checks import assert_records_equal_batch, config_args

needs_flink = pytest.mark.skipif(
    not os.path.exists(flink_python()),
    reason='PyFlink venv (.venv-flink) not found: PyFlink is an optional extra; create it '
           'with `bash benchmarks/nexmark/setup_flink_venv.sh`')

SMALL = NexmarkConfig(num_events=4000, first_event_rate=1000, next_event_rate=1000,
                      window_size_sec=2, window_period_sec=1, auction_skip=3)
Q3_CONFIG = NexmarkConfig(num_events=20_000)
SQL_QUERIES = (0, 1, 2, 5, 7, 8)
def command(variant: str, query: int, events_dir: str, out: str, config: NexmarkConfig,
            *extra: str) -> list[str]:
    return [flink_python(), '-m', 'benchmarks.nexmark.flink_streaming', f'--variant={variant}',
            f'--query={query}', f'--events_dir={events_dir}', f'--records={out}/records.jsonl',
            f'--summary={out}/summary.json', '--parallelism=2', *config_args(config), *extra]


def results(out: str, proc: subprocess.CompletedProcess | subprocess.Popen
            ) -> tuple[list[dict], dict]:
    with open(os.path.join(out, 'summary.json'), encoding='utf-8') as f:
        summary = json.load(f)
    assert proc.returncode == 0, summary.get('error')
    return stream_files.read_records(os.path.join(out, 'records.jsonl')), summary


@pytest.fixture(scope='module')
def small_events(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp('events'))
    stream_files.write_event_files(SMALL, directory, 500)
    return directory


@pytest.fixture(scope='module')
def q3_events(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp('q3-events'))
    stream_files.write_event_files(Q3_CONFIG, directory, 2000)
    return directory


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=child_environment(), cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=900, check=False)


# ---------------------------------------------------------------- without the venv


def test_json_events_give_the_model_fields_of_the_batch_baselines():
    for e in events(NexmarkConfig(num_events=300)):
        parsed = json.loads(json_line(e.event))
        assert flink_stream_io.event_kind(parsed) == type(e.event).__name__
        assert flink_stream_io.model_fields(parsed) == flink_baselines.model_fields(e.event)


def test_bad_command_lines_say_what_is_wrong(tmp_path, capsys):
    base = [f'--events_dir={tmp_path}', '--records=r', '--summary=s', '--query=5']
    for argv, message in (
            (['--variant=sql', *base], 'no events-999999-end.jsonl'),
            (['--variant=datastream', *base, '--ready_file=f', '--checkpoint_dir=d'],
             '--checkpoint_dir and --checkpoint_period_s go together'),
            (['--variant=sql', *base[:-1], '--query=3', '--ready_file=f'],
             'no sql program for Q3'),
            (['--variant=datastream', '--events_dir=/no/such/dir', *base[1:]],
             'is not a directory')):
        with pytest.raises(SystemExit):
            flink_streaming.parse_options(argv)
        assert message in capsys.readouterr().err


def test_error_line_names_the_innermost_java_cause():
    error = RuntimeError('An error occurred while calling o19.execute.\n'
                         ': org.apache.flink.runtime.client.JobExecutionException: failed\n'
                         '\tat org.apache.flink.Foo(Foo.java:1)\n'
                         'Caused by: java.io.IOException: disk full\n\tat Bar(Bar.java:2)\n')
    assert flink_streaming.error_line(error) == 'RuntimeError: java.io.IOException: disk full'


# ---------------------------------------------------------------- with the venv


@needs_flink
@pytest.mark.parametrize('variant,query',
                         [('datastream', q) for q in flink_streaming_datastream.QUERIES]
                         + [('sql', q) for q in SQL_QUERIES])
def test_streaming_program_equals_beam_batch(variant, query, small_events, q3_events,
                                             tmp_path):
    config, directory = (Q3_CONFIG, q3_events) if query == 3 else (SMALL, small_events)
    proc = run(command(variant, query, directory, str(tmp_path), config))
    records, summary = results(str(tmp_path), proc)
    assert summary['events'] == config.num_events and summary['wall_s'] > 0
    assert 'checkpoints' not in summary
    assert_records_equal_batch(query, records, config)


@needs_flink
def test_checkpoints_in_the_bounded_mode(small_events, tmp_path):
    checkpoints = tmp_path / 'checkpoints'
    proc = run(command('datastream', 7, small_events, str(tmp_path), SMALL,
                       f'--checkpoint_dir={checkpoints}', '--checkpoint_period_s=1'))
    records, summary = results(str(tmp_path), proc)
    assert isinstance(summary['checkpoints'], int) and summary['checkpoints'] >= 0
    assert checkpoints.is_dir()
    assert_records_equal_batch(7, records, SMALL)


@needs_flink
@pytest.mark.parametrize('variant,query,checkpoints', [('datastream', 5, True),
                                                       ('sql', 7, False)])
def test_ready_file_mode_fed_at_a_fixed_rate(variant, query, checkpoints, tmp_path):
    rate, num_events = 1000, 5000
    events_dir, ready = tmp_path / 'events', tmp_path / 'ready'
    events_dir.mkdir()
    extra = [f'--ready_file={ready}']
    if checkpoints:
        extra += [f'--checkpoint_dir={tmp_path / "checkpoints"}', '--checkpoint_period_s=1']
    program_config = nexmark_latency_config(NexmarkConfig(num_events=num_events), rate)
    proc = subprocess.Popen(command(variant, query, str(events_dir), str(tmp_path),
                                    program_config, *extra),
                            env=child_environment(), cwd=REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert stream_files.wait_for(str(ready), 600, lambda: proc.poll() is None), \
            'the program ended without writing its ready file'
        # Event times from now on, as the orchestrator feeds them.
        config = nexmark_latency_config(NexmarkConfig(num_events=num_events), rate)
        feeder = threading.Thread(target=stream_files.feed,
                                  args=(config, str(events_dir), rate))
        feeder.start()
        proc.wait(timeout=600)
        feeder.join()
    finally:
        if proc.poll() is None:
            proc.kill()
    records, summary = results(str(tmp_path), proc)
    latencies = [stream_files.latency_s(r) for r in records]
    assert records and all(r['emitted'] > 0 for r in records)
    assert all(x is not None and math.isfinite(x) and x > 0 for x in latencies)
    if checkpoints:
        assert summary['checkpoints'] >= 1  # a stream of over 5 s, one every second
    assert_records_equal_batch(query, records, config)
