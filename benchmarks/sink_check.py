"""Did a benchmark's output arrive? A sink that counts what reached it, and the verdict.

No figure without a verdict: a benchmark reports its throughput (or memory) only for a
run whose output arrived and equals what its input implies. `CountingSink` is the
benchmarks' sink: per bundle it appends the lines it is given for each element (latency
samples, canonical output lines) and one tally line `#tally TAB count TAB checksum` (the
bundle's elements and the sum of a per-element checksum) to a file of its own DoFn
instance; `read_sink` reads every file back after the run, so what is counted is what was
written, including an element a retried bundle wrote twice.

`verdict` compares a tally with the expected one (`yes`, or `failed: expected N, got
M`), `lines_verdict` output lines with reference lines; an empty output is failed even
when nothing was expected. `throughput` gives elements / wall time only for a run
whose verdict is ok (`is_ok`: `yes`, or `yes (...)` for an output that is right in a
qualified sense), else '' so that no ratio, summary or goal can use it.
"""

from __future__ import annotations

import collections
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam

TALLY = '#tally'
YES = 'yes'
FAILED = 'failed'


@dataclass(frozen=True)
class Tally:
    """Elements that reached a sink, and the sum of their checksums."""

    count: int = 0
    checksum: int = 0

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.count + other.count, self.checksum + other.checksum)


@dataclass
class SinkOutput:
    """What a `CountingSink` wrote: the summed tally and the other lines, in file order."""

    tally: Tally
    lines: list[str]


# (element, window, timestamp) -> lines to write for it.
LinesFn = Callable[[Any, Any, Any], Sequence[str]]


class CountingSink(beam.DoFn):
    """Counts every element, sums `checksum(element)` and writes `lines(element, window,
    timestamp)`; at each bundle's end appends the lines and the bundle's tally line to a
    file of this instance's own (`prefix-<uuid>`), flushed, so a cancelled streaming run
    leaves every finished bundle on disk. A file per instance, not per bundle: creating
    a file per bundle is a sink cost that grows as bundles shrink."""

    def __init__(self, prefix: str, lines: LinesFn | None = None,
                 checksum: Callable[[Any], int] | None = None) -> None:
        super().__init__()
        self._prefix = prefix
        self._lines_of = lines
        self._checksum_of = checksum

    def setup(self) -> None:
        self._file = None

    def start_bundle(self) -> None:
        self._lines: list[str] = []
        self._count = 0
        self._checksum = 0

    def process(self, element, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam) -> None:
        self._count += 1
        if self._checksum_of is not None:
            self._checksum += self._checksum_of(element)
        if self._lines_of is not None:
            self._lines.extend(self._lines_of(element, window, timestamp))

    def finish_bundle(self) -> None:
        if not self._count:
            return
        if self._file is None:
            self._file = open(f'{self._prefix}-{uuid.uuid4().hex}', 'a', encoding='utf-8')
        self._lines.append(f'{TALLY}\t{self._count}\t{self._checksum}')
        self._file.write('\n'.join(self._lines) + '\n')
        self._file.flush()

    def teardown(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_sink(directory: str) -> SinkOutput:
    """Every line `CountingSink`s wrote under `directory` (files of any name): the summed
    tally and the other lines. A last line without its newline (a write cut short by a
    cancelled run) is left out, as is its bundle's tally, which comes after it."""
    tally, lines = Tally(), []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), encoding='utf-8') as f:
            for line in f:
                if not line.endswith('\n'):
                    break
                line = line[:-1]
                if line.startswith(TALLY + '\t'):
                    _, count, checksum = line.split('\t')
                    tally += Tally(int(count), int(checksum))
                elif line:
                    lines.append(line)
    return SinkOutput(tally, lines)


def verdict(expected: Tally, got: Tally) -> str:
    """`yes` if the sink got exactly the `expected` tally, else `failed: expected N, got
    M` (with the checksums when only they differ); an empty output is always failed."""
    if got.count == 0:
        return f'{FAILED}: expected {expected.count}, got 0 (empty output)'
    if got == expected:
        return YES
    if got.count == expected.count:
        return (f'{FAILED}: expected {expected.count} with checksum {expected.checksum}, '
                f'got {got.count} with checksum {got.checksum}')
    return f'{FAILED}: expected {expected.count}, got {got.count}'


def lines_verdict(got: Sequence[str], expected: Sequence[str]) -> str:
    """`yes` if `got` and `expected` are equal as multisets of lines, else `failed: expected
    N, got M` with how many lines are missing and unexpected; empty output is failed."""
    if not got:
        return f'{FAILED}: expected {len(expected)}, got 0 (empty output)'
    have, want = collections.Counter(got), collections.Counter(expected)
    if have == want:
        return YES
    missing, unexpected = want - have, have - want
    return (f'{FAILED}: expected {len(expected)}, got {len(got)} '
            f'({sum(missing.values())} missing, {sum(unexpected.values())} unexpected; '
            f'first missing {sorted(missing)[:3]}, first unexpected {sorted(unexpected)[:3]})')


def is_ok(result: str) -> bool:
    """Whether a verdict lets the run's figures count (`yes` or `yes (...)`)."""
    return result == YES or result.startswith(YES + ' (')


def throughput(result: str, elements: int, wall_s: float) -> int | str:
    """Elements / wall time, rounded, for a run whose verdict `is_ok`; else ''."""
    return round(elements / wall_s) if is_ok(result) and wall_s > 0 else ''
