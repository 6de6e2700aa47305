"""The pipelines of the fault tests and the fault matrix, and their golden outputs.

Design section 12 (the consistent-regions paper's golden-run tests). Every pipeline
reads the same kind of input, a `PeriodicImpulse` from `spec.start` over `spec.span_s`
seconds: stream A one element every 10 ms (element i: timestamp `start + i / 100`,
key `i % KEYS`, the 1-second window `i // 100`), stream B one every 20 ms, a side
stream one every 250 ms. Each writes lines through the sink of `spec` (one line per
result; a line's identity, the Redis key, is its tokens before the first `n...`):

* P1 `stateless`: a chain of Maps and a Filter, one line per element kept;
* P2 `combine`: `CombinePerKey` of (count, sum of i) per key and 1-second window;
* P3 `windows`: tumbling 1-second windows with early (processing-time) and late
  panes, accumulating, where every 100th element arrives a second late, and sliding
  2-second windows every second; judged by the final pane of each window and key,
  with no pane index published twice and none skipped;
* P4 `stateful`: a stateful DoFn with a `ReadModifyWriteState` count and a `BagState`
  of the elements seen, filled from a buffer by a processing-time timer and flushed
  by an event-time timer at the window's end (a replayed element shows as count !=
  distinct, lost state as a wrong sum);
* P5 `side_input`: P2 where each element first reads its window's sum of the side
  stream (`AsSingleton` of a windowed `CombineGlobally`), waiting for it;
* P6 `cogroup`: streams A and B through `CoGroupByKey`, each side's aggregate to a
  sink of its own (labels `a` and `b`);
* P7 `cuts`: P2 whose source asks for a cut after every 100 elements (a file), with
  the period out of the way: operator-driven cuts only;
* P8 `regions`: P2 over stream A in region `a`, P4 over stream B in region `b`, and
  an autonomous branch (not judged) beside them.

`golden(spec)` gives each label's lines, sorted, computed from the input's
definition. The faults go in through the `Hooks` a test hands to `build`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Duration, Timestamp

from beam_streams_runner.regions.requests import request_checkpoint

INTERVAL = 0.01
PER_SECOND = 100  # elements of stream A per 1-second window
B_INTERVAL = 0.02
B_PER_SECOND = 50
SIDE_INTERVAL = 0.25
KEYS = 3
LATE_EVERY = 100  # P3: element i with i % 100 == 99 comes a second late
LATENESS_S = 600
EARLY_S = 1  # P3: an early pane a second after a window's first element (whole seconds: Beam)
TIMER_S = 0.1  # P4: the processing-time timer moving the buffer into the state

Aggregates = dict[tuple[int, int], tuple[int, int]]


def elements(span_s: int, interval: float = INTERVAL) -> int:
    """How many elements `PeriodicImpulse` emits over `span_s` seconds (as Beam counts)."""
    return math.ceil(span_s * 1_000_000 / round(interval * 1_000_000))


def format_line(pipeline: str, window_start: int, key: int, count: int, total: int,
                distinct: int | None = None) -> str:
    line = f'w{window_start} k{key} n{count} s{total}'
    return f'{line} d{distinct}' if pipeline == 'stateful' else line


def identity(line: str) -> str:
    """A line's identity (its Redis key): its tokens before the first `n...`."""
    tokens = line.split()
    end = next(i for i, token in enumerate(tokens) if token.startswith('n'))
    return ':'.join(tokens[:end])


def aggregate(start: int, span_s: int, per_second: int, value=lambda i: i,
              shift=lambda i: 0) -> Aggregates:
    """(window start, key) -> (count, sum of `value(i)`) over a stream of `per_second`
    elements a second, element i moved `shift(i)` windows."""
    out: Aggregates = {}
    for i in range(elements(span_s, 1 / per_second)):
        key = (start + i // per_second + shift(i), i % KEYS)
        count, total = out.get(key, (0, 0))
        out[key] = (count + 1, total + value(i))
    return out


def lines_of(pipeline: str, aggregates: Aggregates) -> list[str]:
    return sorted(format_line(pipeline, w, k, n, s, n) for (w, k), (n, s) in aggregates.items())


# Hooks: where a test puts its faults and its sinks ---------------------------------------------
@dataclasses.dataclass
class Hooks:
    """What `build` calls: `at_source` on stream A's (key, i), `at_lines` on the lines
    of label `a` (or the only label), `write(lines, label)` to publish them."""

    at_source: Callable = lambda pcoll: pcoll
    at_lines: Callable = lambda pcoll: pcoll
    write: Callable = lambda lines, label='': None


# Shared steps ------------------------------------------------------------------------------------
class Index(beam.DoFn):
    """The impulse's timestamp -> (key, element index)."""

    def __init__(self, start: int, per_second: int = PER_SECOND, cut_every: int = 0) -> None:
        self.start = start
        self.per_second = per_second
        self.cut_every = cut_every

    def process(self, t):
        i = round((float(t) - self.start) * self.per_second)
        if self.cut_every and i % self.cut_every == self.cut_every - 1:
            request_checkpoint()  # the end of a "file"
        yield i % KEYS, i


def stream(p, spec, label: str = 'Impulse', per_second: int = PER_SECOND,
           cut_every: int = 0):
    """(key, i) of a stream of `per_second` elements a second."""
    return (p
            | label >> PeriodicImpulse(spec.start, spec.start + spec.span_s, 1 / per_second)
            | f'{label}Index' >> beam.ParDo(Index(spec.start, per_second, cut_every)))


def window_start(w) -> int:
    return w.start.micros // 1_000_000


class CountAndSum(beam.CombineFn):
    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, i):
        return acc[0] + 1, acc[1] + i

    def merge_accumulators(self, accs):
        accs = list(accs)
        return sum(a[0] for a in accs), sum(a[1] for a in accs)

    def extract_output(self, acc):
        return acc


class FormatCombined(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam):
        key, (count, total) = kv
        yield format_line('combine', window_start(w), key, count, total)


class CountInState(beam.DoFn):
    """Counts a key's elements in its window in state: a processing-time timer moves
    the buffered elements into the count, the event-time timer at the window's end
    moves the rest and emits."""

    BUFFER = userstate.BagStateSpec('buffer', VarIntCoder())
    COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
    SEEN = userstate.BagStateSpec('seen', VarIntCoder())
    FLUSH = userstate.TimerSpec('flush', TimeDomain.WATERMARK)
    MOVE = userstate.TimerSpec('move', TimeDomain.REAL_TIME)

    def process(self, kv, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER),
                flush=beam.DoFn.TimerParam(FLUSH), move=beam.DoFn.TimerParam(MOVE)):
        buffer.add(kv[1])
        flush.set(w.max_timestamp())
        move.set(Timestamp.now() + Duration.of(TIMER_S))

    @staticmethod
    def _move(buffer, count, seen) -> None:
        items = list(buffer.read())
        if items:
            count.write((count.read() or 0) + len(items))
            for i in items:
                seen.add(i)
            buffer.clear()

    @userstate.on_timer(MOVE)
    def moved(self, buffer=beam.DoFn.StateParam(BUFFER), count=beam.DoFn.StateParam(COUNT),
              seen=beam.DoFn.StateParam(SEEN)):
        self._move(buffer, count, seen)

    @userstate.on_timer(FLUSH)
    def emit(self, key=beam.DoFn.KeyParam, w=beam.DoFn.WindowParam,
             buffer=beam.DoFn.StateParam(BUFFER), count=beam.DoFn.StateParam(COUNT),
             seen=beam.DoFn.StateParam(SEEN)):
        self._move(buffer, count, seen)
        items = list(seen.read())
        yield format_line('stateful', window_start(w), key, count.read() or 0, sum(items),
                          len(set(items)))
        count.clear()
        seen.clear()


def counted(keyed, prefix: str = ''):
    return (keyed
            | f'{prefix}Window' >> beam.WindowInto(window.FixedWindows(1))
            | f'{prefix}Count' >> beam.CombinePerKey(CountAndSum())
            | f'{prefix}Format' >> beam.ParDo(FormatCombined()))


def counted_in_state(keyed, prefix: str = ''):
    return (keyed
            | f'{prefix}Window' >> beam.WindowInto(window.FixedWindows(1))
            | f'{prefix}CountInState' >> beam.ParDo(CountInState()))


# P1 stateless ------------------------------------------------------------------------------------
def _value(i: int) -> int:
    return i * 7 % 1000


class FormatElement(beam.DoFn):
    def process(self, element, w=beam.DoFn.WindowParam):
        i, value = element
        yield f'w{window_start(w)} e{i} n{value}'


def build_stateless(p, spec, hooks: Hooks) -> None:
    lines = (hooks.at_source(stream(p, spec))
             | 'Value' >> beam.Map(lambda ki: (ki[1], _value(ki[1])))
             | 'Keep' >> beam.Filter(lambda iv: iv[0] % 5 != 0)
             | 'Window' >> beam.WindowInto(window.FixedWindows(1))
             | 'Format' >> beam.ParDo(FormatElement()))
    hooks.write(hooks.at_lines(lines))


def golden_stateless(spec) -> dict[str, list[str]]:
    return {'': sorted(f'w{spec.start + i // PER_SECOND} e{i} n{_value(i)}'
                       for i in range(elements(spec.span_s)) if i % 5 != 0)}


# P2 combine, P7 cuts ---------------------------------------------------------------------------
def build_combine(p, spec, hooks: Hooks, cut_every: int = 0) -> None:
    keyed = hooks.at_source(stream(p, spec, cut_every=cut_every))
    hooks.write(hooks.at_lines(counted(keyed)))


def golden_combine(spec) -> dict[str, list[str]]:
    return {'': lines_of('combine', aggregate(spec.start, spec.span_s, PER_SECOND))}


# P3 windows -------------------------------------------------------------------------------------
class ComeLate(beam.DoFn):
    """Every `LATE_EVERY`-th element goes back a second: behind the watermark."""

    def process(self, ki, t=beam.DoFn.TimestampParam):
        if ki[1] % LATE_EVERY == LATE_EVERY - 1:
            yield window.TimestampedValue(ki, t - 1)
        else:
            yield ki


class FormatPane(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        key, (count, total) = kv
        yield f'w{window_start(w)} k{key} p{pane.index} n{count} s{total}'


class FormatSliding(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam):
        key, (count, total) = kv
        yield f'sw{window_start(w)} k{key} n{count} s{total}'


def build_windows(p, spec, hooks: Hooks) -> None:
    keyed = hooks.at_source(stream(p, spec))
    tumbling = (keyed
                | 'ComeLate' >> beam.ParDo(ComeLate()).with_output_types(tuple[int, int])
                | 'Tumbling' >> beam.WindowInto(
                    window.FixedWindows(1),
                    trigger=trigger.AfterWatermark(
                        early=trigger.AfterProcessingTime(EARLY_S),
                        late=trigger.AfterCount(1)),
                    accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
                    allowed_lateness=LATENESS_S)
                | 'TumblingCount' >> beam.CombinePerKey(CountAndSum())
                | 'FormatPane' >> beam.ParDo(FormatPane()))
    sliding = (keyed
               | 'Sliding' >> beam.WindowInto(window.SlidingWindows(2, 1))
               | 'SlidingCount' >> beam.CombinePerKey(CountAndSum())
               | 'FormatSliding' >> beam.ParDo(FormatSliding()))
    lines = ((tumbling, sliding)
             | 'Lines' >> beam.Flatten()
             # One pane of the sink per pane of lines, a late one too, none repeated.
             | 'ToSink' >> beam.WindowInto(
                 window.FixedWindows(1), trigger=trigger.AfterWatermark(
                     late=trigger.AfterCount(1)),
                 accumulation_mode=trigger.AccumulationMode.DISCARDING,
                 allowed_lateness=LATENESS_S))
    hooks.write(hooks.at_lines(lines))


def golden_windows(spec) -> dict[str, list[str]]:
    """The final pane of every tumbling window and key (no `p` token: any index), and
    every sliding window's line."""
    late = aggregate(spec.start, spec.span_s, PER_SECOND,
                     shift=lambda i: -1 if i % LATE_EVERY == LATE_EVERY - 1 else 0)
    sliding: Aggregates = {}
    for (w, k), (n, s) in aggregate(spec.start, spec.span_s, PER_SECOND).items():
        for start in (w - 1, w):
            count, total = sliding.get((start, k), (0, 0))
            sliding[(start, k)] = (count + n, total + s)
    return {'': sorted([*lines_of('combine', late),
                        *(f's{line}' for line in lines_of('combine', sliding))])}


# P4 stateful ------------------------------------------------------------------------------------
def build_stateful(p, spec, hooks: Hooks) -> None:
    hooks.write(hooks.at_lines(counted_in_state(hooks.at_source(stream(p, spec)))))


def golden_stateful(spec) -> dict[str, list[str]]:
    return {'': lines_of('stateful', aggregate(spec.start, spec.span_s, PER_SECOND))}


# P5 side input ----------------------------------------------------------------------------------
def _side_sum(window_offset: int) -> int:
    per_window = round(1 / SIDE_INTERVAL)
    return sum(range(per_window * window_offset, per_window * (window_offset + 1)))


def build_side_input(p, spec, hooks: Hooks) -> None:
    side = (p
            | 'SideImpulse' >> PeriodicImpulse(spec.start, spec.start + spec.span_s,
                                               SIDE_INTERVAL)
            | 'SideIndex' >> beam.Map(lambda t, s=spec.start: round((float(t) - s)
                                                                     / SIDE_INTERVAL))
            | 'SideWindow' >> beam.WindowInto(window.FixedWindows(1))
            | 'SideSum' >> beam.CombineGlobally(sum).without_defaults())
    keyed = (hooks.at_source(stream(p, spec))
             | 'Window' >> beam.WindowInto(window.FixedWindows(1))
             | 'WithSide' >> beam.Map(lambda ki, m: (ki[0], ki[1] * 1000 + m),
                                      m=beam.pvalue.AsSingleton(side)))
    lines = (keyed
             | 'Count' >> beam.CombinePerKey(CountAndSum())
             | 'Format' >> beam.ParDo(FormatCombined()))
    hooks.write(hooks.at_lines(lines))


def golden_side_input(spec) -> dict[str, list[str]]:
    return {'': lines_of('combine', aggregate(
        spec.start, spec.span_s, PER_SECOND,
        value=lambda i: i * 1000 + _side_sum(i // PER_SECOND)))}


# P6 cogroup -------------------------------------------------------------------------------------
class SplitCoGrouped(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam):
        key, grouped = kv
        for tag in ('a', 'b'):
            values = list(grouped[tag])
            yield beam.pvalue.TaggedOutput(tag, format_line(
                'combine', window_start(w), key, len(values), sum(values)))


def build_cogroup(p, spec, hooks: Hooks) -> None:
    a = (hooks.at_source(stream(p, spec))
         | 'WindowA' >> beam.WindowInto(window.FixedWindows(1)))
    b = (stream(p, spec, 'ImpulseB', B_PER_SECOND)
         | 'WindowB' >> beam.WindowInto(window.FixedWindows(1)))
    split = ({'a': a, 'b': b}
             | 'CoGroup' >> beam.CoGroupByKey()
             | 'Split' >> beam.ParDo(SplitCoGrouped()).with_outputs('a', 'b'))
    hooks.write(hooks.at_lines(split.a), 'a')
    hooks.write(split.b, 'b')


def golden_cogroup(spec) -> dict[str, list[str]]:
    return {'a': lines_of('combine', aggregate(spec.start, spec.span_s, PER_SECOND)),
            'b': lines_of('combine', aggregate(spec.start, spec.span_s, B_PER_SECOND))}


# P8 regions -------------------------------------------------------------------------------------
class CountMetric(beam.DoFn):
    def __init__(self) -> None:
        self.seen = beam.metrics.Metrics.counter('autonomous', 'elements')

    def process(self, element):
        self.seen.inc()
        yield element


class BranchA(beam.PTransform):
    """Region `a`: P2 over stream A, its faults, its sink."""

    def __init__(self, spec, hooks: Hooks) -> None:
        super().__init__()
        self.spec, self.hooks = spec, hooks

    def expand(self, root):
        keyed = self.hooks.at_source(stream(root.pipeline, self.spec))
        self.hooks.write(self.hooks.at_lines(counted(keyed)), 'a')


class BranchB(beam.PTransform):
    """Region `b`: P4 over stream B, its sink."""

    def __init__(self, spec, hooks: Hooks) -> None:
        super().__init__()
        self.spec, self.hooks = spec, hooks

    def expand(self, root):
        keyed = stream(root.pipeline, self.spec, 'ImpulseB', B_PER_SECOND)
        self.hooks.write(counted_in_state(keyed), 'b')


class Autonomous(beam.PTransform):
    """Outside every region: not checkpointed, not replayed, not judged."""

    def __init__(self, spec) -> None:
        super().__init__()
        self.spec = spec

    def expand(self, root):
        return (root
                | 'ImpulseC' >> PeriodicImpulse(self.spec.start,
                                                self.spec.start + self.spec.span_s, 0.1)
                | 'Seen' >> beam.ParDo(CountMetric()))


REGION_FLAGS = ('--consistent_region=a=A', '--consistent_region=b=B', '--autonomous_steps=C')


def build_regions(p, spec, hooks: Hooks) -> None:
    p | 'A' >> BranchA(spec, hooks)
    p | 'B' >> BranchB(spec, hooks)
    p | 'C' >> Autonomous(spec)


def golden_regions(spec) -> dict[str, list[str]]:
    return {'a': lines_of('combine', aggregate(spec.start, spec.span_s, PER_SECOND)),
            'b': lines_of('stateful', aggregate(spec.start, spec.span_s, B_PER_SECOND))}


# The table ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FaultPipeline:
    """A pipeline of the fault tests: its builder, golden lines and runner flags."""

    name: str
    code: str  # P1..P8
    build: Callable
    golden: Callable
    flags: tuple[str, ...] = ()
    panes: bool = False  # judged by final panes (P3)
    sinks: tuple[str, ...] = ('files', 'redis')  # the matrix's sinks (tests may use any)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(sorted(self.golden(_SHAPE)))


@dataclasses.dataclass(frozen=True)
class _Shape:
    start: int = 0
    span_s: int = 1


_SHAPE = _Shape()

PIPELINES = {pipeline.name: pipeline for pipeline in (
    FaultPipeline('stateless', 'P1', build_stateless, golden_stateless),
    FaultPipeline('combine', 'P2', build_combine, golden_combine,
                  sinks=('files', 'redis', 'text')),
    FaultPipeline('windows', 'P3', build_windows, golden_windows, panes=True),
    FaultPipeline('stateful', 'P4', build_stateful, golden_stateful,
                  sinks=('files', 'redis', 'text')),
    FaultPipeline('side_input', 'P5', build_side_input, golden_side_input),
    FaultPipeline('cogroup', 'P6', build_cogroup, golden_cogroup),
    # Only the source's requests cut: the period is longer than any run.
    FaultPipeline('cuts', 'P7', lambda p, spec, hooks: build_combine(p, spec, hooks,
                                                                      PER_SECOND),
                  golden_combine, flags=('--checkpoint_period_s=3600',)),
    FaultPipeline('regions', 'P8', build_regions, golden_regions, flags=REGION_FLAGS),
)}


if __name__ != '__main__':
    # Spark's Python workers cannot import the tests: ship this module's code by value.
    from apache_beam.internal import cloudpickle as _beam_cloudpickle
    _beam_cloudpickle.register_pickle_by_value(sys.modules[__name__])
