"""The PipelineResult: waiting with a duration, cancelling, draining, state."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import userstate

from beam_streams_runner import StreamsSparkRunner
from beam_streams_runner import result as result_module
from beam_streams_runner.errors import UnsupportedFeatureError
from beam_streams_runner.metrics import MetricTotals
from beam_streams_runner.result import (
    PipelineDrained,
    PipelineInterrupted,
    StreamsSparkPipelineResult,
)


def _held(x, gate: str):
    """Holds every element until the test creates `gate`."""
    import os
    import time as _time
    while not os.path.exists(gate):
        _time.sleep(0.05)
    return x


def test_wait_with_duration_then_cancel(caplog, tmp_path):
    # The job cannot end while the gate is closed, so a wait that returns proves it
    # stopped after its duration, and a run that ends proves cancel() stopped it:
    # neither depends on how fast the machine is.
    gate = tmp_path / 'gate'
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]', '--bundle_size=1']))
    _ = p | beam.Create(list(range(400))) | beam.Map(_held, str(gate))
    result = p.run()
    # A hang guard, not a bound: a wait that ignores its duration then sees the job
    # end and returns DONE instead of hanging the suite.
    opener = threading.Timer(120, gate.touch)
    opener.start()
    try:
        assert result.wait_until_finish(duration=1000) == PipelineState.RUNNING
        opener.cancel()
        assert not gate.exists()
        # Were cancel() not to stop the Spark job, it would wait for the gate for good
        # (pytest-timeout ends it); the finally then lets the run end.
        assert result.cancel() == PipelineState.CANCELLED
        assert result.state == PipelineState.CANCELLED
        assert result.wait_until_finish() == PipelineState.CANCELLED
    finally:
        opener.cancel()
        gate.touch()
    assert not [r for r in caplog.records if 'Pipeline failed' in r.getMessage()]


def test_done_state_and_waiting_twice():
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]']))
    _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.state == PipelineState.DONE
    assert result.cancel() == PipelineState.DONE


class _CountPerKey(beam.DoFn):
    """Keeps one keyed state per key in the global window: it never expires."""

    SEEN = userstate.CombiningValueStateSpec('seen', sum)

    def __init__(self) -> None:
        self.ticks = beam.metrics.Metrics.counter('test', 'ticks')

    def process(self, element, seen=beam.DoFn.StateParam(SEEN)):
        self.ticks.inc()
        seen.add(1)
        yield element


def test_streaming_metrics_are_live_and_cancel_stops_an_endless_run():
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    p = beam.Pipeline(runner=StreamsSparkRunner(),
                      options=PipelineOptions(['--spark_master=local[2]', '--streaming']))
    _ = (p | PeriodicImpulse(fire_interval=0.1)  # never ends
         | beam.Map(lambda t: (int(t * 10) % 3, 1))
         | 'Count' >> beam.ParDo(_CountPerKey()))
    result = p.run()
    ticks, keyed_states = 0, None
    deadline = time.monotonic() + 120
    while (ticks < 3 or keyed_states != 3) and time.monotonic() < deadline:
        assert result.wait_until_finish(duration=500) == PipelineState.RUNNING
        metrics = result.metrics().query(MetricsFilter().with_step('Count'))
        ticks = sum(c.committed for c in metrics['counters'])
        keyed_states = next((g.committed.value for g in metrics['gauges']
                             if g.key.metric.name == 'keyed_states'), None)
    assert ticks >= 3, 'no user metric reported while the pipeline runs'
    assert keyed_states == 3, 'the runner gauge of live keyed states is missing or wrong'
    assert result.cancel() == PipelineState.CANCELLED
    assert result.wait_until_finish() == PipelineState.CANCELLED


# Ctrl-C and SIGTERM -------------------------------------------------------------------
def _endless_result() -> StreamsSparkPipelineResult:
    """A result over a run that only cancel() ends (no Spark: the result's own logic)."""
    stop = threading.Event()
    return StreamsSparkPipelineResult(run=stop.wait, cancel=stop.set, metric_totals=MetricTotals,
                                      on_done=lambda: None).start()


def _drainable_result(stops_on_drain: bool = True) -> tuple[StreamsSparkPipelineResult,
                                                              threading.Event]:
    """A streaming-like result (no Spark) and the event its drain sets; the run ends on
    cancel(), and on drain() when `stops_on_drain`."""
    stop, drained = threading.Event(), threading.Event()

    def drain() -> None:
        drained.set()
        if stops_on_drain:
            stop.set()

    result = StreamsSparkPipelineResult(run=stop.wait, cancel=stop.set,
                                        metric_totals=MetricTotals, on_done=lambda: None,
                                        drain=drain).start()
    return result, drained


def _signal_once_waiting(signum: int, after: threading.Event | None = None
                         ) -> threading.Thread:
    """Sends `signum` to the main thread once it blocks in `wait_until_finish` (and
    `after` is set)."""
    main = threading.main_thread()

    def waiting() -> bool:
        frame = sys._current_frames().get(main.ident)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        # Thread.join, or the result's Event.wait (a drain after SIGTERM).
        return (names[:1] in (['_wait_for_tstate_lock'], ['wait'])
                and 'wait_until_finish' in names)

    def send() -> None:
        deadline = time.monotonic() + 60  # a hang guard: sent anyway after it
        while ((not waiting() or (after is not None and not after.is_set()))
               and time.monotonic() < deadline):
            time.sleep(0.01)
        signal.pthread_kill(main.ident, signum)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler (the test session's SparkContext installed PySpark's,
    which cancels every Spark job of the session)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures('default_sigint')
def test_ctrl_c_in_a_program_cancels_the_run_and_exits_130(capsys, monkeypatch):
    monkeypatch.setattr(result_module, '_interactive', lambda: False)
    result = _endless_result()
    _signal_once_waiting(signal.SIGINT)
    with pytest.raises(PipelineInterrupted) as raised:
        result.wait_until_finish()
    # Uncaught, a SystemExit(130) ends the program quietly; `except KeyboardInterrupt`
    # in the program still sees it.
    assert raised.value.code == 130 and isinstance(raised.value, KeyboardInterrupt)
    assert result.state == PipelineState.CANCELLED
    assert capsys.readouterr().err == 'Pipeline cancelled\n'
    assert result.wait_until_finish() == PipelineState.CANCELLED


@pytest.mark.usefixtures('default_sigint')
def test_ctrl_c_in_an_interactive_session_cancels_the_run_and_goes_on(capsys, monkeypatch):
    monkeypatch.setattr(result_module, '_interactive', lambda: True)
    result = _endless_result()
    _signal_once_waiting(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as raised:
        result.wait_until_finish()
    assert type(raised.value) is KeyboardInterrupt  # not a SystemExit: the kernel lives on
    assert result.state == PipelineState.CANCELLED
    assert capsys.readouterr().err == 'Pipeline cancelled\n'


def test_sigterm_while_waiting_cancels_the_run_and_exits_130(capsys):
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip('SIGTERM has a handler in this process: the runner leaves it alone')
    result = _endless_result()
    _signal_once_waiting(signal.SIGTERM)
    with pytest.raises(PipelineInterrupted) as raised:
        result.wait_until_finish()
    assert raised.value.code == 130
    assert result.state == PipelineState.CANCELLED
    assert capsys.readouterr().err == 'Pipeline cancelled\n'
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def _skip_if_sigterm_handled() -> None:
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip('SIGTERM has a handler in this process: the runner leaves it alone')


def test_sigterm_while_waiting_drains_a_streaming_run_and_exits_0(capsys):
    _skip_if_sigterm_handled()
    result, drained = _drainable_result()
    _signal_once_waiting(signal.SIGTERM)
    with pytest.raises(PipelineDrained) as raised:
        result.wait_until_finish()
    # Uncaught, SystemExit(0) ends the program quietly, as a clean stop.
    assert raised.value.code == 0 and not isinstance(raised.value, KeyboardInterrupt)
    assert drained.is_set() and result.state == PipelineState.DRAINED
    assert capsys.readouterr().err == 'Pipeline drained\n'
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    assert result.wait_until_finish() == PipelineState.DRAINED


def test_a_second_sigterm_during_the_drain_cancels(capsys):
    _skip_if_sigterm_handled()
    result, drained = _drainable_result(stops_on_drain=False)  # a drain that hangs
    _signal_once_waiting(signal.SIGTERM)
    sender = _signal_once_waiting(signal.SIGTERM, after=drained)
    with pytest.raises(PipelineInterrupted) as raised:
        result.wait_until_finish()
    sender.join()
    assert raised.value.code == 130
    assert result.state == PipelineState.CANCELLED
    assert capsys.readouterr().err == 'Pipeline cancelled\n'
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.usefixtures('default_sigint')
def test_ctrl_c_during_a_drain_cancels(capsys, monkeypatch):
    monkeypatch.setattr(result_module, '_interactive', lambda: False)
    result, drained = _drainable_result(stops_on_drain=False)
    _signal_once_waiting(signal.SIGINT, after=drained)
    with pytest.raises(PipelineInterrupted):
        result.drain()
    assert result.state == PipelineState.CANCELLED
    assert capsys.readouterr().err == 'Pipeline cancelled\n'


def test_drain_waits_for_the_run_and_ends_drained():
    result, drained = _drainable_result()
    assert result.drain() == PipelineState.DRAINED
    assert drained.is_set()
    assert result.wait_until_finish() == PipelineState.DRAINED
    assert result.drain() == PipelineState.DRAINED  # a terminal state stays
    assert result.cancel() == PipelineState.DRAINED


def test_a_run_that_finished_before_the_drain_got_there_is_done():
    stop = threading.Event()
    result = StreamsSparkPipelineResult(run=stop.wait, cancel=stop.set,
                                        metric_totals=MetricTotals, on_done=lambda: None,
                                        drain=stop.set, drained=lambda: False).start()
    assert result.drain() == PipelineState.DONE


def test_a_batch_run_cannot_be_drained():
    result = _endless_result()  # no drain: a batch run
    with pytest.raises(UnsupportedFeatureError, match=r'batch pipeline .* cannot be drained'):
        result.drain()
    assert result.state == PipelineState.RUNNING
    assert result.cancel() == PipelineState.CANCELLED


def _descendants(pid: int) -> set[int]:
    """The processes below `pid` (the JVM, PySpark's daemon and workers), from /proc."""
    parents = {}
    for stat in glob.glob('/proc/[0-9]*/stat'):
        try:
            with open(stat, encoding='utf-8') as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(stat.split('/')[2])] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def _interrupted_program(tmp_path, command: list[str], signum: int) -> tuple[int, str]:
    """Starts a streaming pipeline program writing panes under tmp_path/out, sends it
    `signum` once it wrote some, and returns its exit status and stderr once it and
    every process it started (Spark's JVM, Python workers) are gone."""
    out = tmp_path / 'out'
    err_path = tmp_path / 'stderr.txt'
    with open(err_path, 'w', encoding='utf-8') as err:
        program = subprocess.Popen(
            [*command, '--runner=StreamsSparkRunner', '--spark_master=local[2]',
             '--window_s=1', '--rate=20', f'--output={out}/panes'],
            stdout=err, stderr=subprocess.STDOUT, cwd=str(tmp_path),
            env={**os.environ, 'PYSPARK_PYTHON': sys.executable})
    try:
        deadline = time.monotonic() + 400  # hang guards, not bounds
        while (not glob.glob(str(out / 'panes-*')) and program.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert program.poll() is None, err_path.read_text()
        spark_processes = _descendants(program.pid)
        assert spark_processes, 'no JVM under the program'
        program.send_signal(signum)
        status = program.wait(timeout=120)
        while (any(_alive(pid) for pid in spark_processes)
               and time.monotonic() < deadline + 120):
            time.sleep(0.2)
        assert not [pid for pid in spark_processes if _alive(pid)], 'Spark outlived it'
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
    return status, err_path.read_text()


def _assert_drained(status: int, stderr: str) -> None:
    assert status == 0, stderr[-3000:]
    assert stderr.count('Pipeline drained') == 1, stderr[-3000:]
    assert any(line.endswith('Pipeline drained') for line in stderr.splitlines())
    assert 'Traceback' not in stderr, stderr[-3000:]


def _assert_cancelled(status: int, stderr: str) -> None:
    assert status == 130, stderr[-3000:]
    assert stderr.count('Pipeline cancelled') == 1, stderr[-3000:]
    # A line of its own, though Spark's console progress bar may sit before it (the bar
    # redraws itself with carriage returns, never ending its line).
    assert any(line.endswith('Pipeline cancelled') for line in stderr.splitlines())
    assert 'Traceback' not in stderr, stderr[-3000:]


EXAMPLE = [sys.executable, '-m', 'beam_streams_runner.examples.streaming_counts']


@pytest.mark.timeout(900)
def test_ctrl_c_cancels_a_streaming_program(tmp_path):
    _assert_cancelled(*_interrupted_program(tmp_path, EXAMPLE, signal.SIGINT))


@pytest.mark.timeout(900)
def test_sigterm_drains_a_streaming_program_which_exits_0(tmp_path):
    # Consistent regions are on by default: the drain's last checkpoint is durable
    # (tests/driver/test_drain.py resumes from it).
    _assert_drained(*_interrupted_program(tmp_path, EXAMPLE, signal.SIGTERM))


def _no_wait_program(tmp_path) -> list[str]:
    """A program that ends after p.run(): the interpreter waits for the run at exit."""
    script = tmp_path / 'no_wait.py'
    script.write_text(textwrap.dedent('''
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
        from beam_streams_runner.examples.streaming_counts import build_pipeline, parse_args

        counts_options, pipeline_args = parse_args()
        options = PipelineOptions(pipeline_args)
        options.view_as(StandardOptions).streaming = True
        pipeline = beam.Pipeline(options=options)
        build_pipeline(pipeline, counts_options)
        pipeline.run()  # and no wait_until_finish()
    '''))
    return [sys.executable, str(script)]


@pytest.mark.timeout(900)
def test_ctrl_c_cancels_a_run_the_program_never_waited_for(tmp_path):
    _assert_cancelled(*_interrupted_program(tmp_path, _no_wait_program(tmp_path),
                                            signal.SIGINT))


@pytest.mark.timeout(900)
def test_sigterm_drains_a_run_the_program_never_waited_for(tmp_path):
    _assert_drained(*_interrupted_program(tmp_path, _no_wait_program(tmp_path),
                                          signal.SIGTERM))
