"""End-to-end tests of the streaming driver: epochs, in-band watermarks, state across epochs.

Outputs are compared with Beam's DirectRunner in streaming mode through
`conftest.same_as_direct_streaming`.
"""

from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
import textwrap

import apache_beam as beam
from apache_beam.testing import test_stream
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

from beam_streams_runner import StreamsSparkRunner
from tests.conftest import SPARK_ARGS, events_with_late_data, run_streaming


def test_test_stream_fixed_windows(same_as_direct_streaming):
    same_as_direct_streaming(lambda p: (
        p | events_with_late_data() | beam.WindowInto(window.FixedWindows(5)) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, sorted(vs)))))


def test_test_stream_early_and_late_panes(same_as_direct_streaming):
    same_as_direct_streaming(lambda p: (
        p | events_with_late_data()
        | beam.WindowInto(window.FixedWindows(5),
                          trigger=trigger.AfterWatermark(early=trigger.AfterCount(1),
                                                         late=trigger.AfterCount(1)),
                          accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
                          allowed_lateness=20)
        | beam.CombinePerKey(sum)))


def test_test_stream_sessions(same_as_direct_streaming):
    # With allowed lateness, the session [1, 4) that fired at watermark 4 is still
    # live when 3 arrives, so both runners merge it into [1, 6). Without it, this
    # runner garbage-collects the expired session first (Beam Java's semantics:
    # 3 opens [3, 6)) while the DirectRunner keeps every key's state forever.
    same_as_direct_streaming(lambda p: (
        p | events_with_late_data() | beam.WindowInto(window.Sessions(3), allowed_lateness=10)
        | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, sorted(vs)))))


class _BufferUntilWindowEnd(beam.DoFn):
    """Keyed state held across epochs, flushed by an event-time timer."""

    BUFFER = userstate.BagStateSpec('buffer', beam.coders.VarIntCoder())
    FLUSH = userstate.TimerSpec('flush', TimeDomain.WATERMARK)

    def process(self, element, w=beam.DoFn.WindowParam,
                buffer=beam.DoFn.StateParam(BUFFER), flush=beam.DoFn.TimerParam(FLUSH)):
        buffer.add(element[1])
        flush.set(w.max_timestamp())

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, buffer=beam.DoFn.StateParam(BUFFER)):
        yield key, sorted(buffer.read())
        buffer.clear()


def test_stateful_dofn_with_timers_across_epochs(same_as_direct_streaming):
    same_as_direct_streaming(lambda p: (
        p | events_with_late_data() | beam.WindowInto(window.FixedWindows(5))
        | beam.ParDo(_BufferUntilWindowEnd())))


def test_a_timer_in_the_last_millisecond_waits_for_the_watermark_to_pass_it(
        tmp_path, spark_session):
    """Beam keeps a timer's timestamp in milliseconds: the end-of-window timer of [0, 1)
    s is kept at 0.999 s, while elements may carry microseconds up to 0.999999 s. A
    watermark at 0.999 s allows an element at 0.9995 s of the same window, so the timer
    must not fire before the watermark passes the millisecond (as Beam's Java runners
    compare). Firing at a watermark >= 0.999 s counted the key twice: 1, then 1."""
    events = (test_stream.TestStream()
              .add_elements([window.TimestampedValue(('k', 1), 0.999)])
              .advance_watermark_to(0.999)
              .add_elements([window.TimestampedValue(('k', 1), 0.9995)])
              .advance_watermark_to_infinity())

    def build(p):
        return (p | events | beam.WindowInto(window.FixedWindows(1))
                | beam.ParDo(_BufferUntilWindowEnd()))

    lines = run_streaming(build, StreamsSparkRunner(), str(tmp_path / 'out'), SPARK_ARGS)
    assert [line.split(' [0.0, 1.0)')[0] for line in lines] == [str(('k', [1, 1]))]


def test_bounded_input_with_streaming_flag_terminates(same_as_direct_streaming):
    same_as_direct_streaming(lambda p: (
        p | beam.Create([('a', 1), ('b', 2), ('a', 3)]) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, sorted(vs)))))


def test_unbounded_periodic_impulse(tmp_path, spark_session):
    """An unbounded SDF with resume delays, read epoch by epoch until its stop time."""
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    start = Timestamp.now().micros // 1_000_000 + 1

    def build(p):
        return (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3,
                                    fire_interval=1)
                | beam.Map(lambda t: int(t) - start)
                | beam.WindowInto(window.FixedWindows(2))
                | beam.Map(lambda t: ('k', t)) | beam.GroupByKey()
                | beam.MapTuple(lambda k, vs: sorted(vs)))

    lines = run_streaming(build, StreamsSparkRunner(), str(tmp_path / 'out'), SPARK_ARGS)
    values = sorted(v for line in lines for v in ast.literal_eval(line[:line.index(']') + 1]))
    assert values == [0, 1, 2]


def test_a_source_waiting_longer_than_an_epoch_holds_the_watermark(tmp_path, spark_session):
    """A source stage fed by a finished stage, whose restrictions all wait (resume delays)
    through whole epochs: it still sends its held watermark every epoch. Without that its
    consumers heard no channel of it, took the watermark +inf, and dropped as late
    every element the source emitted afterwards."""
    from apache_beam.transforms.periodicsequence import PeriodicSequence
    # Firings 2.5 s apart, the first 2.5 s ahead: longer than the driver's idle wait
    # (1 s), so epochs run while no restriction is due.
    start = Timestamp.now().micros / 1e6 + 2.5

    def build(p):
        return (p
                | beam.Create([(start, start + 6.0, 2.5), (start + 0.5, start + 6.5, 2.5)])
                | PeriodicSequence()
                | beam.Map(lambda t: round(float(t) - start, 1))
                | beam.WindowInto(window.FixedWindows(1))
                | beam.Map(lambda t: ('k', t)) | beam.GroupByKey()
                | beam.MapTuple(lambda k, vs: sorted(vs)))

    lines = run_streaming(build, StreamsSparkRunner(), str(tmp_path / 'out'), SPARK_ARGS)
    values = sorted(v for line in lines for v in ast.literal_eval(line[:line.index(']') + 1]))
    assert values == [0.0, 0.5, 2.5, 3.0, 5.0, 5.5]


def test_partitions_move_between_python_workers(tmp_path):
    """With Python worker reuse off, every task of every epoch runs in a new worker:
    each stateful partition is restored from the state the previous epoch committed."""
    script = tmp_path / 'moves.py'
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.conftest import events_with_late_data, run_streaming
        from tests.driver.test_streaming import _BufferUntilWindowEnd
        import apache_beam as beam
        from apache_beam.transforms import window
        from beam_streams_runner import StreamsSparkRunner

        def build(p):
            return (p | events_with_late_data() | beam.WindowInto(window.FixedWindows(5))
                    | beam.ParDo(_BufferUntilWindowEnd()))

        for runner, name, args in [
                ('DirectRunner', 'direct', []),
                (StreamsSparkRunner(), 'spark',
                 ['--spark_master=local[2]', '--spark_conf=spark.python.worker.reuse=false'])]:
            lines = run_streaming(build, runner, {str(tmp_path)!r} + '/' + name, args)
            print(name, repr(lines))
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = dict(line.split(' ', 1) for line in done.stdout.splitlines()
                   if line.startswith(('direct ', 'spark ')))
    assert outputs['direct'] != '[]'
    assert outputs['spark'] == outputs['direct']


class _ShrinkingMergeWindows(window.WindowFn):
    """'long' elements get [t, t+100), 'short' ones [t, t+10); a short window absorbs
    the long windows starting inside it, so the merge result ends before them (as
    NEXMark's AuctionOrBidWindowFn merges bid windows into their auction's)."""

    def assign(self, context):
        size = 10 if context.element[1] == 'short' else 100
        return [window.IntervalWindow(context.timestamp, context.timestamp + size)]

    def merge(self, merge_context):
        windows = list(merge_context.windows)
        for short in [w for w in windows if w.end - w.start == 10]:
            absorbed = [w for w in windows
                        if w.end - w.start == 100 and short.start <= w.start < short.end]
            if absorbed:
                merge_context.merge([*absorbed, short], short)

    def get_window_coder(self):
        return beam.coders.coders.IntervalWindowCoder()


def test_merged_window_pane_is_timestamped_at_its_own_end(tmp_path, spark_session):
    """The window merged away arrived an epoch earlier: its end-of-window hold must not
    survive the merge (Beam 2.77's trigger driver clears it after moving it)."""
    stream = (test_stream.TestStream()
              .add_elements([window.TimestampedValue(('k', 'long'), 1)])
              .add_elements([window.TimestampedValue(('k', 'short'), 0)])
              .advance_watermark_to_infinity())
    lines = run_streaming(lambda p: (
        p | stream | beam.WindowInto(_ShrinkingMergeWindows()) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: sorted(vs))), StreamsSparkRunner(),
        str(tmp_path / 'out'), SPARK_ARGS)
    assert [line.split(' ')[:4] for line in lines] == [
        ["['long',", "'short']", '[0.0,', '10.0)']]
    assert lines[0].split(' ')[4] == '9999'


def test_processing_time_panes_fire_when_the_input_ends(tmp_path, spark_session):
    """At watermark +inf processing time runs out too: a TestStream that never moves
    processing time still ends, with the pending pane. (Beam's DirectRunner spins
    forever on this pipeline, so the expected pane is written out.)"""
    lines = run_streaming(lambda p: (
        p | test_stream.TestStream()
        .add_elements([window.TimestampedValue(('k', i), i) for i in range(3)])
        .advance_watermark_to_infinity()
        | beam.WindowInto(window.GlobalWindows(),
                          trigger=trigger.Repeatedly(trigger.AfterProcessingTime(10)),
                          accumulation_mode=trigger.AccumulationMode.DISCARDING)
        | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, len(list(vs))))), StreamsSparkRunner(),
        str(tmp_path / 'out'), SPARK_ARGS)
    assert [line.split(' ')[0] for line in lines] == ["('k',"]
    assert lines[0].startswith("('k', 3) GlobalWindow")


def test_finished_stages_leave_later_epochs(tmp_path, spark_session, monkeypatch):
    """PeriodicImpulse's bounded part (Impulse and the restriction's set-up) ends in the
    first epoch while its reading goes on: later epochs no longer run those stages."""
    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    from beam_streams_runner.driver.streaming import StreamingDriver
    epochs = []  # (stages that reported, stages finished after that epoch)
    find_finished = StreamingDriver._find_finished_stages

    def recording(self, reports):
        find_finished(self, reports)
        epochs.append(({stage for stage, _ in reports}, set(self.sources.finished)))

    monkeypatch.setattr(StreamingDriver, '_find_finished_stages', recording)
    # Far enough ahead that the first epoch (workers starting) ends before the first firing.
    start = Timestamp.now().micros // 1_000_000 + 8
    lines = run_streaming(
        lambda p: (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 2,
                                       fire_interval=1)
                   | beam.Map(lambda t: int(t) - start)),
        StreamsSparkRunner(), str(tmp_path / 'out'), SPARK_ARGS)
    assert sorted(int(line.split()[0]) for line in lines) == [0, 1]
    assert len(epochs) >= 2 and epochs[0][1], 'the bounded part finishes in epoch 0'
    for (_, finished), (ran, _) in itertools.pairwise(epochs):
        assert not ran & finished, f'finished stages {ran & finished} ran again'
    assert epochs[-1][1] == epochs[-1][1] | epochs[-2][0]
