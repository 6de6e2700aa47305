"""Parallel reads of a source with fewer restrictions than tasks (design section 4).

A streaming epoch deals a source stage's due residuals to its tasks, at most one
task per residual. A source whose single restriction does not split at the start
(`PeriodicImpulse`: one `OffsetRange` over all its firings) is then read by one
task per epoch while the other cores wait for the stages after it.

`SourceSplitter` cuts the furthest-ahead due residual into consecutive pieces
through its restriction's own tracker (`try_split`, as a runner's dynamic split
asks the SDK harness), one per idle task. Each piece but the last is what a task
reads in the epoch's read budget at the rate the stage's tasks read in the last
epoch (restriction size per task-second, by the sizes the SDK gave the residuals);
the last keeps the rest of the restriction and reads on for the budget. So the
pieces stay about one task-epoch of reading apart in event time: the stage's
watermark, their minimum, is never far behind what was read, and keyed state
downstream does not pile up as it would with the restriction cut in equal halves.

A split is a runner's dynamic split in Beam's model (both parts are restrictions
the DoFn reads as any other), and every piece is a residual like those the SDK
returns: consistent-region cuts record them, a failed epoch gives the unsplit
residual back. A residual is not split while the stage's rate is unknown (its
first epoch), when its backlog size is zero (a source waiting for data), or when
its tracker refuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from apache_beam.internal import pickler
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import common
from apache_beam.runners.worker import bundle_processor

from beam_streams_runner.driver.plan import StagePlan
from beam_streams_runner.translators.read import BOUNDED_READ_URN, Residual

_PROCESS_SIZED = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
# A piece smaller than this share of its restriction's size is not worth a task.
_MIN_PIECE_SHARE = 1e-6


class _Restrictions(NamedTuple):
    """How the driver reads and cuts the residuals of one splittable input."""

    coder: Any  # the stage input's CoderImpl: WindowedValue(((element, (restriction,
    # estimator state)), size))
    provider: Any  # the DoFn's RestrictionProvider


class SourceSplitter:
    """Deals the due residuals of source stages to their tasks, splitting one when
    fewer are due than tasks (see the module docstring)."""

    def __init__(self, coder_impl, num_tasks: int) -> None:
        self._coder_impl = coder_impl  # coder id -> CoderImpl (the pipeline's coders)
        self._num_tasks = num_tasks
        self._restrictions: dict[tuple[str, str], _Restrictions | None] = {}
        self._rates: dict[str, float] = {}  # stage -> restriction size read per task-second
        self._dealt: dict[str, float] = {}  # stage -> size of what this epoch dealt

    def deal(self, stage: StagePlan, residuals: Sequence[Residual], budget_s: float
             ) -> list[tuple[Residual, ...]]:
        """The residuals of one task each, furthest behind first: one residual per task
        as long as there are more residuals than tasks (the rest round-robin)."""
        ordered = sorted(residuals, key=lambda r: r.watermark)
        self._dealt[stage.name] = sum(self._size(stage, r) or 0.0 for r in ordered)
        idle = self._num_tasks - len(ordered)
        rate = self._rates.get(stage.name)
        if ordered and idle > 0 and rate:
            ordered[-1:] = self._split(stage, ordered[-1], idle + 1, rate * budget_s)
        slices = max(1, min(len(ordered), self._num_tasks))
        return [tuple(ordered[i::slices]) for i in range(slices)]

    def observe(self, stage: StagePlan, leftovers: Iterable[Residual], read_s: float
                ) -> None:
        """After an epoch: what the stage's tasks left of what they were dealt, and the
        seconds they read, give its rate for the next split."""
        dealt = self._dealt.pop(stage.name, 0.0)
        left = sum(self._size(stage, r) or 0.0 for r in leftovers)
        if dealt > left and read_s > 0:
            self._rates[stage.name] = (dealt - left) / read_s

    def _split(self, stage: StagePlan, residual: Residual, pieces: int, piece_size: float
               ) -> list[Residual]:
        """`residual` cut into at most `pieces` consecutive residuals, all but the last of
        `piece_size`; [residual] where it cannot be cut."""
        restrictions = self._restrictions_of(stage, residual.input_id)
        if restrictions is None or residual.resume_delay_s > 0:
            return [residual]
        windowed = restrictions.coder.decode(residual.element)
        (element, (restriction, estimator_state)), size = windowed.value
        cut: list[Residual] = []
        while len(cut) < pieces - 1 and size > piece_size > size * _MIN_PIECE_SHARE:
            split = restrictions.provider.create_tracker(restriction).try_split(
                piece_size / size)
            if not split:
                break
            primary, restriction = split
            cut.append(self._piece(residual, restrictions, windowed, element, primary,
                                   estimator_state))
            size = restrictions.provider.restriction_size(element, restriction)
        if not cut:
            return [residual]
        cut.append(self._piece(residual, restrictions, windowed, element, restriction,
                               estimator_state))
        return cut

    @staticmethod
    def _piece(residual: Residual, restrictions: _Restrictions, windowed, element,
               restriction, estimator_state) -> Residual:
        size = restrictions.provider.restriction_size(element, restriction)
        value = windowed.with_value(((element, (restriction, estimator_state)), size))
        return residual._replace(element=restrictions.coder.encode(value))

    def _size(self, stage: StagePlan, residual: Residual) -> float | None:
        """The size the SDK gave the residual's restriction (None: not a splittable input
        this splitter reads)."""
        restrictions = self._restrictions_of(stage, residual.input_id)
        if restrictions is None:
            return None
        return restrictions.coder.decode(residual.element).value[1]

    def _restrictions_of(self, stage: StagePlan, input_id: str) -> _Restrictions | None:
        key = (stage.name, input_id)
        if key not in self._restrictions:
            self._restrictions[key] = self._find_restrictions(stage, input_id)
        return self._restrictions[key]

    def _find_restrictions(self, stage: StagePlan, input_id: str) -> _Restrictions | None:
        """The coder and restriction provider of the Python splittable DoFn reading the
        stage input `input_id`; None for any other input."""
        if stage.descriptor is None or input_id not in stage.input_coders:
            return None
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
        transforms = descriptor.transforms
        source = transforms.get(input_id)
        if source is None or source.spec.urn != bundle_processor.DATA_INPUT_URN:
            return None
        pcollection = next(iter(source.outputs.values()))
        for transform in transforms.values():
            if (transform.spec.urn not in (_PROCESS_SIZED, BOUNDED_READ_URN)
                    or pcollection not in transform.inputs.values()):
                continue
            payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            if payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO:
                return None
            dofn = pickler.loads(payload.do_fn.payload)[0]
            provider = common.DoFnSignature(dofn).get_restriction_provider()
            if provider is None:
                return None
            return _Restrictions(self._coder_impl(stage.input_coders[input_id]), provider)
        return None
