"""End-to-end tests of the streaming driver: epochs, in-band watermarks, state across epochs.

Outputs are compared with Beam's DirectRunner in streaming mode through
`conftest.same_as_direct_streaming`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import apache_beam as beam
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


def test_partitions_move_between_python_workers(tmp_path):
    """With Python worker reuse off, every task of every epoch runs in a new worker:
    each stateful partition is restored from the state the previous epoch committed."""
    script = tmp_path / 'moves.py'
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.conftest import events_with_late_data, run_streaming
        from tests.test_streaming_driver import _BufferUntilWindowEnd
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
