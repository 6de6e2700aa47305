"""Beam's windowed file sinks made safe to publish a window twice.

Design section 12 ("Sinks publish after the cut"): what a publishing step released
before a failure is released again by the replay (its cut is the one reset to), so
publishing must be idempotent. Beam's file sinks on an unbounded input (WriteToText,
WriteToAvro & co.) mean to be: FinalizeWrite skips a shard whose temporary file is
gone and whose final file exists. But both of their publishing steps find final files
through a glob built from the file names, and a window's part of the name,
`[start, end)`, is a glob character class. So FinalizeWrite never finds a file it
renamed before and fails the second publish ("src and dst files do not exist"); and
PreFinalize, which deletes what its glob finds before the renames, would delete a
published window's files under a shard-name template that its glob does match.

A reset leaves a second trace: InitializeWindowedWrite names each window's temporary
directory with a random id, so the files an epoch discarded by a reset wrote for a
window stay behind in a directory nobody deletes, next to the output.

`REPUBLISH_SAFE_FILE_SINKS` (overrides the runner applies before translating) swaps
the three steps for versions that do what Beam's do the first time and nothing
harmful the second: InitializeWindowedWrite names the directory after the sink, the
window and the pane (a replay writes where the discarded attempt wrote, and
FinalizeWrite's delete of the directory takes both); PreFinalize deletes nothing once
the window's temporary files are gone (the renames that made them visible ran); and
FinalizeWrite looks final files up by their exact names and skips a shard whose
temporary file is gone and whose final file exists.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from typing import Any, Iterable, Iterator

from apache_beam.io import iobase
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.pipeline import AppliedPTransform, PTransformOverride
from apache_beam.transforms.core import CallableWrapperDoFn, DoFn, FlatMap, ParDo
from apache_beam.transforms.window import TimestampedValue


def initialize_windowed_write(unused_element: Any, sink: Any, w: Any = DoFn.WindowParam,
                              pane: Any = DoFn.PaneInfoParam) -> list[str]:
    """Beam's InitializeWindowedWrite (a FlatMap here: the window and pane parameters
    need one) with the temporary directory named after the sink, the window and the
    pane instead of a random id."""
    prefix = sink.file_path_prefix.get()
    # Beam's name (and its check of the prefix), with the random id replaced.
    base, name = FileSystems.split(sink._create_temp_dir(prefix))
    digest = hashlib.sha256(f'{prefix}|{w}|{pane.index}'.encode()).hexdigest()[:32]
    temp_dir = FileSystems.join(base, f"{name.rsplit('-', 1)[0]}-{digest}")
    if not FileSystems.exists(temp_dir):
        FileSystems.mkdirs(temp_dir)
    return [temp_dir]


class RepublishSafePreFinalize(iobase._PreFinalizeWindowedBundleDoFn):
    """Beam's PreFinalize of a windowed file sink that leaves a published window alone."""

    def process(self, element: list[str], init_result: Any, w: Any = DoFn.WindowParam,
                pane: Any = DoFn.PaneInfoParam) -> Iterator[list[str]]:
        if element and not any(FileSystems.exists(src) for src in element):
            yield element  # published before the replay: its files are the output now
            return
        yield from super().process(element, init_result, w, pane)


def finalize_windowed_write(unused_element: Any, sink: Any, init_result: Any,
                            write_results: Iterable[str], min_shards: int,
                            pre_finalize_results: Any,
                            w: Any = DoFn.WindowParam) -> list[TimestampedValue]:
    """Beam's FinalizeWrite of a windowed file sink, checking final files by exact name.
    Its output is every final file of the window, renamed now or by a publish before
    the replay (Beam's names only those renamed now), so that a replay sends on what
    the first publish did."""
    final_names: list[str] = []
    sink = copy.copy(sink)
    sink._check_state_for_finalize_write = functools.partial(
        _check_state_by_name, sink, final_names)
    for _ in iobase._finalize_windowed_write(
            unused_element, sink, init_result, write_results, min_shards,
            pre_finalize_results, w) or ():
        pass
    return [TimestampedValue(name, w.end) for name in final_names]


def _check_state_by_name(sink: Any, final_names: list[str], writer_results: list[str],
                         num_shards: int, window: Any = None
                         ) -> tuple[list[str], list[str], list[str], int]:
    """`FileBasedSink._check_state_for_finalize_write` without globs: the files to
    rename (sources, destinations), the sources to delete, the shards already renamed.
    Every shard's final name is appended to `final_names`."""
    src_files: list[str] = []
    dst_files: list[str] = []
    delete_files: list[str] = []
    num_skipped = 0
    for shard_num, src in enumerate(writer_results):
        dst = sink._get_final_name(shard_num, num_shards, window)
        final_names.append(dst)
        src_exists, dst_exists = FileSystems.exists(src), FileSystems.exists(dst)
        if not src_exists and not dst_exists:
            raise BeamIOError(f'src and dst files do not exist. src: {src}, dst: {dst}')
        if not src_exists:
            num_skipped += 1
        elif dst_exists and FileSystems.checksum(src) == FileSystems.checksum(dst):
            delete_files.append(src)
        else:
            src_files.append(src)
            dst_files.append(dst)
    return src_files, dst_files, delete_files, num_skipped


class _StepOverride(PTransformOverride):
    """Replaces one ParDo with another over the same main input and side inputs."""

    def get_replacement_inputs(self, applied: AppliedPTransform) -> tuple[Any, ...]:
        return tuple(applied.main_inputs.values())  # the side inputs stay in the args


class _PreFinalizeOverride(_StepOverride):
    def matches(self, applied: AppliedPTransform) -> bool:
        transform = applied.transform
        return (isinstance(transform, ParDo)
                and type(transform.fn) is iobase._PreFinalizeWindowedBundleDoFn)

    def get_replacement_transform_for_applied_ptransform(
            self, applied: AppliedPTransform) -> ParDo:
        args, kwargs = applied.transform.raw_side_inputs
        return ParDo(RepublishSafePreFinalize(applied.transform.fn.sink), *args, **kwargs)


class _FinalizeOverride(_StepOverride):
    def matches(self, applied: AppliedPTransform) -> bool:
        transform = applied.transform
        return (isinstance(transform, ParDo) and isinstance(transform.fn, CallableWrapperDoFn)
                and transform.fn._fn is iobase._finalize_windowed_write)

    def get_replacement_transform_for_applied_ptransform(
            self, applied: AppliedPTransform) -> ParDo:
        args, kwargs = applied.transform.raw_side_inputs
        return FlatMap(finalize_windowed_write, *args, **kwargs).with_output_types(str)


class _InitializeOverride(_StepOverride):
    def matches(self, applied: AppliedPTransform) -> bool:
        # Beam's step is a Map of a lambda: known by its place in WriteImpl's expansion.
        return (isinstance(applied.transform, ParDo)
                and applied.parent is not None
                and isinstance(applied.parent.transform, iobase.WriteImpl)
                and applied.full_label.endswith('/InitializeWindowedWrite')
                and applied.transform.fn._fn is not initialize_windowed_write)

    def get_replacement_transform_for_applied_ptransform(
            self, applied: AppliedPTransform) -> ParDo:
        args, kwargs = applied.transform.raw_side_inputs
        return FlatMap(initialize_windowed_write, *args, **kwargs)


REPUBLISH_SAFE_FILE_SINKS = (_InitializeOverride(), _PreFinalizeOverride(), _FinalizeOverride())
