"""The driver JVM's class archive (`jvm_class_cache`): written at a first JVM's exit under
a name of its own, promoted only once finished, mapped by the next session; a real
driver JVM in two fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from beam_streams_runner.driver import jvm_class_cache
from beam_streams_runner.driver.java import find_java
from beam_streams_runner.driver.jvm_class_cache import class_sharing_options, is_finished

pytestmark = pytest.mark.timeout(300)
_FINISHED = (0xF00BABA8).to_bytes(4, sys.byteorder) + b'\x01' * 64


def _archive_dir(cache) -> str:
    return os.path.join(cache, 'jvm-classes')


def _write(path: str, content: bytes, age_s: float = 0) -> None:
    with open(path, 'wb') as f:
        f.write(content)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))


def test_without_an_archive_the_jvm_writes_its_own_at_exit(tmp_path):
    options = class_sharing_options(str(tmp_path), find_java(), {})
    assert options.startswith('-XX:ArchiveClassesAtExit=')
    part = options.split()[0].split('=', 1)[1]
    assert part.endswith(f'.{os.getpid()}.part')
    assert os.path.dirname(part) == _archive_dir(tmp_path)
    assert '-Xlog:cds*=off' in options


def test_a_finished_part_is_promoted_and_mapped(tmp_path):
    first = class_sharing_options(str(tmp_path), find_java(), {})
    archive = first.split()[0].split('=', 1)[1].rsplit('.', 2)[0]
    _write(f'{archive}.1.part', _FINISHED)
    _write(f'{archive}.2.part', _FINISHED)
    options = class_sharing_options(str(tmp_path), find_java(), {})
    assert options.split()[0] == f'-XX:SharedArchiveFile={archive}'
    assert is_finished(archive)
    assert os.listdir(_archive_dir(tmp_path)) == [os.path.basename(archive)]
    # A JVM that started before the archive was there writes its own at exit: removed.
    _write(f'{archive}.3.part', _FINISHED)
    assert class_sharing_options(str(tmp_path), find_java(), {}) == options
    assert os.listdir(_archive_dir(tmp_path)) == [os.path.basename(archive)]


def test_an_unfinished_part_is_never_mapped(tmp_path):
    first = class_sharing_options(str(tmp_path), find_java(), {})
    archive = first.split()[0].split('=', 1)[1].rsplit('.', 2)[0]
    # A JVM killed while writing: regions written, the header still zeros.
    _write(f'{archive}.7.part', b'\x00' * 68)
    _write(f'{archive}.8.part', b'\x00' * 68, age_s=2 * 3600)
    options = class_sharing_options(str(tmp_path), find_java(), {})
    assert options.startswith('-XX:ArchiveClassesAtExit=')
    assert not os.path.exists(archive)
    # The young one may still be written to; the abandoned one is gone.
    assert os.path.exists(f'{archive}.7.part') and not os.path.exists(f'{archive}.8.part')


def test_the_driver_memory_and_class_path_have_archives_of_their_own(tmp_path):
    java = find_java()
    names = {class_sharing_options(str(tmp_path), java, conf).split()[0].rsplit('/', 1)[1]
             for conf in ({}, {'spark.driver.memory': '4g'}, {'spark.jars': '/x.jar'})}
    assert len(names) == 3


def test_an_unwritable_cache_gives_no_options(tmp_path):
    blocked = tmp_path / 'file'
    blocked.write_text('not a directory')
    assert class_sharing_options(str(blocked), find_java(), {}) == ''


def test_a_second_driver_maps_the_archive_the_first_one_wrote(tmp_path):
    """Two fresh processes, each the runner's session and a job: the first JVM writes its
    archive at exit, the second session promotes it and its JVM starts with it."""
    script = textwrap.dedent('''
        from apache_beam.options.pipeline_options import PipelineOptions
        from beam_streams_runner.driver.spark_session import get_or_create_spark
        spark = get_or_create_spark(PipelineOptions(['--spark_master=local[1]',
            '--spark_conf=spark.ui.enabled=false']), 'class-cache-test')
        args = spark.sparkContext._jvm.java.lang.management.ManagementFactory \\
            .getRuntimeMXBean().getInputArguments()
        shared = [a for a in args if a.startswith(('-XX:SharedArchiveFile',
                                                   '-XX:ArchiveClassesAtExit'))]
        print('RESULT', spark.sparkContext.parallelize(range(3), 1).sum(), shared)
        spark.stop()
    ''')
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    results = []
    for _ in range(2):
        done = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True,
                              text=True, timeout=240, stdin=subprocess.DEVNULL, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append([line for line in done.stdout.splitlines()
                        if line.startswith('RESULT')])
        directory = _archive_dir(tmp_path / 'beam_streams_runner')
        # The JVM may still be writing after its Python process ended.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                is_finished(os.path.join(directory, name)) for name in os.listdir(directory)):
            time.sleep(1)
    (first,), (second,) = results
    assert first.startswith('RESULT 3 [') and 'ArchiveClassesAtExit' in first
    archive = [name for name in os.listdir(directory) if name.endswith('.jsa')]
    assert len(archive) == 1, os.listdir(directory)
    assert second == f"RESULT 3 ['-XX:SharedArchiveFile={directory}/{archive[0]}']"
    assert jvm_class_cache.is_finished(os.path.join(directory, archive[0]))
