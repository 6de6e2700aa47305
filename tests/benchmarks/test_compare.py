"""The comparison's orchestrator (`benchmarks/compare/`): a streaming run of a program
with the common interface, as fast as possible and at a fixed rate, its verdict, its
latency and its peak memory; the report's tables, goals and plots.

The engines' own programs are tested with them (test_spark_streaming,
test_flink_streaming, test_beam_streaming); here the program is a small Python Q0
written for the test (`PROGRAM`), so the orchestrator is tested without an engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks.compare import main, report
from benchmarks.compare.batch import BatchRow
from benchmarks.compare.memory import PeakMemory
from benchmarks.compare.stream_runs import StreamRow, config_args, latencies, run_stream
from benchmarks.compare.systems import (
    FLINK_DATASTREAM,
    FLINK_SQL,
    OURS,
    SPARK_SQL,
    SPARK_STATE,
    StreamingSystem,
)
from benchmarks.nexmark import stream_files
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.report import Row
from benchmarks.nexmark.runs import run_query

# Q0 in plain Python: every event, in the global window, at its event time. `DROP`
# events are left out, so a test can make the output wrong on purpose.
PROGRAM = textwrap.dedent('''
    import argparse, os, sys, time
    from benchmarks.nexmark import stream_files
    from benchmarks.nexmark.event_file import parse_line
    from benchmarks.nexmark.flink_baselines import model_element, model_fields, record

    DROP = int(os.environ.get('FAKE_DROP', '0'))
    parser = argparse.ArgumentParser()
    for name in ('query', 'events_dir', 'records', 'summary', 'ready_file',
                 'checkpoint_dir', 'checkpoint_period_s'):
        parser.add_argument('--' + name)
    args, _ = parser.parse_known_args()
    if args.ready_file:
        open(args.ready_file, 'w').close()
    start, done, seen, count = time.time(), False, set(), 0
    with open(args.records, 'w') as out:
        while not done:
            names = sorted(n for n in os.listdir(args.events_dir)
                           if not n.startswith(('.', '_')) and n not in seen)
            if not names:
                time.sleep(0.02)
            for name in names:
                seen.add(name)
                for line in open(os.path.join(args.events_dir, name)):
                    if name == stream_files.END_FILE:
                        done = True
                        continue
                    count += 1
                    if count <= DROP:
                        continue
                    event = parse_line(line)
                    rec = record(model_element(type(event.event).__name__,
                                               model_fields(event.event)),
                                 None, event.timestamp_ms * 1000)
                    rec['emitted'] = time.time()
                    stream_files.write_record(out, rec)
    stream_files.write_summary(args.summary, events=count, wall_s=time.time() - start,
                               setup_s=0.0, checkpoints=1 if args.checkpoint_dir else None)
''')


@pytest.fixture
def fake_system(tmp_path, monkeypatch) -> StreamingSystem:
    (tmp_path / 'fake_q0.py').write_text(PROGRAM)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join([str(tmp_path), repo]))
    return StreamingSystem('fake', 'fake_q0', (0,))


def _reference(config: NexmarkConfig):
    return run_query(0, 'DirectRunner', config)


def test_a_run_as_fast_as_possible_is_timed_sampled_and_judged(fake_system, tmp_path):
    config = NexmarkConfig(num_events=600)
    events_dir = str(tmp_path / 'events')
    stream_files.write_event_files(config, events_dir, 250)
    row = run_stream(fake_system, 0, config, events_dir, str(tmp_path / 'work'), _reference,
                     timeout_s=120, checkpoint_period_s=None)
    assert row.equal == 'yes', row
    assert row.events == 600 and row.outputs == 600
    assert row.events_per_s > 0 and row.peak_mb > 0
    assert row.latency_p50_s is None  # as fast as possible: no latency


def test_a_wrong_output_is_not_equal(fake_system, tmp_path, monkeypatch):
    monkeypatch.setenv('FAKE_DROP', '5')
    config = NexmarkConfig(num_events=300)
    events_dir = str(tmp_path / 'events')
    stream_files.write_event_files(config, events_dir, 100)
    row = run_stream(fake_system, 0, config, events_dir, str(tmp_path / 'work'), _reference,
                     timeout_s=120, checkpoint_period_s=5)
    assert not row.ok and row.equal.startswith(('no', 'failed')), row
    assert row.checkpoints_done == 1  # the program was given a checkpoint directory


def test_a_fixed_rate_run_is_fed_when_ready_and_has_latencies(fake_system, tmp_path):
    config = NexmarkConfig(num_events=400)
    references = []

    def reference(cfg):
        references.append(cfg)
        return _reference(cfg)

    row = run_stream(fake_system, 0, config, str(tmp_path / 'events'), str(tmp_path / 'w'),
                     reference, timeout_s=120, checkpoint_period_s=None, rate=400.0)
    assert row.equal == 'yes', row
    # The reference ran over the fed events: wall-clock event times from when it was ready.
    assert references[0].use_wallclock_event_time and references[0].base_time_ms > 1e12
    assert 0 <= row.latency_p50_s <= row.latency_p99_s < 30


def test_a_program_that_fails_is_a_failed_row(tmp_path, monkeypatch):
    (tmp_path / 'broken.py').write_text('import sys; print("no such query"); sys.exit(3)')
    monkeypatch.setenv('PYTHONPATH', str(tmp_path))
    row = run_stream(StreamingSystem('broken', 'broken', (0,)), 0, NexmarkConfig(num_events=10),
                     str(tmp_path), str(tmp_path / 'w'), _reference, 60, None)
    assert row.equal == 'failed: exit 3: no such query'


def test_event_files_for_a_run_as_fast_as_possible_are_written_without_waiting(
        tmp_path, monkeypatch):
    # Event times an hour ahead: only `feed` (a fixed rate) waits for them to fall due.
    config = NexmarkConfig(num_events=50, base_time_ms=int((time.time() + 3600) * 1000))

    def no_sleep(seconds):
        raise AssertionError(f'write_event_files slept {seconds:.0f} s')
    monkeypatch.setattr(stream_files.time, 'sleep', no_sleep)
    written = stream_files.write_event_files(config, str(tmp_path), events_per_file=20)
    assert written.num_events == 50
    assert os.path.exists(tmp_path / stream_files.END_FILE)


def test_peak_memory_counts_the_child_processes():
    with PeakMemory(interval_s=0.05) as peak:
        subprocess.run([sys.executable, '-c',
                        'x = bytearray(200 * 2**20); import time; time.sleep(0.5)'], check=True)
    assert peak.mb > 200


def test_config_args_make_the_config_again():
    config = NexmarkConfig(num_events=1234, window_size_sec=2, window_period_sec=1)
    again, rest = NexmarkConfig.from_args(config_args(config))
    assert again == config and rest == []


def test_latency_percentiles():
    records = [{'window': None, 'timestamp': 1_000_000, 'emitted': 1.0 + i / 100}
               for i in range(101)]
    records.append({'window': None, 'timestamp': 'end', 'emitted': 5.0})  # no event time
    p50, p99 = latencies(records)
    assert p50 == pytest.approx(0.5) and p99 == pytest.approx(0.99)
    assert latencies([]) == (None, None)


def _stream(q, system, on, eps, equal='yes'):
    return StreamRow(q, system.name, on, None, events=1000, wall_s=1000 / eps,
                     events_per_s=eps, peak_mb=500, outputs=10, equal=equal)


def test_report_tables_goals_and_plots(tmp_path):
    batch = [BatchRow(Row(5, 'StreamsSparkRunner', 1000, 1.0, 1000.0, 3, 'yes'), 900.0),
             BatchRow(Row(5, 'DirectRunner', 1000, 2.0, 500.0, 3, 'reference'), 300.0),
             BatchRow(Row(5, 'FlinkNative', 1000, 4.0, 250.0, 3, 'no'), 700.0)]
    streaming = [_stream(5, OURS, False, 900.0), _stream(5, OURS, True, 800.0),
                 _stream(5, FLINK_DATASTREAM, True, 400.0),
                 _stream(5, SPARK_STATE, True, 1600.0),
                 _stream(5, FLINK_SQL, True, 2000.0), _stream(5, SPARK_SQL, True, 400.0),
                 _stream(7, OURS, True, 800.0), _stream(7, SPARK_STATE, True, 100.0, 'failed: x')]
    text = report.write_report(str(tmp_path), ['# title', 'Machine: x'], batch, streaming,
                               ['* a note'])
    assert '| Q5 | 1,000 | 500 | failed | 2.00 | - |' in text  # a wrong output is no figure
    assert '| Q5 | StreamsSparkRunner | 900 | 800 | 0.89 | - |' in text
    assert 'Q5: this runner with consistent regions 800 events/s, PyFlink (Python ' \
           'DataStream) with checkpoints 400: 2.00x, met' in text
    assert 'transformWithStateInPandas) with checkpoints 1,600: 0.50x, not met' in text
    assert 'Q7: this runner with consistent regions 800 events/s, Spark Structured ' \
           'Streaming (transformWithStateInPandas) with checkpoints failed: ' \
           'not measured (a run failed)' in text
    assert 'Q5: PyFlink (Flink SQL) is faster, 2.50x this runner (2,000 against 800' in text
    assert 'Q5: this runner is faster, 2.00x Spark Structured Streaming (DataFrame) (800 ' \
           'against 400 events/s)' in text
    for name in ('report.md', 'batch.csv', 'streaming.csv', 'throughput.png'):
        assert os.path.getsize(tmp_path / name) > 0


def test_a_report_written_again_from_its_csvs_is_the_same(tmp_path):
    batch = [BatchRow(Row(5, 'StreamsSparkRunner', 1000, 1.0, 1000.0, 3, 'yes'), 900.0),
             BatchRow(Row(5, 'DirectRunner', 1000, 2.0, 500.0, 3, 'reference'), None)]
    streaming = [_stream(5, OURS, False, 900.0), _stream(5, OURS, True, 800.0),
                 StreamRow(5, FLINK_SQL.name, True, 2000.0, events=1000, wall_s=2.0,
                           events_per_s=500.0, peak_mb=400.0, outputs=3, equal='yes',
                           latency_p50_s=0.5, latency_p99_s=1.25, checkpoints_done=2)]
    text = report.write_report(str(tmp_path), ['# title', 'Machine: x'], batch, streaming,
                               ['* a note'])
    assert report.read_rows(str(tmp_path)) == (batch, streaming)
    assert report.rewrite_report(str(tmp_path)) == text


def test_an_earlier_invocations_references_are_not_reused_when_batch_is_measured(tmp_path):
    """The DirectRunner's batch row is its reference run: a cached one would be timed in
    another invocation."""
    for sub in ('references', 'batch', 'events'):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / 'old').write_text('x')
    main.clear_measured_caches(str(tmp_path), batch=False)
    assert (tmp_path / 'references' / 'old').exists()
    main.clear_measured_caches(str(tmp_path), batch=True)
    assert not (tmp_path / 'references').exists() and not (tmp_path / 'batch').exists()
    assert (tmp_path / 'events' / 'old').exists()  # the events are the same events
