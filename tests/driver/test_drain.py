"""Draining a streaming run (`result.drain()`, SIGTERM) and the drain timeout.

The pipeline counts the elements of a `PeriodicImpulse` per key in one window that
fires when the stream ends, so its output is written once, at the end: a drain in the
middle leaves no output, and the run that resumes from the drain's last checkpoint
writes counts that are exact only if every element was counted once over both runs.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import apache_beam as beam
import pytest
from apache_beam.runners.runner import PipelineState

from beam_streams_runner.driver.draining import EpochTimeoutError
from tests.faults.counting import counts_pipeline, expected, output

FLAGS = ['--streaming', '--spark_master=local[2]', '--target_latency_ms=300',
         '--bundle_size=50']
_CUT = re.compile(r"Consistent region 'default': checkpoint (\d+) after epoch (\d+) is "
                  r'consistent')


class Touch(beam.DoFn):
    """Creates `marker` once an element at or past `at` went through."""

    def __init__(self, marker: str, at: int) -> None:
        self.marker, self.at = marker, at

    def process(self, element):
        if element >= self.at and not os.path.exists(self.marker):
            open(self.marker, 'w').close()
        yield element


class SleepOnce(beam.DoFn):
    """Sleeps `seconds` at element `at`, the first time only (the marker remembers)."""

    def __init__(self, marker: str, at: int, seconds: float) -> None:
        self.marker, self.at, self.seconds = marker, at, seconds

    def process(self, element):
        if element == self.at and not os.path.exists(self.marker):
            open(self.marker, 'w').close()
            time.sleep(self.seconds)
        yield element


def wait_for(path, result=None, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s  # a hang guard, not a bound
    while not os.path.exists(path) and time.monotonic() < deadline:
        if result is not None:
            assert result.wait_until_finish(duration=200) == PipelineState.RUNNING
        else:
            time.sleep(0.2)
    assert os.path.exists(path)


def messages(caplog) -> str:
    return '\n'.join(r.getMessage() for r in caplog.records)


@pytest.fixture
def runner_logs(caplog):
    caplog.set_level(logging.INFO, logger='beam_streams_runner')
    return caplog


# result.drain() ------------------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_drain_takes_a_last_checkpoint_and_the_job_resumes_exactly(tmp_path, runner_logs):
    elements, interval = 400, 0.05  # a 20 s stream, drained after about 2 s
    start = time.time()
    flags = [*FLAGS, f'--job_name=drain-{uuid.uuid4().hex[:8]}', '--checkpoint_period_s=1']
    marker = str(tmp_path / 'seen-40')
    first = counts_pipeline(tmp_path, flags, start, elements, interval,
                            Touch(marker, 40)).run()
    wait_for(marker, first)
    assert first.drain() == PipelineState.DRAINED
    assert first.state == PipelineState.DRAINED
    assert first.wait_until_finish() == PipelineState.DRAINED
    assert output(tmp_path) == []  # the window fires only when the stream ends
    last_epoch = first.progress()[-1]['epoch']
    logged = messages(runner_logs)
    # The drain's own cut, after the last epoch, is durable (waited for).
    assert str(last_epoch) in [epoch for _, epoch in _CUT.findall(logged)], logged[-3000:]
    assert f'drained after epoch {last_epoch}, its last checkpoint stored' in logged
    runner_logs.clear()

    second = counts_pipeline(tmp_path, flags, start, elements, interval, Touch(marker, 40))
    assert second.run().wait_until_finish() == PipelineState.DONE
    assert 'resumes from its checkpoints' in messages(runner_logs)
    assert output(tmp_path) == expected(elements)


@pytest.mark.timeout(600)
def test_drain_with_consistent_regions_off_stops_and_warns(tmp_path, runner_logs):
    marker = str(tmp_path / 'seen-20')
    result = counts_pipeline(tmp_path, [*FLAGS, '--checkpoint_period_s=0'], time.time(),
                             100_000, 0.05, Touch(marker, 20)).run()
    wait_for(marker, result)
    assert result.drain() == PipelineState.DRAINED
    assert result.wait_until_finish() == PipelineState.DRAINED
    warnings = [r.getMessage() for r in runner_logs.records if r.levelno == logging.WARNING
                and 'nothing was checkpointed' in r.getMessage()]
    assert len(warnings) == 1, messages(runner_logs)[-3000:]
    assert 'cannot be resumed' in warnings[0] and '--checkpoint_period_s=0' in warnings[0]
    assert not _CUT.search(messages(runner_logs))


# SIGTERM -------------------------------------------------------------------------------------
PROGRAM = textwrap.dedent('''
    """python program.py OUT MARKER START_FILE [flags]: counts a 30 s stream from the
    time in START_FILE (written by the first run)."""
    import logging
    import os
    import sys
    import time
    import uuid

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms import window
    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    import beam_streams_runner  # noqa: F401 - makes --runner=StreamsSparkRunner known

    ELEMENTS, INTERVAL, KEYS = 600, 0.05, 5


    class Touch(beam.DoFn):
        def __init__(self, marker):
            self.marker = marker

        def process(self, element):
            if element >= 80 and not os.path.exists(self.marker):
                open(self.marker, 'w').close()
            yield element


    class WriteLines(beam.DoFn):
        def __init__(self, directory):
            self.directory = directory

        def process(self, element):
            with open(os.path.join(self.directory, uuid.uuid4().hex), 'w') as f:
                f.write(f'{element}\\n')


    def main(out, marker, start_file, *flags):
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger('beam_streams_runner').setLevel(logging.INFO)
        if not os.path.exists(start_file):
            with open(start_file, 'w') as f:
                f.write(repr(time.time()))
        start = float(open(start_file).read())
        with beam.Pipeline(options=PipelineOptions(['--streaming', *flags])) as p:
            (p
             | PeriodicImpulse(start, start + ELEMENTS * INTERVAL, INTERVAL)
             | beam.Map(lambda t: round((float(t) - start) / INTERVAL))
             | beam.ParDo(Touch(marker))
             | beam.WindowInto(window.FixedWindows(4_000_000_000))
             | beam.Map(lambda n: (n % KEYS, 1))
             | beam.CombinePerKey(sum)
             | beam.ParDo(WriteLines(out)))
        print('after the pipeline', flush=True)  # not reached after a SIGTERM


    if __name__ == '__main__':
        main(*sys.argv[1:])
''')


@pytest.mark.timeout(900)
def test_sigterm_drains_a_program_which_exits_0_and_resumes(tmp_path):
    program = tmp_path / 'program.py'
    program.write_text(PROGRAM)
    out = tmp_path / 'out'
    out.mkdir()
    marker = tmp_path / 'seen-80'
    command = [sys.executable, str(program), str(out), str(marker), str(tmp_path / 'start'),
               '--runner=StreamsSparkRunner', '--spark_master=local[2]',
               '--target_latency_ms=300', '--bundle_size=50', '--checkpoint_period_s=1',
               f'--job_name=sigterm-{uuid.uuid4().hex[:8]}']
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        wait_for(str(marker))
        assert first.poll() is None, first.communicate()[0][-3000:]
        first.send_signal(signal.SIGTERM)
        text = first.communicate(timeout=300)[0]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, text[-3000:]
    assert text.count('Pipeline drained') == 1 and 'Traceback' not in text, text[-3000:]
    assert 'after the pipeline' not in text  # SIGTERM ends the program
    assert 'its last checkpoint stored' in text and _CUT.search(text), text[-3000:]
    assert not os.listdir(out)

    second = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert 'resumes from its checkpoints' in second.stderr
    counts = sorted(line for name in os.listdir(out)
                    for line in open(out / name).read().splitlines())
    assert counts == expected(600)


# The drain timeout ---------------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_an_epoch_past_the_drain_timeout_resets_the_region_and_counts_stay_exact(
        tmp_path, runner_logs):
    elements, sleep_s = 3000, 90
    started = time.monotonic()
    # Every epoch gets 2 s: a cold Spark session's first epochs may time out too, each
    # one more reset, hence more attempts than the default.
    p = counts_pipeline(
        tmp_path, [*FLAGS, f'--job_name=timeout-{uuid.uuid4().hex[:8]}',
                   '--checkpoint_period_s=0.2', '--drain_timeout_s=2',
                   '--max_consecutive_reset_attempts=20'],
        time.time() - 1000, elements, 0.01, SleepOnce(str(tmp_path / 'slept'), 1500, sleep_s))
    assert p.run().wait_until_finish() == PipelineState.DONE
    assert output(tmp_path) == expected(elements)
    assert os.path.exists(tmp_path / 'slept')
    resets = [r.getMessage() for r in runner_logs.records
              if "Consistent region 'default': reset" in r.getMessage()]
    assert any('EpochTimeoutError: Epoch' in r and 'exceeded --drain_timeout_s=2' in r
               for r in resets), messages(runner_logs)[-3000:]
    # Sooner than the sleep: the sleeping epoch was cancelled, not waited for.
    assert time.monotonic() - started < sleep_s - 10


@pytest.mark.timeout(600)
def test_with_regions_off_a_drain_that_waits_past_the_timeout_fails_the_run(tmp_path):
    marker = str(tmp_path / 'slept')
    result = counts_pipeline(tmp_path, [*FLAGS, '--checkpoint_period_s=0', '--drain_timeout_s=2'],
                             time.time(), 100_000, 0.05, SleepOnce(marker, 10, 60)).run()
    wait_for(marker, result)
    asked = time.monotonic()
    with pytest.raises(EpochTimeoutError) as raised:
        result.drain()
    assert time.monotonic() - asked < 30, 'the drain waited for the sleeping epoch'
    assert result.state == PipelineState.FAILED
    message = str(raised.value)
    assert re.match(r'Epoch \d+ exceeded --drain_timeout_s=2: ', message), message
    assert 'a drain may wait for it' in message and 'raise --drain_timeout_s' in message
