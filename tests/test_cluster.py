"""Tests of `beam_streams_runner.cluster` that start no daemon: the layout a start
would use and the command's answers without a cluster. Starting, stopping and running
pipelines on a cluster are the tests of `tests/cluster/`."""

from __future__ import annotations

import os

import pytest

from beam_streams_runner import cluster
from beam_streams_runner.cluster import ClusterError, LocalCluster


def test_plan_gives_each_worker_an_address_and_directory_of_its_own(tmp_path):
    planned = LocalCluster.plan(str(tmp_path), workers=3, port=0, webui_port=0)
    hosts = [w.host for w in planned.workers]
    if cluster.worker_host(0) != '127.0.0.1':  # Linux: all of 127.0.0.0/8 is this machine
        assert hosts == ['127.0.0.2', '127.0.0.3', '127.0.0.4']
    assert len({w.directory for w in planned.workers}) == 3
    ports = [planned.port, planned.master.ui_port, *(w.ui_port for w in planned.workers)]
    assert all(p > 0 for p in ports) and len(set(ports)) == len(ports)
    assert planned.url == f'spark://127.0.0.1:{planned.port}'
    assert planned.cores >= 1 and planned.python


def test_layout_is_saved_and_loaded(tmp_path):
    planned = LocalCluster.plan(str(tmp_path), workers=2, port=0, webui_port=0)
    planned.save()
    assert LocalCluster.load(str(tmp_path)) == planned


def test_no_cluster_in_a_directory_is_said_plainly(tmp_path, capsys):
    with pytest.raises(ClusterError, match=r'No local cluster in .*start one'):
        LocalCluster.load(str(tmp_path))
    assert cluster.main(['--dir', str(tmp_path), 'status']) == 1
    assert 'No local cluster' in capsys.readouterr().err


def test_busy_ports_are_refused_before_anything_starts(tmp_path):
    import socket
    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0))
        taken.listen()
        planned = LocalCluster.plan(str(tmp_path), port=taken.getsockname()[1], webui_port=0)
        with pytest.raises(ClusterError, match='already in use'):
            planned.start()
    assert not os.path.exists(os.path.join(tmp_path, 'master.log'))


def test_at_least_one_worker(tmp_path):
    with pytest.raises(ClusterError, match='at least 1'):
        LocalCluster.plan(str(tmp_path), workers=0)
