"""The PipelineResult: waiting with a duration, cancelling, state."""

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
from beam_streams_runner.metrics import MetricTotals
from beam_streams_runner.result import PipelineInterrupted, StreamsSparkPipelineResult


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


def _signal_once_waiting(signum: int) -> threading.Thread:
    """Sends `signum` to the main thread once it blocks in `wait_until_finish`."""
    main = threading.main_thread()

    def waiting() -> bool:
        frame = sys._current_frames().get(main.ident)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        return names[:1] == ['_wait_for_tstate_lock'] and 'wait_until_finish' in names

    def send() -> None:
        deadline = time.monotonic() + 60  # a hang guard: sent anyway after it
        while not waiting() and time.monotonic() < deadline:
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
def test_sigterm_cancels_a_streaming_program(tmp_path):
    _assert_cancelled(*_interrupted_program(tmp_path, EXAMPLE, signal.SIGTERM))


@pytest.mark.timeout(900)
def test_ctrl_c_cancels_a_run_the_program_never_waited_for(tmp_path):
    """The program ends after p.run(): the interpreter waits for the run at exit."""
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
    _assert_cancelled(*_interrupted_program(tmp_path, [sys.executable, str(script)],
                                            signal.SIGINT))
