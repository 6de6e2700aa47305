"""A local standalone Spark cluster from the pip-installed PySpark: start, stop, status.

    python -m beam_streams_runner.cluster start --workers 2
    python my_pipeline.py --runner=StreamsSparkRunner --spark_master=spark://127.0.0.1:7077
    python -m beam_streams_runner.cluster status
    python -m beam_streams_runner.cluster stop

Design section 2 (layout) and 1 (a `spark://` master runs unchanged). The master
and each worker are Spark's own daemons (`org.apache.spark.deploy.master.Master`,
`org.apache.spark.deploy.worker.Worker`) started through PySpark's `bin/spark-class`,
so nothing is downloaded. Each worker has a host identity of its own, a loopback
address (127.0.0.2, 127.0.0.3, ... on Linux, where all of 127.0.0.0/8 is this
machine), its own work directory and its own local directories: "same host" means
what it means on a real cluster, and a worker's shuffle files and executors go
with it when it is killed.

Everything the cluster keeps is in one directory (default
`<runner home>/cluster`): `cluster.json` (addresses, ports, pids), each daemon's
log, the workers' directories and the master's recovery directory (the master
runs with `spark.deploy.recoveryMode=FILESYSTEM`, so a master killed and started
again gets its workers and running applications back).

The workers' `python3` is the interpreter that started the cluster (a `bin/python3`
script in the cluster's directory goes first on their PATH; `--python` picks
another): a driver that leaves the executors' Python to PySpark (its default,
`python3`) then gets the Python that has Beam and the runner, as on a cluster
whose machines have the environment installed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence

from beam_streams_runner.regions.commit_records import runner_home

__all__ = ['ClusterError', 'LocalCluster', 'main', 'processes_under']

STATE_FILE = 'cluster.json'
MASTER_CLASS = 'org.apache.spark.deploy.master.Master'
WORKER_CLASS = 'org.apache.spark.deploy.worker.Worker'
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
# In the environment of the cluster's daemons and everything they start (processes_under).
CLUSTER_ENV = 'BEAM_STREAMS_RUNNER_CLUSTER'
# The master and worker JVMs only schedule; executors get their own memory.
DAEMON_MEMORY = '512m'


class ClusterError(RuntimeError):
    """The local cluster could not be started, found or stopped (the message says why)."""


def default_directory() -> str:
    return os.path.join(os.path.abspath(runner_home()), 'cluster')


def spark_home() -> str:
    """The pip-installed PySpark's directory, which is a Spark distribution's layout."""
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _can_bind(host: str, port: int = 0) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = '127.0.0.1') -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def worker_host(index: int) -> str:
    """Worker `index`'s address: a loopback address of its own where the OS has them."""
    host = f'127.0.0.{index + 2}'
    return host if _can_bind(host) else '127.0.0.1'


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        with open(f'/proc/{pid}/stat', encoding='ascii') as stat:
            if stat.read().rsplit(')', 1)[-1].split()[0] == 'Z':
                return False  # a zombie: dead, not yet reaped by its parent
    return True


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding='utf-8', errors='replace') as log:
            return ''.join(log.readlines()[-lines:])
    except OSError:
        return '(no log)'


@dataclasses.dataclass
class Daemon:
    """One of the cluster's JVMs: the master or a worker."""

    name: str
    host: str
    ui_port: int
    directory: str
    pid: int | None = None

    @property
    def log(self) -> str:
        return os.path.join(self.directory, f'{self.name}.log')

    @property
    def alive(self) -> bool:
        return _alive(self.pid)


@dataclasses.dataclass
class LocalCluster:
    """A standalone master and its workers on this machine (see the module docstring)."""

    directory: str
    master: Daemon
    port: int
    workers: list[Daemon]
    cores: int
    memory: str
    python: str

    @classmethod
    def plan(cls, directory: str | None = None, workers: int = 2, cores: int | None = None,
             memory: str = '2g', port: int = 7077, webui_port: int = 8080,
             python: str | None = None) -> LocalCluster:
        """A cluster's layout (nothing started). Port 0 picks a free one."""
        if workers < 1:
            raise ClusterError(f'--workers must be at least 1, not {workers}')
        directory = os.path.abspath(directory or default_directory())
        ui = webui_port or free_port()
        daemons = [Daemon(f'worker-{i + 1}', worker_host(i),
                          webui_port + 1 + i if webui_port else free_port(),
                          os.path.join(directory, f'worker-{i + 1}'))
                   for i in range(workers)]
        return cls(directory=directory, master=Daemon('master', '127.0.0.1', ui, directory),
                   port=port or free_port(), workers=daemons,
                   cores=cores or max(1, (os.cpu_count() or 2) // workers), memory=memory,
                   python=os.path.abspath(python or sys.executable))

    @property
    def url(self) -> str:
        return f'spark://{self.master.host}:{self.port}'

    @property
    def master_ui(self) -> str:
        return f'http://{self.master.host}:{self.master.ui_port}'

    # -- the state file -------------------------------------------------------------

    def save(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        tmp = os.path.join(self.directory, f'.{STATE_FILE}.tmp')
        with open(tmp, 'w', encoding='utf-8') as f:
            json.dump(dataclasses.asdict(self), f, indent=2)
        os.replace(tmp, os.path.join(self.directory, STATE_FILE))

    @classmethod
    def load(cls, directory: str | None = None) -> LocalCluster:
        directory = os.path.abspath(directory or default_directory())
        path = os.path.join(directory, STATE_FILE)
        try:
            with open(path, encoding='utf-8') as f:
                data = json.load(f)
        except FileNotFoundError:
            raise ClusterError(f'No local cluster in {directory} (no {STATE_FILE}); start one '
                               'with: python -m beam_streams_runner.cluster start') from None
        data['master'] = Daemon(**data['master'])
        data['workers'] = [Daemon(**w) for w in data['workers']]
        return cls(**data)

    # -- starting and stopping --------------------------------------------------------

    def _environment(self, daemon: Daemon) -> dict[str, str]:
        from beam_streams_runner.driver.java import ensure_java
        ensure_java()  # sets JAVA_HOME when spark-class would not find a usable Java
        bin_dir = os.path.join(self.directory, 'bin')
        # Not the starting shell's PYTHONPATH: a cluster's machines do not have it, and a
        # source tree on it would shadow the workers' installed runner.
        env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
        env.update({
            'SPARK_HOME': spark_home(),
            'SPARK_LOCAL_IP': daemon.host,
            'SPARK_LOCAL_DIRS': os.path.join(daemon.directory, 'local'),
            'SPARK_DAEMON_MEMORY': DAEMON_MEMORY,
            'PATH': bin_dir + os.pathsep + env.get('PATH', ''),
            'PYTHONHASHSEED': '0',
            CLUSTER_ENV: self.directory,
        })
        return env

    def _link_python(self) -> None:
        # A script, not a symlink: Python finds its virtualenv from the path it is
        # started by, so a link elsewhere to venv/bin/python would run the base Python.
        bin_dir = os.path.join(self.directory, 'bin')
        os.makedirs(bin_dir, exist_ok=True)
        script = os.path.join(bin_dir, 'python3')
        with open(script, 'w', encoding='utf-8') as f:
            f.write(f'#!/bin/sh\nexec {shlex.quote(self.python)} "$@"\n')
        os.chmod(script, 0o755)

    def _launch(self, daemon: Daemon, args: list[str]) -> None:
        os.makedirs(os.path.join(daemon.directory, 'local'), exist_ok=True)
        spark_class = os.path.join(spark_home(), 'bin', 'spark-class')
        with open(daemon.log, 'ab') as log:
            proc = subprocess.Popen([spark_class, *args], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    env=self._environment(daemon), cwd=daemon.directory,
                                    start_new_session=True)
        daemon.pid = proc.pid  # spark-class execs the JVM: this is the daemon's pid
        self.save()

    def start_master(self) -> None:
        """Starts the master (again: it recovers its workers and applications)."""
        recovery = os.path.join(self.directory, 'recovery')
        os.makedirs(recovery, exist_ok=True)
        conf = os.path.join(self.directory, 'master.conf')
        with open(conf, 'w', encoding='utf-8') as f:
            f.write('spark.deploy.recoveryMode FILESYSTEM\n'
                    f'spark.deploy.recoveryDirectory {recovery}\n')
        self._launch(self.master, [MASTER_CLASS, '--host', self.master.host,
                                   '--port', str(self.port),
                                   '--webui-port', str(self.master.ui_port),
                                   '--properties-file', conf])

    def start_worker(self, index: int) -> None:
        """Starts worker `index` (0-based), again after it was killed."""
        worker = self.workers[index]
        self._launch(worker, [WORKER_CLASS, '--host', worker.host,
                              '--cores', str(self.cores), '--memory', self.memory,
                              '--work-dir', os.path.join(worker.directory, 'work'),
                              '--webui-port', str(worker.ui_port), self.url])

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Starts the master and every worker; returns when all workers are registered."""
        try:
            running: LocalCluster | None = LocalCluster.load(self.directory)
        except ClusterError:
            running = None
        if running is not None and any(d.alive for d in [running.master, *running.workers]):
            raise ClusterError(f'A cluster already runs from {self.directory} ({running.url}); '
                               'stop it first (python -m beam_streams_runner.cluster stop)')
        busy = [f'{host}:{port}' for host, port in
                [(self.master.host, self.port), (self.master.host, self.master.ui_port)]
                + [(w.host, w.ui_port) for w in self.workers] if not _can_bind(host, port)]
        if busy:
            raise ClusterError(f'Port(s) {", ".join(busy)} already in use: another Spark '
                               'master or cluster runs here; stop it, or pick other ports '
                               '(--port, --webui-port; 0 picks free ones)')
        self._link_python()
        self.start_master()
        try:
            self.wait_for_master(timeout_s)
            for index in range(len(self.workers)):
                self.start_worker(index)
            self.wait_for_workers(len(self.workers), timeout_s)
        except BaseException:
            self.stop()
            raise

    def wait_for_master(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self._wait(lambda: self.state() is not None, [self.master], 'the master to answer',
                   timeout_s)

    def wait_for_workers(self, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Waits until `count` workers are registered ALIVE with the master."""
        self._wait(lambda: len(self.alive_workers()) >= count, [self.master, *self.workers],
                   f'{count} worker(s) to register', timeout_s)

    def _wait(self, ready, daemons: Sequence[Daemon], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [d for d in daemons if d.pid and not d.alive]
            if dead or time.monotonic() > deadline:
                culprit = dead[0] if dead else daemons[-1]
                why = f'{culprit.name} exited' if dead else f'timed out after {timeout_s:g} s'
                raise ClusterError(f'Waiting for {what}: {why}. The end of {culprit.log}:\n'
                                   + _log_tail(culprit.log))
            time.sleep(0.5)

    def kill(self, daemon: Daemon, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` to a daemon (SIGKILL: a crash) and waits until it is gone."""
        if daemon.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon.pid, sig)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while daemon.alive and time.monotonic() < deadline:
                time.sleep(0.1)

    def stop(self) -> None:
        """Stops the workers (their executors go with them), then the master."""
        for daemon in [*self.workers, self.master]:
            self.kill(daemon, signal.SIGTERM)
            self.kill(daemon, signal.SIGKILL)
        for pid in processes_under(self.directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.save()

    # -- status ---------------------------------------------------------------------

    def state(self) -> dict | None:
        """The master's own report (its web UI's /json), or None when it does not answer."""
        try:
            with urllib.request.urlopen(f'{self.master_ui}/json/', timeout=2) as reply:
                return json.load(reply)
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict]:
        state = self.state() or {}
        return [w for w in state.get('workers', []) if w.get('state') == 'ALIVE']

    def describe(self) -> str:
        """What `status` prints: the master, each worker, the running applications."""
        state = self.state()
        lines = [f'master {self.url}  {"up" if self.master.alive else "down"}  '
                 f'UI {self.master_ui}  log {self.master.log}']
        registered = {w.get('host'): w for w in (state or {}).get('workers', [])}
        for w in self.workers:
            seen = registered.get(w.host, {}).get('state', 'not registered')
            lines.append(f'{w.name} {w.host}  {"up" if w.alive else "down"} ({seen})  '
                         f'{self.cores} cores {self.memory}  UI http://{w.host}:{w.ui_port}  '
                         f'log {w.log}')
        for app in (state or {}).get('activeapps', []):
            lines.append(f'application {app.get("id")} {app.get("name")!r} '
                         f'{app.get("state")} cores {app.get("cores")}')
        return '\n'.join(lines)


def processes_under(directory: str) -> list[int]:
    """Pids of the processes of the cluster in `directory`: its daemons and what they
    started (executors, their Python workers), which inherit the daemons' CLUSTER_ENV.
    What a stop leaves behind must not outlive the cluster."""
    marker = b'\0' + f'{CLUSTER_ENV}={directory}'.encode() + b'\0'
    found = []
    for entry in os.listdir('/proc') if os.path.isdir('/proc') else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            with open(f'/proc/{entry}/environ', 'rb') as environ:
                if marker in b'\0' + environ.read() + b'\0':
                    found.append(int(entry))
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m beam_streams_runner.cluster',
        description='A local standalone Spark cluster (a master and N workers, each worker '
                    'on its own loopback address) from the pip-installed PySpark.')
    parser.add_argument('--dir', default=None,
                        help=f'where the cluster keeps its logs and state '
                             f'(default {default_directory()})')
    commands = parser.add_subparsers(dest='command', required=True)
    start = commands.add_parser('start', help='start a master and its workers')
    start.add_argument('--workers', type=int, default=2)
    start.add_argument('--cores', type=int, default=None,
                       help='cores per worker (default: the machine\'s cores / workers)')
    start.add_argument('--memory', default='2g', help='memory per worker (default 2g)')
    start.add_argument('--port', type=int, default=7077, help='master port (0: a free one)')
    start.add_argument('--webui-port', type=int, default=8080,
                       help='master web UI port; workers use the next ones (0: free ones)')
    start.add_argument('--python', default=None,
                       help="the workers' python3 (default: the Python running this)")
    commands.add_parser('status', help='show the master, the workers and the applications')
    commands.add_parser('stop', help='stop the workers and the master')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == 'start':
            cluster = LocalCluster.plan(args.dir, args.workers, args.cores, args.memory,
                                        args.port, args.webui_port, args.python)
            print(f'Starting a Spark master and {args.workers} worker(s) in {cluster.directory}',
                  flush=True)
            cluster.start()
            print(cluster.describe())
            print(f'Run pipelines with --spark_master={cluster.url}')
        elif args.command == 'status':
            print(LocalCluster.load(args.dir).describe())
        else:
            cluster = LocalCluster.load(args.dir)
            cluster.stop()
            print(f'Stopped the cluster of {cluster.directory}')
    except ClusterError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
