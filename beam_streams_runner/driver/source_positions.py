"""Where the sources of a streaming run stand between epochs (design sections 5, 12).

The driver keeps, per source stage: the residual restrictions of its splittable
DoFns (each an encoded (element, restriction, watermark-estimator state) with the
time it is due), whether its Impulse fired, how many TestStream events it played;
and which stages finished (they can never output again and run no more). As a
consistent-region member, a cut records all of it for the region's stages and a
reset rewinds to it: the restrictions read again from where the cut left them.
A TestStream rewinds by playing its events again from the start, skipping those
the cut had played.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Set
from typing import Any

from beam_streams_runner.regions.hooks import MemberBase
from beam_streams_runner.translators.read import Residual
from beam_streams_runner.translators.test_stream import TestStreamStep


class SourcePositions(MemberBase):
    """The residuals, impulses, TestStream positions and finished stages of a run."""

    name = 'sources'

    def __init__(self, test_streams: Callable[[str], Iterator[TestStreamStep]],
                 test_stream_stages: Set[str]) -> None:
        self._test_stream_events = test_streams
        # stage -> [(residual, due at, in micros of the driver's clock)]
        self.residuals: dict[str, list[tuple[Residual, int]]] = {}
        self._in_flight: dict[str, list[tuple[Residual, int]]] = {}  # dealt to the epoch
        self.impulses_fired: set[str] = set()
        self.finished: set[str] = set()
        self._played: dict[str, int] = {}
        self._streams = {name: test_streams(name) for name in test_stream_stages}
        self.test_clock = 0  # a TestStream's processing time (micros)

    # TestStreams ---------------------------------------------------------------------
    @property
    def test_streaming(self) -> bool:
        return bool(self._streams)

    def next_test_steps(self) -> dict[str, TestStreamStep | None]:
        """The next event of every TestStream (None: it has played them all)."""
        steps = {}
        for name, events in self._streams.items():
            steps[name] = next(events, None)
            if steps[name] is not None:
                self._played[name] = self._played.get(name, 0) + 1
        return steps

    # Residuals -----------------------------------------------------------------------
    def take_due(self, clock: int) -> tuple[dict[str, list[Residual]], dict[str, int]]:
        """The residuals due at `clock` per stage, and per stage the watermark hold of
        those kept back."""
        due, holds = {}, {}
        self._in_flight = {}
        for stage_name, pending in self.residuals.items():
            self._in_flight[stage_name] = [(r, at) for r, at in pending if at <= clock]
            due[stage_name] = [r for r, _ in self._in_flight[stage_name]]
            kept = [(r, at) for r, at in pending if at > clock]
            self.residuals[stage_name] = kept
            if kept:
                holds[stage_name] = min(r.watermark for r, _ in kept)
        return due, holds

    def epoch_failed(self, reset_stages: Set[str]) -> None:
        """The epoch the due residuals were dealt to failed: the stages no region reset
        (autonomous ones) get theirs back, to read again; a reset stage read again from
        its cut instead."""
        for stage_name, dealt in self._in_flight.items():
            if stage_name not in reset_stages and dealt:
                self.residuals.setdefault(stage_name, []).extend(dealt)
        self._in_flight = {}

    def add(self, stage_name: str, residual: Residual, due_at: int) -> None:
        self.residuals.setdefault(stage_name, []).append((residual, due_at))

    def any_due(self, clock: int) -> bool:
        return any(at <= clock for pending in self.residuals.values() for _, at in pending)

    def next_due(self) -> int | None:
        return min((at for pending in self.residuals.values() for _, at in pending),
                   default=None)

    def pending(self, stage_name: str | None = None) -> bool:
        if stage_name is not None:
            return bool(self.residuals.get(stage_name))
        return any(self.residuals.values())

    # Hooks ---------------------------------------------------------------------------
    def checkpoint(self, sequence_id: int, stages: Set[str]) -> dict[str, Any]:
        return copy.deepcopy({
            'residuals': {s: p for s, p in self.residuals.items() if s in stages and p},
            'impulses_fired': self.impulses_fired & stages,
            'finished': self.finished & stages,
            'played': {s: n for s, n in self._played.items() if s in stages},
            'test_clock': self.test_clock})

    def reset(self, sequence_id: int, stages: Set[str], part: dict[str, Any] | None) -> None:
        self.reset_to_initial_state(stages)
        if not part:
            return
        part = copy.deepcopy(part)
        self.residuals.update(part['residuals'])
        self.impulses_fired |= part['impulses_fired']
        self.finished |= part['finished']
        for name, played in part['played'].items():
            events = self._streams[name]
            for _ in range(played):
                next(events, None)
            self._played[name] = played
        if self._played:
            self.test_clock = part['test_clock']

    def reset_to_initial_state(self, stages: Set[str]) -> None:
        for stage_name in stages:
            self.residuals.pop(stage_name, None)
            self._played.pop(stage_name, None)
            if stage_name in self._streams:
                self._streams[stage_name] = self._test_stream_events(stage_name)
        self.impulses_fired -= stages
        self.finished -= stages
        if any(s in stages for s in self._streams):
            self.test_clock = 0
