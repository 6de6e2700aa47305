"""`benchmarks.profile.summarize`: py-spy's collapsed stacks into where the time goes."""

import pytest

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


_CHURNING = '\n'.join(
    'process 1:"python -m benchmarks.churning_keys";process 2:"python3 -m daemon";'
    f'manager (daemon.py:1);worker (daemon.py:2);run_stage_epoch (epoch_tasks.py:5);{frames}'
    for frames in (
        'FusedStageOperator.read_residual (par_do.py:1);process_bundle (bundle_processor.py:7) 4',
        'FusedStageOperator._fire (par_do.py:2);DirectTimer.set (direct_user_state.py:3) 1',
        'FusedStageOperator.process_bundle (par_do.py:3);process_bundle (bundle_processor.py:7);'
        'DirectTimer.set (direct_user_state.py:3) 3',
        'PartitionEpoch.commit (partition_epoch.py:4) 2',
    )) + '\n'


def test_summary_names_the_stateful_streaming_paths(tmp_path):
    raw = tmp_path / 'profile.raw'
    raw.write_text(_CHURNING)
    report = profile.summarize(str(raw), top=3)
    # Reads and firing count as such even where the harness or the direct state runs
    # under them.
    assert '| source reads (splittable DoFn, fused steps after it) | 40% |' in report
    assert "| stateful DoFns' timers firing | 10% |" in report
    assert "| stateful DoFns' state and timers (direct user state) | 30% |" in report
    assert '| keyed-state commit | 20% |' in report
    assert "| Beam's SDK harness (user DoFns, coders) | 0% |" in report


def test_a_churning_profile_runs_the_churning_keys_case(monkeypatch, tmp_path):
    commands = []
    monkeypatch.setattr(profile.shutil, 'which', lambda name: '/bin/py-spy')

    def record(command, check):
        commands.append(command)
        out = command[command.index('-o') + 1]
        with open(out, 'w', encoding='utf-8') as f:
            f.write(_CHURNING)
    monkeypatch.setattr(profile.subprocess, 'run', record)
    assert profile.main(['--churning=gbk', '--events=1000', f'--out={tmp_path}',
                         '--spark_master=local[1]']) == 0
    child = commands[0][commands[0].index('--') + 1:]
    assert child[1:] == ['-m', 'benchmarks.churning_keys', '--events=1000', '--case=gbk',
                         '--spark_master=local[1]']
    assert (tmp_path / 'profile.md').read_text().startswith(
        '# Profile: churning keys (gbk), 1000 events, streaming')


def test_an_events_dir_profile_runs_the_comparison_program(monkeypatch, tmp_path):
    commands = []
    monkeypatch.setattr(profile.shutil, 'which', lambda name: '/bin/py-spy')
    stack = ('process 1:"python -m benchmarks.nexmark.beam_streaming";process 2:"daemon";'
             'manager (daemon.py:1);worker (daemon.py:2);read_residual (par_do.py:1);'
             'process (file_stream_source.py:3);loads (__init__.py:4);decode (decoder.py:5) 3\n'
             'process 1:"python";process 2:"daemon";manager (daemon.py:1);'
             'worker (daemon.py:2);read_residual (par_do.py:1);process (query7.py:9) 1\n')

    def record(command, check):
        commands.append(command)
        with open(command[command.index('-o') + 1], 'w', encoding='utf-8') as f:
            f.write(stack)
    monkeypatch.setattr(profile.subprocess, 'run', record)
    assert profile.main(['--query=7', '--events_dir=/ev', '--num_events=500',
                         f'--out={tmp_path}']) == 0
    child = commands[0][commands[0].index('--') + 1:]
    assert child[1:] == ['-m', 'benchmarks.nexmark.beam_streaming', '--query=7',
                         '--events_dir=/ev', f'--records={tmp_path}/records.jsonl',
                         f'--summary={tmp_path}/summary.json', '--num_events=500']
    report = (tmp_path / 'profile.md').read_text()
    # JSON parsing under the file source counts as reading the files, not the fused steps.
    assert '| event files read and parsed (JSON lines) | 75% |' in report
    assert '| source reads (splittable DoFn, fused steps after it) | 25% |' in report


def test_events_dir_needs_a_query(monkeypatch, tmp_path):
    monkeypatch.setattr(profile.shutil, 'which', lambda name: '/bin/py-spy')
    with pytest.raises(SystemExit):
        profile.main(['--churning=gbk', '--events_dir=/ev', f'--out={tmp_path}'])
