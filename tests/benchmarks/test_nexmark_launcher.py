"""The NEXMark launcher: query parsing, canonical form, equality check, report, end to end.

The Java-backed runners (FlinkRunner, SparkRunner, PortableRunner, `java_runners`) are
tested against ports with nothing listening (their rows fail at once, naming what is
missing), a port that is not a gRPC server, and Beam's own Python job service (a real
job server: the PortableRunner row is equal to the reference).

The end-to-end tests run every query Q0-Q12 in this process (not in subprocesses as the
launcher does) on StreamsSparkRunner, sharing the test session's SparkSession, and on the
reference runner (DirectRunner; BundleBasedDirectRunner for Q4/Q6/Q9), each at the
smallest size at which it has output (1,000 events for most).
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator

import pytest
from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Bid
from apache_beam.utils.timestamp import Timestamp

from beam_streams_runner import StreamsSparkRunner
from benchmarks.nexmark import java_runners, launcher, report, runs, verdicts
from benchmarks.nexmark.capture import canonical
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.launcher import parse_queries, reference_for
from benchmarks.nexmark.verdicts import (
    RunResult,
    compare_outputs,
    deterministic_lines,
    equality_verdict,
)

# Events of the end-to-end runs, per query (default 1,000): see `e2e_config`.
E2E_EVENTS = {2: 10_000, 3: 20_000}


# ---------------------------------------------------------------- unit level


def test_parse_queries():
    assert parse_queries('0-3,5') == [0, 1, 2, 3, 5]
    assert parse_queries('5,0-1,1') == [0, 1, 5]
    assert parse_queries('0-12') == list(range(13))
    for bad in ('', '13', '5-3', 'x'):
        with pytest.raises(ValueError):
            parse_queries(bad)


def test_reference_for_merging_window_queries():
    assert reference_for(4, 'DirectRunner') == 'BundleBasedDirectRunner'
    assert reference_for(9, 'DirectRunner') == 'BundleBasedDirectRunner'
    assert reference_for(5, 'DirectRunner') == 'DirectRunner'
    assert reference_for(4, 'StreamsSparkRunner') == 'StreamsSparkRunner'


def test_canonical_form_is_order_independent():
    a = {'b': [3, 1, 2], 'a': {2, 1}, 'c': (2, 1)}
    b = {'c': (2, 1), 'a': {1, 2}, 'b': [2, 3, 1]}
    assert canonical(a) == canonical(b)
    # Tuples keep their order; different values differ.
    assert canonical((1, 2)) != canonical((2, 1))
    assert canonical({'a': 1}) != canonical({'a': 2})
    bid1 = Bid(1000, 1001, 5, Timestamp(10), 'x')
    bid2 = Bid(1000, 1001, 5, Timestamp(10), 'x')
    bid2.__dict__ = dict(reversed(list(bid2.__dict__.items())))
    assert canonical([bid1, 7]) == canonical([7, bid2])
    assert canonical(bid1).startswith('Bid(auction=1000, bidder=1001, date_time=')
    assert canonical(bid1) != canonical(Bid(1000, 1001, 6, Timestamp(10), 'x'))


def _result(lines, runner='R', ok=True, error=''):
    return RunResult(0, runner, 10, ok=ok, output_count=len(lines), error=error,
                     lines=sorted(lines))


def test_equality_check_reports_a_wrong_output_as_different():
    reference = ['{\'a\': 1}\tGlobalWindow\tTimestamp(1.000000)',
                 '{\'a\': 2}\tGlobalWindow\tTimestamp(1.000000)']
    assert compare_outputs(sorted(reversed(reference)), reference).equal
    wrong = [reference[0], '{\'a\': 3}\tGlobalWindow\tTimestamp(1.000000)']
    comparison = compare_outputs(wrong, reference)
    assert not comparison.equal
    assert comparison.only_in_tested == [wrong[1]]
    assert comparison.only_in_reference == [reference[1]]
    # A duplicated or missing line is a difference too (multisets, not sets).
    assert not compare_outputs([*reference, reference[0]], reference).equal
    assert not compare_outputs(reference[:1], reference).equal
    config = NexmarkConfig(num_events=10)
    assert equality_verdict(0, _result(reference), _result(reference), config)[0] == 'yes'
    assert equality_verdict(0, _result(wrong), _result(reference), config)[0] == 'no'
    verdict, _ = equality_verdict(0, _result([], ok=False, error='TypeError: x'),
                                  _result(reference), config)
    assert verdict == 'failed: TypeError: x'


def test_streaming_row_is_compared_with_batch_and_gives_the_ratio():
    lines = ['{\'a\': 1}\tGlobalWindow\tTimestamp(1.000000)']
    batch, streamed = _result(lines), _result(lines)
    batch.wall_s, streamed.wall_s = 2.0, 4.0
    config = NexmarkConfig(num_events=10)
    row = launcher.streaming_row(0, streamed, batch, _result(lines, runner='Ref'), config)
    assert (row.runner, row.equal) == ('R (streaming)', 'yes')
    assert row.note.startswith('0.50x the events/s of its batch run')
    wrong = _result(['{\'a\': 2}\tGlobalWindow\tTimestamp(1.000000)'])
    wrong.wall_s = 1.0
    assert launcher.streaming_row(0, wrong, batch, None, config).equal == 'no'


def test_every_native_baseline_of_a_query_gets_its_row():
    lines = ['{\'a\': 1}\tGlobalWindow\tTimestamp(1.000000)']
    spec = launcher.RunSpec
    runs = {spec(0, 'tested', 'R'): (_result(lines), False),
            spec(0, 'reference', 'DirectRunner'): (_result(lines, runner='DirectRunner'), False),
            spec(0, 'native', 'SparkNative'): (_result(lines, runner='SparkNative'), False),
            spec(0, 'native', 'FlinkNative'): (_result(['x'], runner='FlinkNative'), False)}
    rows = launcher.rows_of_query(0, runs, NexmarkConfig(num_events=10), False)
    assert [(r.runner, r.equal) for r in rows] == [
        ('R', 'yes'), ('DirectRunner', 'reference'), ('SparkNative', 'yes'),
        ('FlinkNative', 'no')]


def test_sub_millisecond_timestamp_difference_is_reported():
    tested = ['1\t[0.0, 10.0)\tTimestamp(9.999000)']
    reference = ['1\t[0.0, 10.0)\tTimestamp(9.999999)']
    verdict, note = equality_verdict(5, _result(tested), _result(reference),
                                     NexmarkConfig(num_events=10))
    assert verdict == 'no (equal to the ms)'
    assert 'below 1 ms' in note
    # A whole second prints without its fraction (window end 10.001: end - 1 ms = 10.0).
    verdict, _ = equality_verdict(9, _result(['1\t[0.0, 10.001)\tTimestamp(10)']),
                                  _result(['1\t[0.0, 10.001)\tTimestamp(10.000999)']),
                                  NexmarkConfig(num_events=10))
    assert verdict == 'no (equal to the ms)'


def test_q12_is_compared_on_total_count_per_bidder():
    pane1 = ["{'bid_count': 2, 'bidder_id': 7}\tGlobalWindow\tTimestamp(5.000000)",
             "{'bid_count': 1, 'bidder_id': 8}\tGlobalWindow\tTimestamp(5.000000)"]
    pane2 = ["{'bid_count': 3, 'bidder_id': 7}\tGlobalWindow\tTimestamp(9.000000)"]
    one_pane = ["{'bid_count': 5, 'bidder_id': 7}\tGlobalWindow\tTimestamp(1.000000)",
                "{'bid_count': 1, 'bidder_id': 8}\tGlobalWindow\tTimestamp(1.000000)"]
    assert deterministic_lines(12, pane1 + pane2) == deterministic_lines(12, one_pane)
    assert deterministic_lines(12, pane1) != deterministic_lines(12, one_pane)
    # Other queries: every line counts.
    assert deterministic_lines(0, pane1 + pane2) == sorted(pane1 + pane2)


def test_q12_oracle_counts_bids_per_bidder():
    config = NexmarkConfig(num_events=200)
    lines = verdicts.oracle_lines(12, config)
    assert sum(int(line.rsplit('=', 1)[1]) for line in lines) == sum(
        1 for n in range(200) if n % 50 >= 4)  # 46 of every 50 events are bids


def test_report_files(tmp_path):
    rows = [report.make_row(RunResult(q, runner, 100, ok=q != 6, output_count=3,
                                      wall_s=2.0, error='TypeError: x'),
                            'yes' if q != 6 else 'failed: TypeError: x')
            for q in (0, 6) for runner in ('StreamsSparkRunner', 'DirectRunner')]
    report.write_report(str(tmp_path), rows, 'python -m benchmarks.nexmark --query=0,6')
    with open(tmp_path / 'results.csv', encoding='utf-8') as f:
        table = list(csv.DictReader(f))
    assert [r['query'] for r in table] == ['0', '0', '6', '6']
    assert table[0]['events_per_s'] == '50.0'
    text = (tmp_path / 'report.md').read_text(encoding='utf-8')
    assert 'PySpark' in text and '| Q6 | StreamsSparkRunner |' in text
    assert (tmp_path / 'nexmark.png').stat().st_size > 1000
    assert 'Q6' in report.format_table(rows)


def test_command_line_runs_each_query_in_a_subprocess(tmp_path, monkeypatch):
    out = tmp_path / 'out'
    monkeypatch.setenv('NEXMARK_REFERENCE_CACHE', str(tmp_path / 'cache'))
    code = launcher.main(['--runner=DirectRunner', '--query=1', '--events=200',
                          '--compare', 'BundleBasedDirectRunner', '--out', str(out)])
    assert code == 0
    with open(out / 'results.csv', encoding='utf-8') as f:
        rows = list(csv.DictReader(f))
    assert [(r['runner'], r['equal_to_reference']) for r in rows] == [
        ('DirectRunner', 'yes'), ('BundleBasedDirectRunner', 'reference')]
    assert float(rows[0]['wall_s']) > 0 and int(rows[0]['output_count']) > 0
    assert os.path.exists(out / 'report.md') and os.path.exists(out / 'nexmark.png')


# ---------------------------------------------------------------- end to end


def e2e_config(query: int) -> NexmarkConfig:
    """The smallest NEXMark size at which `query` has output on every runner: no auction
    id of the first 1,000 events is a multiple of Q2's auction_skip (123), and no seller
    of the first 10,000 has Q3's 30 grouped elements with a person of OR/ID/CA."""
    return NexmarkConfig(num_events=E2E_EVENTS.get(query, 1000))


@pytest.mark.parametrize('query', list(range(13)))
def test_query_on_streams_spark_runner_equals_reference(
        query, spark_session, spark_args, tmp_path):
    config = e2e_config(query)
    tested = runs.run_query(query, StreamsSparkRunner(), config, spark_args,
                            str(tmp_path / 'spark'))
    reference = runs.run_query(query, reference_for(query, 'DirectRunner'), config,
                               (), str(tmp_path / 'reference'))
    verdict, note = equality_verdict(query, tested, reference, config)
    if query == 6:
        # Beam's query6 negates a Timestamp: it fails on every runner, and says so.
        assert not tested.ok and not reference.ok
        assert 'unary -' in tested.error and 'unary -' in reference.error
        assert verdict.startswith('failed: ') and 'unary -' in verdict
        return
    assert tested.ok, tested.error
    assert tested.output_count > 0
    if query == 12:
        # The DirectRunner fails on processing-time triggers in batch; the total count
        # per bidder is compared with the generator oracle instead.
        assert not reference.ok and "'time'" in reference.error
        assert verdict == 'yes', note
        assert 'count per bidder' in note
        return
    assert reference.ok, reference.error
    if query in (4, 9):
        # Reference: BundleBasedDirectRunner, which keeps end-of-window timestamps at
        # end - 1 us where encoding runners (DirectRunner, StreamsSparkRunner) have
        # end - 1 ms; elements and windows must be equal (see the launcher's MS_NOTE).
        assert verdict in ('yes', 'no (equal to the ms)'), note
        assert tested.output_count == reference.output_count
        return
    assert verdict == 'yes', note


def test_empty_outputs_are_never_equal():
    config = NexmarkConfig(num_events=10)
    verdict, note = equality_verdict(2, _result([]), _result([]), config)
    assert verdict == 'empty' and 'nothing was compared' in note
    line = '{\'a\': 1}\tGlobalWindow\tTimestamp(1.000000)'
    assert equality_verdict(2, _result([]), _result([line]), config)[0] == 'no'
    assert equality_verdict(2, _result([line]), _result([]), config)[0] == 'no'


def test_q10_is_captured_by_the_log_files_it_writes(tmp_path):
    config = NexmarkConfig(num_events=200)
    result = runs.run_query(10, 'DirectRunner', config, (), str(tmp_path))
    assert result.ok, result.error
    # One line per logged event, in its 10 s window, fired on time.
    assert result.output_count == 200
    assert all(line.endswith('\tLOG pane ON_TIME') for line in result.lines)
    assert sum(line.startswith('Bid(') for line in result.lines) == 184


def test_a_cluster_master_gets_the_benchmarks_package_as_py_files(tmp_path):
    local = ['--spark_master=local[2]', '--bundle_size=10']
    assert runs.ship_benchmarks(local, str(tmp_path)) == local
    assert runs.ship_benchmarks(['--bundle_size=10'], str(tmp_path)) == ['--bundle_size=10']
    shipped = runs.ship_benchmarks(['--spark_master=spark://127.0.0.1:7077',
                               '--spark_conf=spark.submit.pyFiles=/a/mine.py'], str(tmp_path))
    archive = str(tmp_path / 'benchmarks.zip')
    assert shipped[-1] == f'--spark_conf=spark.submit.pyFiles=/a/mine.py,{archive}'
    with zipfile.ZipFile(archive) as zipped:
        names = set(zipped.namelist())
    assert {'benchmarks/__init__.py', 'benchmarks/nexmark/runs.py'} <= names
    assert all(name.endswith('.py') for name in names)


def test_the_two_process_direct_runner_rows_can_be_left_out():
    def roles(*argv: str) -> list[str]:
        args, rest = launcher.build_parser().parse_known_args(['--query', '0', *argv])
        return [spec.role for spec in launcher.plan_runs(args, [0], rest)]
    assert roles() == ['tested', 'reference', launcher.DIRECT_2P]
    assert roles('--no-direct-2p') == ['tested', 'reference']


# ---------------------------------------------------------------- Java-backed runners


def free_port() -> int:
    """A TCP port with nothing listening: bound by the OS, then closed."""
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def reference_cache(tmp_path_factory) -> str:
    """One reference cache for the module: Q0's DirectRunner reference runs once."""
    return str(tmp_path_factory.mktemp('reference-cache'))


def launcher_rows(argv: list[str], out, cache: str, monkeypatch) -> list[dict]:
    """The results.csv rows of a launcher run of Q0 over 200 events with `argv`."""
    monkeypatch.setenv('NEXMARK_REFERENCE_CACHE', cache)
    code = launcher.main([*argv, '--query=0', '--events=200', '--no-direct-2p',
                          '--out', str(out)])
    assert code == 0
    with open(out / 'results.csv', encoding='utf-8') as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(120)
@pytest.mark.parametrize('runner,option', [('PortableRunner', 'job_endpoint'),
                                           ('FlinkRunner', 'flink_master')])
def test_a_java_runner_without_its_server_fails_at_once_naming_it(
        runner, option, tmp_path, reference_cache, monkeypatch):
    port = free_port()
    rows = launcher_rows([f'--runner={runner}', f'--{option}=localhost:{port}'],
                         tmp_path / 'out', reference_cache, monkeypatch)
    assert [r['runner'] for r in rows] == [runner, 'DirectRunner']
    verdict = rows[0]['equal_to_reference']
    assert verdict.startswith('failed: JobServerUnavailable: '), verdict
    assert f'localhost:{port} (--{option}): connection refused' in verdict
    assert 'start' in verdict and not verdict.endswith('...')
    assert rows[1]['equal_to_reference'] == 'reference'


@pytest.fixture
def job_service() -> Iterator[str]:
    """Beam's Python job service (`local_job_service_main`), a real job server, as
    HOST:PORT; stopped after the test."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, '-m', 'apache_beam.runners.portability.local_job_service_main',
         f'--port={port}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while java_runners.job_server_problem(
                'PortableRunner', [f'--job_endpoint=localhost:{port}']):
            assert server.poll() is None and time.monotonic() < deadline, \
                'the job service did not start'
            time.sleep(0.5)
        yield f'localhost:{port}'
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.timeout(180)
def test_the_portable_runner_with_a_running_job_server_equals_the_reference(
        job_service, tmp_path, reference_cache, monkeypatch):
    rows = launcher_rows(['--runner=PortableRunner', f'--job_endpoint={job_service}',
                          '--environment_type=LOOPBACK'],
                         tmp_path / 'out', reference_cache, monkeypatch)
    assert [(r['runner'], r['equal_to_reference']) for r in rows] == [
        ('PortableRunner', 'yes'), ('DirectRunner', 'reference')]
    assert int(rows[0]['output_count']) == 200


@pytest.mark.parametrize('runner,args,expected', [
    ('PortableRunner', [], '--job_endpoint=HOST:PORT'),
    ('PortableRunner', ['--job_endpoint=localhost'], 'is not HOST:PORT'),
    ('FlinkRunner', ['--flink_master=[local]', '--flink_job_server_jar=/no/such.jar'],
     'no job server jar at /no/such.jar (--flink_job_server_jar)'),
    ('SparkRunner', ['--spark_submit_uber_jar'], 'give --spark_rest_url='),
    ('SparkRunner', ['--job_server_java_launcher=/no/java'], "no '/no/java' on PATH"),
    ('apache_beam.runners.portability.flink_runner.FlinkRunner',
     ['--job_endpoint=localhost:{port}'], 'localhost:{port} (--job_endpoint): connection'),
    ('SparkRunner', ['--spark_master_url=spark://localhost:{port}'],
     'localhost:{port} (--spark_master_url): connection refused'),
])
def test_job_server_problems_name_the_option_and_what_to_do(runner, args, expected):
    port = free_port()
    problem = java_runners.job_server_problem(
        runner, [a.format(port=port) for a in args])
    assert problem is not None and expected.format(port=port) in problem
    assert len(problem) <= java_runners.MAX_MESSAGE, problem
    with pytest.raises(java_runners.JobServerUnavailable, match='--'):
        runs.make_runner(runner, [a.format(port=port) for a in args])


def test_a_listener_that_is_no_grpc_server_is_no_job_endpoint(monkeypatch):
    monkeypatch.setattr(java_runners, 'GRPC_READY_TIMEOUT_S', 1.0)
    with socket.socket() as listener:
        # The kernel accepts connections into the backlog; nothing speaks HTTP/2.
        listener.bind(('localhost', 0))
        listener.listen(8)
        endpoint = f'localhost:{listener.getsockname()[1]}'
        problem = java_runners.job_server_problem('FlinkRunner',
                                                  [f'--job_endpoint={endpoint}'])
    assert problem is not None and 'accepts connections but no gRPC job server' in problem


def test_other_runners_are_not_java_runners():
    assert java_runners.java_runner_name('FlinkRunner') == 'FlinkRunner'
    assert java_runners.java_runner_name(
        'apache_beam.runners.portability.spark_runner.SparkRunner') == 'SparkRunner'
    assert java_runners.java_runner_name('mine.FlinkRunner') is None
    for runner in ('DirectRunner', 'StreamsSparkRunner', 'DaskRunner'):
        assert java_runners.job_server_problem(runner, ['--job_endpoint=localhost']) is None
    assert runs.make_runner('DirectRunner', ['--job_endpoint=localhost']) == 'DirectRunner'
