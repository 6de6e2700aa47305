"""Beam's Java-backed Python runners (FlinkRunner, SparkRunner, PortableRunner): can a run
reach its job server?

These runners hand the pipeline to a Java job server: a running one named by
`--job_endpoint=HOST:PORT`, or one Beam starts from a jar (`--flink_job_server_jar`,
`--spark_job_server_jar`, else downloaded from Maven Central into Beam's jar cache), which
then submits to `--flink_master` / `--spark_master_url`. Without them Beam does not fail
promptly: it waits `--job_server_timeout` (300 s) for an endpoint that refuses, and a jar
download has no timeout at all. `job_server_problem` checks, in a few seconds, what such
a run needs from here, and names the first thing missing and what to do about it;
`check_job_server` raises it as `JobServerUnavailable`, whose one-line message becomes the
run's row in the launcher's table.
"""

from __future__ import annotations

import os
import shutil
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

JAVA_RUNNERS = ('FlinkRunner', 'SparkRunner', 'PortableRunner')
# Refused or unroutable addresses must end the check, not stall it.
CONNECT_TIMEOUT_S = 5.0
# A TCP listener that is not a gRPC server (e.g. Flink's REST port given as the job
# endpoint) would otherwise keep Beam waiting for the channel.
GRPC_READY_TIMEOUT_S = 10.0
# Flink and Spark masters' default ports, for an address given without one.
DEFAULT_PORTS = {'http': 80, 'https': 443, 'spark': 7077}
# The row's error is cut at 160 characters (`verdicts.first_line`): keep each one shorter.
MAX_MESSAGE = 160


class JobServerUnavailable(RuntimeError):
    """A Java-backed runner's job server (or its jar, or its master) is out of reach."""


def java_runner_name(runner: str) -> str | None:
    """`runner`'s short name if it is one of `JAVA_RUNNERS` (short or Beam's dotted class
    name), else None."""
    short = runner.rsplit('.', 1)[-1]
    if short in JAVA_RUNNERS and ('.' not in runner or runner.startswith('apache_beam.')):
        return short
    return None


def check_job_server(runner: str, args: Sequence[str]) -> None:
    """Raise `JobServerUnavailable` if `runner` (with pipeline options `args`) is a
    Java-backed runner whose job server it cannot reach; other runners pass."""
    problem = job_server_problem(runner, args)
    if problem:
        raise JobServerUnavailable(problem)


def job_server_problem(runner: str, args: Sequence[str]) -> str | None:
    """What a run of `runner` with `args` lacks to reach its job server, as one line
    naming the option and what to do; None if nothing (or not a Java-backed runner)."""
    from apache_beam.options.pipeline_options import (
        FlinkRunnerOptions,
        JobServerOptions,
        PipelineOptions,
        PortableOptions,
        SparkRunnerOptions,
    )

    name = java_runner_name(runner)
    if name is None:
        return None
    options = PipelineOptions(list(args))
    endpoint = options.view_as(PortableOptions).job_endpoint
    if endpoint:
        # A running job server does the rest (jar, master: as seen from its host).
        return None if endpoint == 'embed' else _endpoint_problem(endpoint)
    if name == 'PortableRunner':
        return ('PortableRunner needs a running Beam job server: start one (Flink\'s or '
                'Spark\'s) and give its address with --job_endpoint=HOST:PORT')
    if name == 'FlinkRunner':
        flink = options.view_as(FlinkRunnerOptions)
        master_problem = _flink_master_problem(flink.flink_master)
        uber_jar = flink.flink_submit_uber_jar
    else:
        spark = options.view_as(SparkRunnerOptions)
        master_problem = _spark_master_problem(spark)
        uber_jar = spark.spark_submit_uber_jar
    if master_problem:
        return master_problem
    java = options.view_as(JobServerOptions).job_server_java_launcher
    if not uber_jar and not shutil.which(java):
        return (f'{name} starts Beam\'s Java job server, but there is no {java!r} on PATH: '
                'install Java 11+ or give --job_server_java_launcher=PATH')
    return _jar_problem(name, options)


def _endpoint_problem(endpoint: str) -> str | None:
    """Why nothing usable answers at the job endpoint `endpoint`, or None."""
    host, _, port = endpoint.rpartition(':')
    if not host or not port.isdigit():
        return f'--job_endpoint={endpoint} is not HOST:PORT (e.g. localhost:8099)'
    advice = 'start a Beam job server there or give the address of a running one'
    refused = _connect_problem(host, int(port))
    if refused:
        return f'no job server answers at {endpoint} (--job_endpoint): {refused}; {advice}'
    import grpc
    channel = grpc.insecure_channel(endpoint)
    try:
        grpc.channel_ready_future(channel).result(timeout=GRPC_READY_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        return (f'{endpoint} (--job_endpoint) accepts connections but no gRPC job server '
                f'answers within {GRPC_READY_TIMEOUT_S:.0f} s; {advice}')
    finally:
        channel.close()
    return None


def _flink_master_problem(master: str) -> str | None:
    """Why the Flink master `master` (REST address, `[local]` or `[auto]`) is out of
    reach of a job server started here, or None."""
    if master in ('[local]', '[auto]'):
        return None
    return _address_problem(master, 'flink_master', 'http', 80, 'HOST:PORT, [local] or [auto]',
                            'Flink master', "start Flink there or give a running one's REST "
                            'address')


def _spark_master_problem(spark) -> str | None:
    """Why the Spark master (or REST endpoint, for an uber jar) of `spark`
    (SparkRunnerOptions) is out of reach, or None; a local master needs nothing."""
    if spark.spark_submit_uber_jar:
        if not spark.spark_rest_url:
            return ('SparkRunner --spark_submit_uber_jar needs the REST address of the Spark '
                    'master: give --spark_rest_url=http://HOST:6066')
        address, option = spark.spark_rest_url, 'spark_rest_url'
    elif spark.spark_master_url.startswith('local'):
        return None
    else:
        address, option = spark.spark_master_url, 'spark_master_url'
    return _address_problem(address, option, 'spark', 7077,
                            'a master URL (spark://HOST:PORT)', 'Spark master',
                            'start Spark there, give a running one, or use local[2]')


def _address_problem(address: str, option: str, scheme: str, default_port: int, form: str,
                     what: str, hint: str) -> str | None:
    """Why the `what` at `address` (option `--option`, of the given `form`; `scheme`
    when it names none) is out of reach, or None."""
    url = urllib.parse.urlparse(address if '://' in address else f'{scheme}://{address}')
    if not url.hostname:
        return f'--{option}={address} is not {form}'
    port = url.port or DEFAULT_PORTS.get(url.scheme, default_port)
    refused = _connect_problem(url.hostname, port)
    if refused:
        return f'no {what} at {url.hostname}:{port} (--{option}): {refused}; {hint}'
    return None


def _jar_problem(name: str, options) -> str | None:
    """Why the job server jar of runner `name` is neither at hand nor downloadable within
    a few seconds, or None (given as a file, in Beam's jar cache, or the download
    answers)."""
    from apache_beam.options.pipeline_options import (
        FlinkRunnerOptions,
        JobServerOptions,
        SparkRunnerOptions,
    )
    from apache_beam.runners.portability.flink_runner import FlinkJarJobServer
    from apache_beam.runners.portability.spark_runner import SparkJarJobServer
    from apache_beam.utils.subprocess_server import JavaJarServer

    if name == 'FlinkRunner':
        option = '--flink_job_server_jar'
        given = options.view_as(FlinkRunnerOptions).flink_job_server_jar
        server = FlinkJarJobServer
    else:
        option = '--spark_job_server_jar'
        given = options.view_as(SparkRunnerOptions).spark_job_server_jar
        server = SparkJarJobServer
    if given and not os.path.exists(given) and not urllib.parse.urlparse(given).scheme:
        return f'no job server jar at {given} ({option}): give the path of an existing jar'
    # Beam's own choice: the given jar, a jar built in a Beam source tree, or the URL of
    # the release's jar on Maven Central.
    jar = given or server(options).path_to_jar()
    cache = options.view_as(JobServerOptions).jar_cache_dir or JavaJarServer.JAR_CACHE
    if os.path.exists(jar) or os.path.exists(os.path.join(cache, os.path.basename(jar))):
        return None
    if urllib.parse.urlparse(jar).scheme not in ('http', 'https'):
        return None  # e.g. gs://: Beam's file systems fetch it
    # Beam falls back to Google's mirror of Maven Central: either answering will do.
    candidates = [jar]
    if jar.startswith(JavaJarServer.MAVEN_CENTRAL_REPOSITORY):
        candidates.append(jar.replace(JavaJarServer.MAVEN_CENTRAL_REPOSITORY,
                                      JavaJarServer.GOOGLE_MAVEN_MIRROR))
    reasons = []
    for candidate in candidates:
        reason = _download_problem(candidate)
        if not reason:
            return None
        reasons.append(reason)
    return (f'{name}: no job server jar (not cached; download: {reasons[0]}); give '
            f'{option}=PATH or --job_endpoint=HOST:PORT')


def _connect_problem(host: str, port: int) -> str | None:
    """Why a TCP connection to host:port fails within `CONNECT_TIMEOUT_S`, or None."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except ConnectionRefusedError:
        return 'connection refused'
    except TimeoutError:
        return f'no answer within {CONNECT_TIMEOUT_S:.0f} s'
    except socket.gaierror:
        return f'unknown host {host}'
    except OSError as e:
        return e.strerror or type(e).__name__


def _download_problem(url: str) -> str | None:
    """Why `url` cannot be fetched (a HEAD request within `CONNECT_TIMEOUT_S`), or None."""
    request = urllib.request.Request(url, method='HEAD')
    try:
        with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as e:
        return f'HTTP {e.code}'
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, socket.gaierror):
            return f'cannot resolve {urllib.parse.urlparse(url).hostname}'
        return str(reason)[:40]
    except TimeoutError:
        return f'no answer within {CONNECT_TIMEOUT_S:.0f} s'
    except OSError as e:
        return (e.strerror or type(e).__name__)[:40]
