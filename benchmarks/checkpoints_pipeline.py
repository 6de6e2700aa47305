"""The pipeline of the checkpoint benchmark (`benchmarks.checkpoints`), its reference
output, its keyed-state ballast, its fault, and one run of it in a child process.

Design sections 8 and 12. The events: `PeriodicImpulse` over past timestamps (event n at
`START + INTERVAL_S * n`, `INTERVAL_S` = 1 ms, so the source is read as fast as the
epochs go), n keyed by `n % KEYS` (1000 keys) in fixed windows of `WINDOW_S` (10 s) of
event time, then two branches: `CombinePerKey(sum)` of ones, and a stateful DoFn
(`BagCount`: the key's n in a `BagState`, its count in a `ReadModifyWriteState`, an
event-time timer at the window's end that emits both and clears them), so keyed state
of both kinds, combiner state and timers are in every checkpoint.

The keyed-state ballast, the state size of the benchmark: events 0 to `STATE_KEYS` - 1
(1024 keys) also go, keyed by n, to `Ballast`, a stateful DoFn in the global window
whose `ReadModifyWriteState` takes `pad_size(state_mb)` bytes of deterministic random
bytes (`pad_of`, incompressible) on the key's first element, so the operator holds
`state_mb` MB from the first epoch on to the end of the stream; an event-time timer at
the end of the global window (which fires once the stream ended) reads the pad back
and emits its length and CRC-32. The ballast is written once and then only held: this
runner writes each epoch's changed keys as a delta and a full snapshot every
`SNAPSHOT_EVERY` (20) revisions of a partition's state, and a reset (or a task that
lands in a Python worker whose cache is stale) reloads it from the store; what the
held state costs is those snapshots and reloads, not a copy at every cut.

Every output goes through a `sink_check.CountingSink` as a line (`sum`, `bag` per window
and key, `pad` per ballast key); `expected_lines` computes the lines a correct run
writes from the generator's definition (the same float arithmetic as `PeriodicImpulse`,
the same `Timestamp` rounding and window assignment, the same pads).

A recovery run adds `FailAt`, a stateless step after the source that, at event
`index`, writes a marker file holding the time and then fails its Python worker once
(`kill_worker`: the worker SIGKILLs itself, as `tests/faults` do; `raise`: an
exception): the marker makes the replay pass.
"""

from __future__ import annotations

import logging
import os
import random
import resource
import signal
import sys
import time
import zlib
from collections import Counter
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.coders import BytesCoder, VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import userstate, window
from apache_beam.transforms.periodicsequence import (
    ImpulseSeqGenRestrictionProvider,
    PeriodicImpulse,
)
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

import beam_streams_runner  # noqa: F401 - registers the short runner name
from benchmarks import batch_speed, keyed_state_gc, sink_check, sweep

START = 1_000_000_000.0  # event time of event 0 (2001): long past, read at full speed
INTERVAL_S = 0.001  # event time between two events
KEYS = 1000
WINDOW_S = 10
STATE_KEYS = 1024  # the ballast's keys; each holds state_mb / STATE_KEYS
MB = 1 << 20
FAULTS = ('kill_worker', 'raise')
MEMORY_SAMPLE_S = 1.0


# ---------------------------------------------------------------- the events and the reference


def stream_end(events: int) -> float:
    """`PeriodicImpulse`'s stop timestamp for `events` events (half an interval past the
    last one, so the rounding of the end never adds or drops an event)."""
    return START + (events - 0.5) * INTERVAL_S


def generated_events(events: int) -> int:
    """How many events `PeriodicImpulse` emits up to `stream_end(events)`: its own
    restriction's size (`events`, checked by the test)."""
    return ImpulseSeqGenRestrictionProvider().initial_restriction(
        (START, stream_end(events), INTERVAL_S)).stop


def event_index(t: float) -> int:
    """n of the event `PeriodicImpulse` emitted as the value `t` (a float)."""
    return round((float(t) - START) / INTERVAL_S)


def pad_size(state_mb: float) -> int:
    """Bytes of one ballast key's pad for `state_mb` MB over `STATE_KEYS` keys."""
    return max(1, round(state_mb * MB / STATE_KEYS))


def pad_of(key: int, size: int) -> bytes:
    """Key `key`'s pad: `size` random bytes seeded by the key (the same in every
    process; random, so no store or page could shrink it)."""
    return random.Random(key).randbytes(size)


def ballast_keys(events: int) -> int:
    """How many ballast keys `events` events fill (the first `STATE_KEYS` events)."""
    return min(STATE_KEYS, generated_events(events))


def sum_line(key: int, window_start_us: int, count: int) -> str:
    return f'sum\t{window_start_us}\t{key}\t{count}'


def bag_line(key: int, window_start_us: int, count: int, bagged: int, total: int) -> str:
    return f'bag\t{window_start_us}\t{key}\t{count}\t{bagged}\t{total}'


def pad_line(key: int, size: int, crc: int) -> str:
    return f'pad\t{key}\t{size}\t{crc}'


def pad_lines(events: int, state_mb: float) -> list[str]:
    """The ballast's output: a line per key with its pad's size and CRC-32."""
    size = pad_size(state_mb)
    return [pad_line(key, size, zlib.crc32(pad_of(key, size)))
            for key in range(ballast_keys(events))]


def expected_lines(events: int, state_mb: float) -> list[str]:
    """The sorted output of a correct run, from the generator's definition: event n is
    the float `START + INTERVAL_S * n` (as `ImpulseSeqGenDoFn` computes it) at that
    timestamp (`Timestamp.of`), keyed `n % KEYS`, in the fixed window of `WINDOW_S`
    holding it; per window and key, `sum` gives the count and `bag` the count, the
    number of bagged values and their sum; `pad` lines come from `pad_lines`."""
    window_us = WINDOW_S * 1_000_000
    counts: Counter = Counter()
    sums: Counter = Counter()
    for n in range(generated_events(events)):
        t = START + INTERVAL_S * n
        micros = Timestamp.of(t).micros
        cell = (event_index(t) % KEYS, micros - micros % window_us)
        counts[cell] += 1
        sums[cell] += event_index(t)
    lines = [sum_line(key, start, c) for (key, start), c in counts.items()]
    lines += [bag_line(key, start, c, c, sums[key, start])
              for (key, start), c in counts.items()]
    return sorted(lines + pad_lines(events, state_mb))


# ---------------------------------------------------------------- the pipeline


class BagCount(beam.DoFn):
    """Per key and window: every n in a `BagState`, the count in a `ReadModifyWriteState`;
    an event-time timer at the window's end emits `('bag', key, (count, values, sum))`
    and clears both."""

    VALUES = userstate.BagStateSpec('values', VarIntCoder())
    COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
    END = userstate.TimerSpec('end', TimeDomain.WATERMARK)

    def process(self, element: tuple[int, int], w=beam.DoFn.WindowParam,
                values=beam.DoFn.StateParam(VALUES), count=beam.DoFn.StateParam(COUNT),
                end=beam.DoFn.TimerParam(END)) -> None:
        values.add(element[1])
        count.write((count.read() or 0) + 1)
        end.set(w.max_timestamp())

    @userstate.on_timer(END)
    def flush(self, key=beam.DoFn.KeyParam, values=beam.DoFn.StateParam(VALUES),
              count=beam.DoFn.StateParam(COUNT)):
        bagged = list(values.read())
        yield 'bag', key, (count.read() or 0, len(bagged), sum(bagged))
        values.clear()
        count.clear()


class Ballast(beam.DoFn):
    """The keyed state of the benchmark's size: on a key's element, its pad (`pad_of`)
    in a `ReadModifyWriteState`, held to the end of the stream, when a timer at the end
    of the global window emits `('pad', key, (size, crc32))` read from the state."""

    PAD = userstate.ReadModifyWriteStateSpec('pad', BytesCoder())
    END = userstate.TimerSpec('end', TimeDomain.WATERMARK)

    def __init__(self, size: int) -> None:
        self.size = size

    def process(self, element: tuple[int, int], w=beam.DoFn.WindowParam,
                pad=beam.DoFn.StateParam(PAD), end=beam.DoFn.TimerParam(END)) -> None:
        pad.write(pad_of(element[0], self.size))
        end.set(w.max_timestamp())

    @userstate.on_timer(END)
    def flush(self, key=beam.DoFn.KeyParam, pad=beam.DoFn.StateParam(PAD)):
        value = pad.read() or b''
        yield 'pad', key, (len(value), zlib.crc32(value))
        pad.clear()


class FailAt(beam.DoFn):
    """At event `index`, once (the marker file `marker` remembers it, holding the time
    of the failure): `kill_worker` SIGKILLs this Python worker, `raise` raises."""

    def __init__(self, index: int, marker: str, kind: str) -> None:
        if kind not in FAULTS:
            raise ValueError(f'unknown fault {kind!r}: one of {FAULTS}')
        self.index, self.marker, self.kind = index, marker, kind

    def process(self, element: float):
        if event_index(element) == self.index:
            try:
                with open(self.marker, 'x', encoding='utf-8') as f:
                    f.write(f'{time.time()!r}\n')
            except FileExistsError:
                pass  # failed once already: the replay passes
            else:
                if self.kind == 'kill_worker':
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError(f'injected fault at event {self.index}')
        yield element


def failed_at(marker: str) -> float | None:
    """The time `FailAt` wrote in `marker` (None: it never failed)."""
    try:
        with open(marker, encoding='utf-8') as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def output_lines(element: tuple[str, int, tuple[int, ...]], w: window.BoundedWindow,
                 timestamp: Timestamp) -> list[str]:
    """The sink's line of an output `(tag, key, figures)` in window `w`."""
    tag, key, figures = element
    if tag == 'pad':
        return [pad_line(key, *figures)]
    line = sum_line if tag == 'sum' else bag_line
    return [line(key, w.start.micros, *figures)]


def build(p: beam.Pipeline, events: int, state_mb: float, sink_prefix: str,
          fault: FailAt | None = None) -> None:
    """The benchmark's pipeline on `p`, its outputs written under `sink_prefix`."""
    source = p | 'Events' >> PeriodicImpulse(START, stream_end(events), INTERVAL_S)
    if fault is not None:
        source = source | 'Fault' >> beam.ParDo(fault)
    keyed = (source
             # Typed, so the keys get a deterministic coder (VarInt).
             | 'Key' >> beam.Map(lambda t: (event_index(t) % KEYS, event_index(t))
                                 ).with_output_types(tuple[int, int])
             | 'Window' >> beam.WindowInto(window.FixedWindows(WINDOW_S)))
    sums = (keyed
            | 'One' >> beam.MapTuple(lambda key, n: (key, 1)).with_output_types(
                tuple[int, int])
            | 'Sum' >> beam.CombinePerKey(sum)
            | 'TagSum' >> beam.MapTuple(lambda key, count: ('sum', key, (count,))))
    bags = keyed | 'Bag' >> beam.ParDo(BagCount())
    _ = ((sums, bags)
         | 'Outputs' >> beam.Flatten()
         | 'Write' >> beam.ParDo(sink_check.CountingSink(sink_prefix, output_lines)))
    _ = (source
         | 'BallastKeys' >> beam.FlatMap(
             lambda t: [(event_index(t), 0)] if event_index(t) < STATE_KEYS else []
         ).with_output_types(tuple[int, int])
         | 'Ballast' >> beam.ParDo(Ballast(pad_size(state_mb)))
         | 'WritePads' >> beam.ParDo(sink_check.CountingSink(sink_prefix + '-pads',
                                                             output_lines)))


# ---------------------------------------------------------------- one run (the child)


def jvm_peak_rss_mb() -> float:
    """The peak RSS (`VmHWM`) of the JVMs below this process, in MB (0 if none)."""
    children = keyed_state_gc._children()
    pending, kb = list(children.get(os.getpid(), [])), 0
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        if keyed_state_gc._comm(pid) == 'java':
            kb += keyed_state_gc.proc_kb(f'/proc/{pid}/status', 'VmHWM:')
    return round(kb / 1024, 1)


def run_one(events: int, state_mb: float, sink_dir: str, runner_args: Sequence[str],
            fault: FailAt | None = None) -> dict:
    """Runs the pipeline once in this process (on a SparkSession started, and its Python
    workers forked, first); returns its figures. The output is judged by the parent."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format='%(asctime)s %(levelname)s %(name)s: %(message)s', force=True)
    # The progress, checkpoint and reset lines the parent reads.
    logging.getLogger('beam_streams_runner').setLevel(logging.INFO)
    spark = batch_speed.spark_session(runner_args)
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).count()  # fork the workers
    p = beam.Pipeline(runner='StreamsSparkRunner',
                      options=PipelineOptions(['--streaming', *runner_args]))
    build(p, events, state_mb, os.path.join(sink_dir, 'out'), fault)
    cpu = batch_speed.CpuClock()
    started = time.monotonic()
    with keyed_state_gc.WorkerMemorySampler(MEMORY_SAMPLE_S) as memory:
        result = p.run()
        state = result.wait_until_finish()
    wall_s = time.monotonic() - started
    return {'state': str(state), 'wall_s': round(wall_s, 3), 'cpu_s': round(cpu.elapsed(), 2),
            'epochs': sweep.epochs_of(result),
            'driver_peak_rss_mb': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                        / 1024, 1),
            'jvm_peak_rss_mb': jvm_peak_rss_mb(),
            'workers_peak_rss_mb': round(memory.peak_rss_mb, 1),
            'workers_peak_pss_mb': round(memory.peak_pss_mb, 1),
            'ok': state == PipelineState.DONE}
