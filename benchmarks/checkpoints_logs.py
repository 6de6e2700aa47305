"""What the checkpoint benchmark (`benchmarks.checkpoints`) reads from a run's log.

Design section 12. A child run logs `beam_streams_runner` at INFO to its stderr, each
record as `%(asctime)s %(levelname)s %(name)s: %(message)s`. From those lines:

* the streaming driver's progress line of every epoch (`driver.progress.summary`):
  when it ended, the events it read, the keyed states the partitions hold and the
  state bytes their deltas wrote (`epochs_in`, `steady_rate`, `state_figures`);
* the controller's `checkpoint N after epoch E is consistent` (`checkpoints_in`);
* a recovery (`recovery_times`), as Flink defines its parts: detection, from the
  failure (the time the fault wrote in its marker file) to the controller's
  `resetting after a failed epoch` line (the driver knows the epoch failed); reset,
  from there to its `reset K of M to checkpoint S after: ... (T s)` line (the region's
  members back at cut S: source positions, side-input buffers, partition revisions;
  the partitions' keyed state itself is loaded by the tasks of the next epoch, so
  its reload counts in catch-up); catch-up, from the end of the reset to the end of
  the first epoch whose read position passes the failure point again (the events read
  up to cut S's epoch, plus those read since the reset, past the failed event);
* the runner's lines at WARNING or above, and tracebacks (`problems_in`).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

STEADY_FROM = 0.2  # the steady state starts once this share of the events was read
_TIME = r'(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})'
CHECKPOINT_LINE = re.compile(
    r"Consistent region '?(?P<region>[^' ]+)'?: checkpoint (?P<sequence>\d+) after epoch "
    r'(?P<epoch>\d+) is consistent')
# The runner's progress line of an epoch, as `checkpoints_pipeline.run_one` logs it.
EPOCH_LINE = re.compile(
    rf'^{_TIME} INFO beam_streams_runner\.runner: StreamsSparkRunner: epoch '
    r'(?P<epoch>\d+): (?P<ms>\d+) ms[^;]*; read (?P<reads>[^;]*);.*?'
    r'(?P<keyed>\d+) keyed states, \d+ timers, (?P<bytes>\d+) state bytes written',
    re.MULTILINE)
RESET_START_LINE = re.compile(
    rf"^{_TIME} \w+ beam_streams_runner\.regions\.controller: Consistent region "
    r"'?(?P<region>[^' ]+)'?: resetting after a failed epoch", re.MULTILINE)
RESET_LINE = re.compile(
    rf"^{_TIME} \w+ beam_streams_runner\.regions\.controller: Consistent region "
    r"'?(?P<region>[^' ]+)'?: reset (?P<attempt>\d+) of \d+ to checkpoint "
    r'(?P<sequence>\d+) after: .*\((?P<seconds>[\d.]+) s\)$', re.MULTILINE)
PROBLEM_LINE = re.compile(r'\b(WARNING|ERROR|CRITICAL)\b.*\bbeam_streams_runner\b|^Traceback')


def log_time(text: str) -> float:
    """Seconds since the Unix epoch of a log record's `asctime` (local time, as
    `time.time()` in the same machine's processes)."""
    return datetime.datetime.strptime(text, '%Y-%m-%d %H:%M:%S,%f').timestamp()


@dataclass(frozen=True)
class Epoch:
    """An epoch's progress line: when it ended, its number, the events it read, the
    keyed states held after it and the state bytes its deltas wrote."""

    time: float
    epoch: int
    read: int
    keyed_states: int
    state_bytes: int


def epoch_lines(log: str) -> list[Epoch]:
    """Every epoch's progress line, in log order."""
    return [Epoch(log_time(m['time']), int(m['epoch']),
                  sum(int(n) for n in re.findall(r'(\d+) \(', m['reads'])),
                  int(m['keyed']), int(m['bytes']))
            for m in EPOCH_LINE.finditer(log)]


def checkpoints_in(log: str) -> list[tuple[str, int, int]]:
    """(region, checkpoint, epoch) of every 'checkpoint N after epoch E is consistent'."""
    return [(m['region'], int(m['sequence']), int(m['epoch']))
            for m in CHECKPOINT_LINE.finditer(log)]


def epochs_in(log: str) -> list[tuple[float, int]]:
    """(wall time s, events read so far) at the end of every epoch, from the runner's
    progress lines."""
    points, read = [], 0
    for epoch in epoch_lines(log):
        read += epoch.read
        points.append((epoch.time, read))
    return points


def steady_rate(log: str, events: int) -> float | str:
    """Events/s from the end of the first epoch by which `STEADY_FROM` of `events` were
    read to the end of the last epoch (the epochs' ramp-up left out); '' if the log has
    too few progress lines."""
    points = epochs_in(log)
    start = next((p for p in points if p[1] >= STEADY_FROM * events), None)
    if start is None or points[-1][0] <= start[0]:
        return ''
    return round((points[-1][1] - start[1]) / (points[-1][0] - start[0]))


def state_figures(log: str) -> dict:
    """The runner's own state figures of a run: the most keyed states the partitions
    held after an epoch (its gauge), and the MB their deltas wrote in all (the fill of
    the ballast included; snapshots are not counted by the runner)."""
    epochs = epoch_lines(log)
    return {'keyed_states_max': max((e.keyed_states for e in epochs), default=0),
            'state_written_mb': round(sum(e.state_bytes for e in epochs) / (1 << 20), 1)}


def problems_in(log: str) -> list[str]:
    """The runner's log lines at WARNING or above, and tracebacks."""
    return [line.strip() for line in log.splitlines() if PROBLEM_LINE.search(line)]


def recovery_times(log: str, failed_at: float, fail_index: int) -> dict | None:
    """The recovery after the failure at `failed_at` (seconds since the Unix epoch) on
    event `fail_index`: detection, reset, catch-up and total seconds (see the module
    docstring), the cut it reset to, the events replayed to reach the failure point and
    the first epoch after the reset; None if the log holds no complete reset after
    `failed_at`. Catch-up is '' when no epoch after the reset passed the failure point."""
    starts = [m for m in RESET_START_LINE.finditer(log) if log_time(m['time']) >= failed_at - 1]
    if not starts:
        return None
    detected = log_time(starts[0]['time'])
    reset = next((m for m in RESET_LINE.finditer(log) if m.start() > starts[0].start()), None)
    if reset is None:
        return None
    reset_end, sequence = log_time(reset['time']), int(reset['sequence'])
    cut_epoch = next((e for _, s, e in checkpoints_in(log) if s == sequence), -1)
    epochs = epoch_lines(log)
    before = [e for e in epochs if e.time <= detected]
    position = sum(e.read for e in before if e.epoch <= cut_epoch) if sequence else 0
    after = [e for e in epochs if e.time >= reset_end]
    caught_up, read = None, position
    for epoch in after:
        read += epoch.read
        if read > fail_index:
            caught_up = epoch
            break
    first_epoch_s = round(after[0].time - reset_end, 3) if after else ''
    return {'detection_s': round(detected - failed_at, 3),
            'reset_s': round(reset_end - detected, 3),
            'catch_up_s': round(caught_up.time - reset_end, 3) if caught_up else '',
            'total_s': round(caught_up.time - failed_at, 3) if caught_up else '',
            'reset_to_checkpoint': sequence, 'cut_epoch': cut_epoch,
            'replayed_events': fail_index + 1 - position,
            'first_epoch_after_reset_s': first_epoch_s,
            'caught_up_epoch': caught_up.epoch if caught_up else '',
            'resets': len(RESET_LINE.findall(log))}
