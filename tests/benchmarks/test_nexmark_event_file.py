"""NEXMark events in a JSON-lines file: the round trip, the launcher's `--input`, and
the same query outputs from the file as from the generator (Beam and native PySpark)."""

from __future__ import annotations

import pytest

from beam_streams_runner import StreamsSparkRunner
from benchmarks.nexmark import event_file, launcher, runs, spark_baselines
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import events


def test_every_event_reads_back_as_generated(tmp_path):
    config = NexmarkConfig(num_events=3000)
    path = str(tmp_path / 'events.json')
    assert event_file.write_events(config, path) == 3000
    with open(path, encoding='utf-8') as f:
        read = [event_file.parse_line(line) for line in f]
    generated = list(events(config))
    assert len(read) == len(generated)
    for back, made in zip(read, generated, strict=True):
        assert type(back.event) is type(made.event)
        assert vars(back.event) == vars(made.event)
        assert back.timestamp_ms == made.timestamp_ms and back.timestamp == made.timestamp
    assert {type(e.event).__name__ for e in read} == {'Person', 'Auction', 'Bid'}


def test_an_input_file_of_another_event_set_is_refused(tmp_path):
    path = str(tmp_path / 'events.json')
    event_file.ensure_events(NexmarkConfig(num_events=100), path)
    event_file.ensure_events(NexmarkConfig(num_events=100), path)  # kept as it is
    with pytest.raises(ValueError, match='holds 100 events, the run asks for 200'):
        event_file.ensure_events(NexmarkConfig(num_events=200), path)


def test_every_batch_run_but_streaming_reads_the_input_file(tmp_path):
    path = str(tmp_path / 'events.json')

    def plan(*argv: str) -> list[tuple[str, tuple[str, ...]]]:
        args, rest = launcher.build_parser().parse_known_args(
            ['--query', '0', '--native', 'spark', '--input', path, *argv])
        return [(spec.role, spec.args) for spec in launcher.plan_runs(args, [0], rest)]
    read = f'--input={path}'
    assert [role for role, args in plan() if read in args] == [
        'tested', 'reference', launcher.DIRECT_2P, 'native']
    with pytest.raises(SystemExit):
        launcher.main(['--query=0', '--events=10', f'--input={path}', '--with-streaming',
                       '--out', str(tmp_path / 'out')])


@pytest.mark.parametrize('query', [2, 5])
def test_a_query_over_the_file_equals_the_query_over_the_generator(
        query, spark_session, spark_args, tmp_path):
    config = NexmarkConfig(num_events=10_000 if query == 2 else 1000)
    path = str(tmp_path / 'events.json')
    event_file.write_events(config, path)
    generated = runs.run_query(query, StreamsSparkRunner(), config, spark_args,
                               str(tmp_path / 'generated'))
    from_file = runs.run_query(query, StreamsSparkRunner(), config, spark_args,
                               str(tmp_path / 'file'), input_path=path)
    assert generated.ok and from_file.ok, (generated.error, from_file.error)
    assert from_file.output_count > 0
    assert from_file.lines == generated.lines
    native = spark_baselines.run_baseline(query, config, spark_session, input_path=path)
    assert native == generated.lines
