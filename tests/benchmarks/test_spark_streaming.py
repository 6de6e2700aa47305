"""The Spark Structured Streaming baselines (`benchmarks.nexmark.spark_streaming`, its
state variant `spark_streaming_state`).

* Each supported (variant, query) through the program's `main`, in this process on the
  test session's SparkContext (a session of its own), over files written by
  `stream_files.write_event_files`: its records, turned into canonical lines by
  `native.flink_record_line`, pass `verdicts.equality_verdict` (streaming) against
  Beam's batch run on the DirectRunner over the same events; the summary counts every
  event. The windowed queries' events span several windows, so the last windows
  closing at the end of the stream is part of what is compared.
* `--checkpoint_dir`: Spark's checkpoint there, one per micro-batch, counted.
* `--ready_file`: `stream_files.feed` writes the events once the query runs; every
  record has a positive, finite latency.
* Events read after the end file are an error; so are unsupported queries and a used
  checkpoint directory.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from benchmarks.nexmark import spark_streaming, stream_files
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.sweep import nexmark_latency_config
from tests.benchmarks.stream_checks import (
    assert_records_equal_batch,
    config_args,
    start_feeder,
)

# At 1,000 events/s 5,000 events span 5 s: several 2-s windows (slid by 1 s for Q5), and
# Q2 selects a few bids (auction % 123 == 0). Out-of-order groups of 7 make the
# watermark's delay matter. Q3 needs ~30,000 events for a seller to fill a 30-element pane.
WINDOWED = NexmarkConfig(num_events=5000, first_event_rate=1000, next_event_rate=1000,
                         window_size_sec=2, window_period_sec=1, out_of_order_group_size=7)
Q3_CONFIG = NexmarkConfig(num_events=30_000)
def run_program(session, variant: str, query: int, config: NexmarkConfig, events_dir: str,
                out_dir, *extra: str) -> tuple[int, list[dict], dict]:
    records = str(out_dir / f'{variant}-q{query}.jsonl')
    summary = str(out_dir / f'{variant}-q{query}.json')
    status = spark_streaming.main([
        f'--variant={variant}', f'--query={query}', f'--events_dir={events_dir}',
        f'--records={records}', f'--summary={summary}', *extra, *config_args(config)],
        session=session)
    with open(summary, encoding='utf-8') as f:
        summary_fields = json.load(f)
    return status, stream_files.read_records(records), summary_fields


@pytest.fixture(scope='module')
def windowed_events(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp('windowed-events'))
    stream_files.write_event_files(WINDOWED, directory, events_per_file=1000)
    return directory


@pytest.mark.parametrize('variant, query', [
    ('sql', 0), ('sql', 1), ('sql', 2), ('sql', 5), ('sql', 8), ('state', 5), ('state', 7)])
def test_query_equals_the_batch_reference(variant, query, windowed_events, spark_session,
                                          tmp_path):
    # Two files per micro-batch: the windows close over several batches.
    status, records, summary = run_program(
        spark_session, variant, query, WINDOWED, windowed_events, tmp_path,
        '--max_files_per_trigger=2')
    assert status == 0, summary
    assert summary['events'] == WINDOWED.num_events
    assert summary['wall_s'] > 0 and summary['setup_s'] >= 0
    assert 'checkpoints' not in summary
    assert_records_equal_batch(query, records, WINDOWED)


def test_q3_state_fires_panes_of_30_like_beam(spark_session, tmp_path):
    events_dir = str(tmp_path / 'events')
    stream_files.write_event_files(Q3_CONFIG, events_dir, events_per_file=10_000)
    status, records, summary = run_program(spark_session, 'state', 3, Q3_CONFIG,
                                             events_dir, tmp_path)
    assert status == 0, summary
    assert summary['events'] == Q3_CONFIG.num_events
    assert_records_equal_batch(3, records, Q3_CONFIG)


def test_q7_sql_with_a_checkpoint_dir(windowed_events, spark_session, tmp_path):
    checkpoint = tmp_path / 'checkpoint'
    status, records, summary = run_program(
        spark_session, 'sql', 7, WINDOWED, windowed_events, tmp_path,
        f'--checkpoint_dir={checkpoint}', '--checkpoint_period_s=10',
        '--max_files_per_trigger=2')
    assert status == 0, summary
    # 5 events files and the end file, 2 per batch, then the no-data batch closing the
    # last windows: Spark commits each micro-batch to the checkpoint.
    assert summary['checkpoints'] >= 4
    assert summary['checkpoint_period_s'] == 10
    commits = [n for n in os.listdir(checkpoint / 'commits') if n.isdigit()]
    assert len(commits) == summary['checkpoints']
    assert os.listdir(checkpoint / 'state')
    assert_records_equal_batch(7, records, WINDOWED)


def test_ready_file_mode_reads_a_fed_directory(spark_session, tmp_path):
    rate = 1000.0
    config = nexmark_latency_config(NexmarkConfig(num_events=4000), rate)
    events_dir, ready = tmp_path / 'events', str(tmp_path / 'ready')
    thread, fed = start_feeder(config, str(events_dir), ready, rate)
    status, records, summary = run_program(
        spark_session, 'sql', 5, config, str(events_dir), tmp_path, f'--ready_file={ready}')
    thread.join(timeout=60)
    assert status == 0, summary
    assert fed and fed[0].num_events == config.num_events
    assert records and all('emitted' in r for r in records)
    latencies = [stream_files.latency_s(r) for r in records]
    assert all(x is not None and math.isfinite(x) and x > 0 for x in latencies)
    assert_records_equal_batch(5, records, config)


def test_events_after_the_end_file_are_an_error(spark_session, tmp_path):
    config = NexmarkConfig(num_events=1000)
    events_dir = tmp_path / 'events'
    stream_files.write_event_files(config, str(events_dir), events_per_file=500)
    # The end file modified before the last events file: Spark reads it first.
    last = events_dir / stream_files.EVENTS_PATTERN.format(1)
    stamp = os.stat(last).st_mtime_ns - 10_000_000_000
    os.utime(events_dir / stream_files.END_FILE, ns=(stamp, stamp))
    status, _, summary = run_program(spark_session, 'sql', 0, config, str(events_dir),
                                        tmp_path, '--max_files_per_trigger=1')
    assert status == 1
    assert 'after the end file' in summary['error']


@pytest.mark.parametrize('variant, query, message', [
    ('sql', 3, 'use --variant=state'), ('state', 0, 'has no Q0'), ('sql', 4, 'has no Q4')])
def test_unsupported_queries_are_refused(variant, query, message, tmp_path, capsys):
    status = spark_streaming.main([
        f'--variant={variant}', f'--query={query}', f'--events_dir={tmp_path}',
        f'--records={tmp_path / "r.jsonl"}', f'--summary={tmp_path / "s.json"}'])
    assert status == 2
    assert message in capsys.readouterr().err


def test_a_used_checkpoint_dir_is_refused(tmp_path, capsys):
    (tmp_path / 'checkpoint').mkdir()
    (tmp_path / 'checkpoint' / 'metadata').write_text('{}')
    status = spark_streaming.main([
        '--variant=sql', '--query=0', f'--events_dir={tmp_path}',
        f'--checkpoint_dir={tmp_path / "checkpoint"}',
        f'--records={tmp_path / "r.jsonl"}', f'--summary={tmp_path / "s.json"}'])
    assert status == 2
    assert 'is not empty' in capsys.readouterr().err


def test_a_missing_events_dir_is_refused(tmp_path, capsys):
    status = spark_streaming.main([
        '--variant=sql', '--query=0', f'--events_dir={tmp_path / "nowhere"}',
        f'--records={tmp_path / "r.jsonl"}', f'--summary={tmp_path / "s.json"}'])
    assert status == 2
    assert 'write the events first' in capsys.readouterr().err
