"""The runner on a standalone Spark cluster (`beam_streams_runner.cluster`): the
command, the same pipelines unchanged through `--spark_master=spark://...` and through
`spark-submit`, and streaming state across hosts through Redis.

Every pipeline runs as a program of its own, as a user runs it (the test session's
own SparkSession is local), on the session's cluster of two workers, each on an
address of its own (127.0.0.2, 127.0.0.3), and is compared with Beam's DirectRunner
or with the golden output of the fault tests' pipelines.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import sys
import uuid

import pytest

from tests.cluster.fixtures import cli, read_lines, run_program
from tests.faults import harness, judging

STORE_DB = 7  # the session's redis-server: the cluster runs' checkpoints


def test_status_names_the_master_and_each_worker_on_a_host_of_its_own(local_cluster):
    status = cli(local_cluster.directory, 'status')
    assert status.returncode == 0, status.stderr
    assert local_cluster.url in status.stdout
    for host in ('127.0.0.2', '127.0.0.3'):
        assert re.search(rf'worker-\d {re.escape(host)}  up \(ALIVE\)', status.stdout), \
            status.stdout
    assert {w['host'] for w in local_cluster.alive_workers()} == {'127.0.0.2', '127.0.0.3'}


def test_a_second_start_in_the_same_directory_is_refused(local_cluster):
    again = cli(local_cluster.directory, 'start', '--port', '0', '--webui-port', '0')
    assert again.returncode == 1
    assert 'already runs' in again.stderr and local_cluster.url in again.stderr
    assert len(local_cluster.alive_workers()) == 2  # the running cluster is untouched


def _completed_apps(cluster) -> set[str]:
    return {app['id'] for app in (cluster.state() or {}).get('completedapps', [])}


def test_batch_pipeline_unchanged_through_spark_master(local_cluster, words, words_direct,
                                                       tmp_path):
    before = _completed_apps(local_cluster)
    out = str(tmp_path / 'counts')
    done = run_program([sys.executable, '-m', 'beam_streams_runner.examples.wordcount',
                        '--runner=StreamsSparkRunner', f'--spark_master={local_cluster.url}',
                        f'--input={words}', f'--output={out}'])
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_lines(out) == words_direct
    assert len(_completed_apps(local_cluster) - before) == 1  # it ran on the cluster


def _spark_submit() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), 'spark-submit')
    return beside if os.access(beside, os.X_OK) else shutil.which('spark-submit')


def test_spark_submit_runs_the_same_program_on_the_cluster(local_cluster, words,
                                                           words_direct, tmp_path):
    """Client mode: spark-submit starts the JVM, the runner's session takes its master."""
    import beam_streams_runner.examples.wordcount as example
    before = _completed_apps(local_cluster)
    out = str(tmp_path / 'counts')
    # As in an activated virtualenv: spark-submit runs the program with `python3` from PATH.
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', '')
    done = run_program([_spark_submit(), '--master', local_cluster.url, example.__file__,
                        '--runner=StreamsSparkRunner', f'--input={words}', f'--output={out}'],
                       env={'PATH': path})
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_lines(out) == words_direct
    assert len(_completed_apps(local_cluster) - before) == 1


def test_nexmark_on_the_cluster_equals_the_reference(local_cluster, tmp_path):
    """Query 5 (hot items: sliding windows, a combine, then a fan-in with a side input)."""
    done = run_program([sys.executable, '-m', 'benchmarks.nexmark', '--runner',
                        'StreamsSparkRunner', '--query', '5', '--events', '3000',
                        '--out', str(tmp_path), f'--spark_master={local_cluster.url}'])
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / 'results.csv', encoding='utf-8') as f:
        rows = [r for r in csv.DictReader(f) if r['runner'] == 'StreamsSparkRunner']
    assert [r['query'] for r in rows] == ['5']
    assert all(r['equal_to_reference'] == 'yes' and int(r['output_count']) > 0
               for r in rows), rows


def _streaming_run(cluster, redis_server, tmp_path, pipeline: str, *extra: str,
                   span_s: int = harness.SPAN_S):
    run_id = uuid.uuid4().hex[:8]
    spec = harness.Spec(pipeline, 'files', str(tmp_path / f'out-{run_id}' / 'out'), 0,
                        span_s=span_s)
    spec_file = harness.write_spec(spec, str(tmp_path / f'spec-{run_id}.json'))
    flags = harness.runner_flags(f'cluster-{run_id}', redis_server.url_of(STORE_DB),
                                 master=cluster.url, extra=extra)
    done = harness.run_subprocess(spec_file, flags, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    return harness.read_spec(spec_file), done


@pytest.mark.parametrize('pipeline', ['combine', 'side_input'])
def test_streaming_pipeline_exact_on_the_cluster(local_cluster, redis_server, tmp_path,
                                                 pipeline):
    """P2 (keyed count), P5 (streaming side input), checkpoints in Redis (P4, timers, is
    the next test's)."""
    spec, _ = _streaming_run(local_cluster, redis_server, tmp_path, pipeline)
    judging.check_exact(spec, None)


def test_state_moving_between_hosts_every_epoch_catches_up_from_redis(
        local_cluster, redis_server, tmp_path):
    """Every task's process forgets the state it committed, so each epoch's task loads
    its partition's state from Redis, as one on another host than the last must."""
    from beam_streams_runner.worker.partition_cache import STATE_MOVES_ENV
    # A longer stream than the other runs': more epochs after the first, on any machine.
    spec, done = _streaming_run(local_cluster, redis_server, tmp_path, 'stateful',
                                f'--spark_conf=spark.executorEnv.{STATE_MOVES_ENV}=1',
                                span_s=10)
    judging.check_exact(spec, None)
    # Each epoch after the first loads every state it touches from the store.
    loads = re.findall(r'(\d+) of (\d+) state loads from the store', done.stderr)
    assert len(loads) >= 2, done.stderr[-3000:]
    assert all(int(a) == int(b) > 0 for a, b in loads), (loads, done.stderr[-3000:])
    hosts = set()
    for listed in re.findall(r'on hosts ([\d., ]+)', done.stderr):
        hosts.update(h.strip() for h in listed.split(','))
    assert {'127.0.0.2', '127.0.0.3'} <= hosts, done.stderr[-3000:]
