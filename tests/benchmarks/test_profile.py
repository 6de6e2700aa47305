"""`benchmarks.profile.summarize`: py-spy's collapsed stacks into where the time goes."""

from benchmarks import profile

_RAW = '\n'.join([
    'process 1:"python -m launcher";run (driver.py:3);wait (socket.py:9) 5',
    'process 1:"python -m launcher";process 2:"python3 -m beam_streams_runner.worker.daemon";'
    'manager (daemon.py:1);worker (daemon.py:2);run_stage (batch_tasks.py:5);'
    'process_bundle (bundle_processor.py:7);next_event (generator.py:2) 6',
    'process 1:"python -m launcher";process 2:"python3 -m beam_streams_runner.worker.daemon";'
    'manager (daemon.py:1);worker (daemon.py:2);run_stage (batch_tasks.py:5);'
    'advance (group_by_key.py:4) 3',
    'process 1:"python -m launcher";process 2:"python3 -m beam_streams_runner.worker.daemon";'
    'manager (daemon.py:1);worker (daemon.py:2);dump_stream (serializers.py:8) 1',
    'process 1:"python -m launcher";process 2:"python3 -m beam_streams_runner.worker.daemon";'
    'manager (daemon.py:1);poll (selectors.py:3) 2',
]) + '\n'


def test_summary_splits_driver_and_workers_and_categories(tmp_path):
    raw = tmp_path / 'profile.raw'
    raw.write_text(_RAW)
    report = profile.summarize(str(raw), top=3)
    assert '| Python workers | 10 |' in report and '| driver | 5 |' in report
    assert '| PySpark worker daemon | 2 |' in report
    # The generator frame sits under the SDK harness: first matching category wins.
    assert '| NEXMark generator (shared by every runner) | 60% |' in report
    assert "| runner's GroupByKey (reduce side) | 30% |" in report
    assert '| PySpark (de)serialization and socket I/O | 10% |' in report
    assert '| other | 0% |' in report
    assert '| 9 | 90% | `run_stage @batch_tasks.py` |' in report
    assert 'manager @daemon.py' not in report
