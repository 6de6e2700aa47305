"""Beam's windowed file sinks publish a window twice without failing or losing it
(regions/file_sinks.py): the steps on their own, on real files, and the overrides in a
planned pipeline."""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.textio import _TextSink
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming

from beam_streams_runner.regions.file_sinks import (
    RepublishSafePreFinalize,
    finalize_windowed_write,
    initialize_windowed_write,
)
from beam_streams_runner.runner import plan_pipeline

WINDOW = IntervalWindow(1_700_000_000, 1_700_000_001)


def pane(index: int) -> PaneInfo:
    return PaneInfo(index == 0, True, PaneInfoTiming.ON_TIME, index, 0)


def write_shards(sink, temp_dir: str, lines_per_shard: list[list[str]]) -> list[str]:
    results = []
    for n, lines in enumerate(lines_per_shard):
        writer = sink.open_writer(temp_dir, f'{WINDOW}_None_{n}')
        for line in lines:
            writer.write(line)
        results.append(writer.close())
    return results


def final_files(out) -> dict[str, str]:
    return {name: open(os.path.join(out, name)).read() for name in sorted(os.listdir(out))}


@pytest.fixture
def sink(tmp_path):
    return _TextSink(str(tmp_path / 'out' / 'part'), shard_name_template='-W-SSSSS-of-NNNNN')


def publish(sink, written: list[str], temp_dir: str) -> list[str]:
    list(RepublishSafePreFinalize(sink).process(written, temp_dir, WINDOW, pane(0)))
    return [value.value for value in finalize_windowed_write(
        None, sink, temp_dir, written, 1, [written], WINDOW)]


@pytest.mark.parametrize('shards', [1, 3])
def test_a_window_published_twice_is_published_once(sink, tmp_path, shards):
    """The replay of a publish finds the window's files in place, outputs the same final
    names and changes nothing (Beam's own steps fail the second time: their glob of the
    final names never matches a window's `[start, end)`)."""
    [temp_dir] = initialize_windowed_write(None, sink, WINDOW, pane(0))
    written = write_shards(sink, temp_dir, [[f'line {n}', f'more {n}'] for n in range(shards)])
    first = publish(sink, written, temp_dir)
    published = final_files(tmp_path / 'out')
    assert len(first) == shards and len(published) == shards
    assert sorted(os.path.basename(name) for name in first) == sorted(published)
    assert not os.path.exists(temp_dir), 'the temporary directory outlived the publish'

    assert publish(sink, written, temp_dir) == first
    assert final_files(tmp_path / 'out') == published


def test_a_shard_neither_written_nor_published_still_fails(sink):
    """Skipping what is in place must not hide a shard that is nowhere."""
    [temp_dir] = initialize_windowed_write(None, sink, WINDOW, pane(0))
    missing = os.path.join(temp_dir, 'never-written.part')
    with pytest.raises(BeamIOError, match='src and dst files do not exist'):
        finalize_windowed_write(None, sink, temp_dir, [missing], 1, [[missing]], WINDOW)


def test_a_replayed_window_writes_where_the_discarded_attempt_wrote(sink, tmp_path):
    """The temporary directory is named after the sink, window and pane: an attempt a
    reset discarded and its replay share it, and the publish deletes both's files."""
    [first_dir] = initialize_windowed_write(None, sink, WINDOW, pane(0))
    discarded = write_shards(sink, first_dir, [['lost']])
    [replay_dir] = initialize_windowed_write(None, sink, WINDOW, pane(0))
    assert replay_dir == first_dir and os.path.exists(discarded[0])
    assert initialize_windowed_write(None, sink, WINDOW, pane(1)) != [first_dir]
    other = IntervalWindow(WINDOW.end, WINDOW.end + 1)
    assert initialize_windowed_write(None, sink, other, pane(0)) != [first_dir]
    os.rmdir(initialize_windowed_write(None, sink, other, pane(0))[0])
    os.rmdir(initialize_windowed_write(None, sink, WINDOW, pane(1))[0])

    publish(sink, write_shards(sink, replay_dir, [['kept']]), replay_dir)
    assert list(final_files(tmp_path / 'out').values()) == ['kept\n']


def test_prefinalize_still_clears_stale_files_before_a_first_publish(tmp_path):
    """Beam's PreFinalize deletes stale final files its glob matches before the renames
    (here a template without the window, which its glob does match); it still does when
    the window's temporary files are there, and not once they were published."""
    sink = _TextSink(str(tmp_path / 'out' / 'part'), shard_name_template='-SSSSS-of-NNNNN')
    [temp_dir] = initialize_windowed_write(None, sink, WINDOW, pane(0))
    stale = tmp_path / 'out' / 'part-00000-of-00001'
    stale.write_text('stale\n')
    written = write_shards(sink, temp_dir, [['fresh']])
    list(RepublishSafePreFinalize(sink).process(written, temp_dir, WINDOW, pane(0)))
    assert not stale.exists()
    finalize_windowed_write(None, sink, temp_dir, written, 1, [written], WINDOW)
    list(RepublishSafePreFinalize(sink).process(written, temp_dir, WINDOW, pane(0)))
    assert stale.read_text() == 'fresh\n'


def planned_functions(pipeline: beam.Pipeline) -> set[str]:
    """The names of the DoFn classes and mapped functions of `pipeline` once planned."""
    plan_pipeline(pipeline, pipeline.options)[1].close()
    names: set[str] = set()

    class Names(beam.pipeline.PipelineVisitor):
        def visit_transform(self, applied) -> None:
            fn = getattr(applied.transform, 'fn', None)
            if fn is not None:
                names.add(type(fn).__name__)
                names.add(getattr(getattr(fn, '_fn', None), '__name__', ''))

    pipeline.visit(Names())
    return names


def test_the_runner_plans_the_republish_safe_steps(tmp_path):
    """A streaming WriteToText is planned with the three replaced steps; a batch one is
    committed by the driver (`translators/file_commits`), without a windowed step."""
    p = beam.Pipeline(options=PipelineOptions(['--streaming']))
    (p | PeriodicImpulse(0, 10, 1) | beam.Map(str)
     | beam.io.WriteToText(str(tmp_path / 'part'), triggering_frequency=1))
    names = planned_functions(p)
    assert {'initialize_windowed_write', 'RepublishSafePreFinalize',
            'finalize_windowed_write'} <= names, names
    assert not {'_PreFinalizeWindowedBundleDoFn', '_finalize_windowed_write'} & names

    batch = beam.Pipeline(options=PipelineOptions([]))
    batch | beam.Create(['a']) | beam.io.WriteToText(str(tmp_path / 'batch'))
    names = planned_functions(batch)
    assert 'CommittedWriteBundleDoFn' in names and 'finalize_windowed_write' not in names, names
