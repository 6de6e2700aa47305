"""The driver JVM's classes mapped from an archive: a Spark session in half the time.

A new driver JVM loads, parses and verifies thousands of classes from Spark's jars
before the session is up, and more during the first job; a run that starts a fresh
process pays it every time (measured, 2-core machine under load, PySpark's session and
a first two-task job: 14.0 s and 4.8 s, 6.9 s and 3.2 s with the archive). Java's
dynamic class-data sharing (JDK 13 and later) writes the classes a JVM loaded to an
archive when the JVM exits (`-XX:ArchiveClassesAtExit`) and maps them into a later JVM
(`-XX:SharedArchiveFile`).

The archive lives in the user's cache directory, one per Java, PySpark and driver
memory and class path (`_key`). No JVM ever maps a file that is being written: a JVM
writes its archive under a name of its own (its runner process's id, `.part`), and the
next session of the same key promotes a finished one to the archive's name with one
rename. Finished means its header is there: the JVM writes the header last, after
every region, so one killed while writing, or out of disk space, leaves a header of
zeros and is never used (a truncated archive with a header would crash the JVM it is
mapped into). The JVM's own CDS messages are off: an archive it cannot use for another
reason (another build of Java, a changed class path) it skips by itself, silently.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import sys
import time
from collections.abc import Mapping

_LOGGER = logging.getLogger(__name__)

# The first four bytes of a finished dynamic archive (HotSpot's `CDS_DYNAMIC_ARCHIVE_MAGIC`,
# in the machine's byte order); an unfinished one starts with zeros.
_DYNAMIC_MAGIC = 0xF00BABA8
_QUIET = '-Xshare:auto -Xlog:cds*=off'
# An unfinished archive older than this has no writer left.
_ABANDONED_S = 3600
# What else decides which classes the driver JVM loads, and from where.
_CLASS_PATH_CONF = ('spark.driver.memory', 'spark.jars', 'spark.jars.packages',
                    'spark.driver.extraClassPath')


def class_sharing_options(cache_dir: str, java: str, conf: Mapping[str, str]) -> str:
    """JVM options for a new driver: map the archive of this key if there is a finished
    one, else write one when this JVM exits. '' when the cache cannot be written."""
    directory = os.path.join(cache_dir, 'jvm-classes')
    try:
        os.makedirs(directory, exist_ok=True)
        archive = os.path.join(directory, f'spark-{_key(java, conf)}.jsa')
        _promote(archive)
    except (OSError, TypeError) as exc:  # an unwritable cache, no java file
        _LOGGER.debug('No JVM class archive (%s).', exc)
        return ''
    if os.path.exists(archive):
        return f'-XX:SharedArchiveFile={archive} {_QUIET}'
    return f'-XX:ArchiveClassesAtExit={archive}.{os.getpid()}.part {_QUIET}'


def _key(java: str, conf: Mapping[str, str]) -> str:
    from importlib import metadata

    import pyspark
    parts = [os.path.realpath(java), str(os.stat(os.path.realpath(java)).st_mtime_ns),
             metadata.version('pyspark'), os.path.dirname(pyspark.__file__)]
    parts += [f'{name}={conf.get(name, "")}' for name in _CLASS_PATH_CONF]
    return hashlib.sha256('\n'.join(parts).encode()).hexdigest()[:16]


def _promote(archive: str) -> None:
    """Renames a finished `.part` of `archive` to it if there is no archive yet; removes
    the other finished ones (JVMs that started before the archive was there write theirs
    at exit too) and abandoned ones."""
    for part in sorted(glob.glob(f'{archive}.*.part'), key=os.path.getmtime, reverse=True):
        finished = is_finished(part)
        if finished and not os.path.exists(archive):
            os.replace(part, archive)
            _LOGGER.info('JVM classes are shared from %s from now on.', archive)
        elif finished or time.time() - os.path.getmtime(part) > _ABANDONED_S:
            os.remove(part)


def is_finished(path: str) -> bool:
    """Whether the archive at `path` has its header (was written to the end)."""
    try:
        with open(path, 'rb') as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and int.from_bytes(head, sys.byteorder) == _DYNAMIC_MAGIC
