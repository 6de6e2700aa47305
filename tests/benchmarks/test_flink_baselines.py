"""The PyFlink baselines (`benchmarks/nexmark/flink_baselines.py`, optional extra).

PyFlink lives in its own virtualenv (`.venv-flink`, made by
`benchmarks/nexmark/setup_flink_venv.sh`) because it pins an old apache-beam. The tests
that run Flink are skipped when that venv does not exist (CI does not need PyFlink); the
record-to-line conversion and the missing-venv row are tested always.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp

from benchmarks.nexmark import flink_baselines, launcher, native, verdicts
from benchmarks.nexmark.capture import output_line
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import events
from benchmarks.nexmark.native import (
    NATIVE_FLINK,
    flink_python,
    flink_record_line,
    run_native_flink,
)
from benchmarks.nexmark.report import make_row
from benchmarks.nexmark.runs import run_query
from benchmarks.nexmark.verdicts import compare_outputs

HAVE_FLINK_VENV = os.path.exists(flink_python())
needs_flink = pytest.mark.skipif(
    not HAVE_FLINK_VENV,
    reason='PyFlink venv (.venv-flink) not found: PyFlink is an optional extra; create it '
           'with `bash benchmarks/nexmark/setup_flink_venv.sh`')

# As the Spark baseline tests: Q2 needs ~10,000 events to select a bid, Q3 ~30,000 for a
# seller to reach its 30-element pane.
EVENTS = {0: 1000, 1: 2000, 2: 10000, 3: 30000, 5: 2000, 7: 2000}


def test_records_become_the_canonical_lines_of_the_same_elements():
    config = NexmarkConfig(num_events=60)
    for e in events(config):
        plain = flink_baselines.plain_event(e)
        record = flink_baselines.record(flink_baselines.model_element(plain[0], plain[2]),
                                        None, plain[1] * 1000)
        record = json.loads(json.dumps(record))  # as it travels
        assert flink_record_line(record) == output_line(e.event, GlobalWindow(), e.timestamp)
    window = IntervalWindow(Timestamp(10), Timestamp(20))
    record = json.loads(json.dumps(flink_baselines.record(
        {'dict': {'auction_id': 1000, 'num': 3}}, (10_000, 20_000), 'end')))
    assert flink_record_line(record) == output_line(
        {'auction_id': 1000, 'num': 3}, window, Timestamp(micros=19_999_000))
    global_end = flink_record_line(json.loads(json.dumps(
        flink_baselines.record({'dict': {'a': 1}}, None, 'end'))))
    end = GlobalWindow().max_timestamp().micros // 1000 * 1000
    assert global_end == output_line({'a': 1}, GlobalWindow(), Timestamp(micros=end))


def test_missing_venv_is_a_failed_row_saying_how_to_create_it(tmp_path, monkeypatch):
    missing = tmp_path / 'no-such-venv'
    monkeypatch.setenv('FLINK_VENV', str(missing))
    assert flink_python() == str(missing / 'bin' / 'python')
    for sub in ('outputs', 'logs'):
        (tmp_path / sub).mkdir()
    config = NexmarkConfig(num_events=10)
    # As the launcher runs a `--native flink` row and gives it its verdict.
    result, cached = launcher.execute(launcher.RunSpec(0, 'native', NATIVE_FLINK), config,
                                      ['--num_events=10'], str(tmp_path), 60.0)
    assert not cached and not result.ok and result.runner == NATIVE_FLINK
    assert str(missing) in result.error
    assert '`bash benchmarks/nexmark/setup_flink_venv.sh`' in result.error
    row = make_row(result, *verdicts.equality_verdict(0, result, None, config))
    assert row.runner == NATIVE_FLINK and row.output_count == 0
    assert row.equal.startswith('failed: PyFlink virtualenv missing')
    assert 'bash benchmarks/nexmark/setup_flink_venv.sh' in row.equal


def test_the_venv_is_looked_for_in_the_repository_by_default(monkeypatch):
    monkeypatch.delenv('FLINK_VENV', raising=False)
    assert flink_python() == os.path.join(native.REPO_ROOT, '.venv-flink', 'bin', 'python')


@needs_flink
def test_the_launcher_finds_the_venv_where_flink_venv_points(tmp_path, monkeypatch):
    venv = os.path.dirname(os.path.dirname(flink_python()))
    link = tmp_path / 'elsewhere'
    link.symlink_to(venv)  # the same venv under another name: FLINK_VENV is followed
    monkeypatch.setenv('FLINK_VENV', str(link))
    assert flink_python() == str(link / 'bin' / 'python')
    for sub in ('outputs', 'logs'):
        (tmp_path / sub).mkdir()
    result = run_native_flink(0, ['--num_events=10'], str(tmp_path), 10, 600.0)
    assert result.ok, result.error
    assert result.output_count == 10
    with open(tmp_path / 'logs' / f'q0-{NATIVE_FLINK}.log', encoding='utf-8') as log:
        assert log.readline().startswith(str(link / 'bin' / 'python'))


@needs_flink
def test_generator_in_the_flink_venv_gives_the_same_events():
    # The venv's apache-beam is older: the generator must import and agree there.
    script = ('import json; from benchmarks.nexmark.config import NexmarkConfig; '
              'from benchmarks.nexmark.generator import events; '
              'from benchmarks.nexmark.flink_baselines import plain_event; '
              'print(json.dumps([plain_event(e) for e in events(NexmarkConfig(num_events=300))]))')
    env = dict(os.environ, PYTHONPATH=native.REPO_ROOT)
    out = subprocess.run([flink_python(), '-c', script], env=env, cwd=native.REPO_ROOT,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    theirs = json.loads(out.strip().splitlines()[-1])
    ours = [list(flink_baselines.plain_event(e)) for e in events(NexmarkConfig(num_events=300))]
    assert theirs == json.loads(json.dumps(ours))


@needs_flink
@pytest.mark.parametrize('query', flink_baselines.BASELINE_QUERIES)
def test_flink_baseline_equals_beam_on_direct_runner(query, tmp_path):
    config = NexmarkConfig(num_events=EVENTS[query])
    reference = run_query(query, 'DirectRunner', config)
    assert reference.ok, reference.error
    assert reference.lines
    for sub in ('outputs', 'logs'):
        (tmp_path / sub).mkdir()
    result = run_native_flink(query, [f'--num_events={config.num_events}'], str(tmp_path),
                              config.num_events, 900.0)
    assert result.ok, result.error
    comparison = compare_outputs(result.lines, reference.lines)
    assert comparison.equal, comparison.summary()
