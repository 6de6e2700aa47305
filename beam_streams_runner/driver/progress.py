"""Streaming progress: one record per epoch, as Spark's `StreamingQueryProgress`.

After every epoch the streaming driver turns the partitions' reports into one
record (see `StreamsSparkPipelineResult.progress` for its keys), logs it as one
line at INFO, keeps the last `PROGRESS_KEPT`, and names the next epoch's Spark
job with it (a job's description is fixed when the job is submitted, so the
figures of epoch e travel on the job of epoch e+1).

Sources and sinks are found on the pipeline as the user wrote it
(`find_endpoints`): a source is an outermost transform that reads no
PCollection and whose output something else reads (Create, Read,
PeriodicImpulse, TestStream); a sink an outermost transform that reads a
PCollection and whose outputs nothing else reads (a write, a `Map(print)`).
Their elements are counted by the SDK harness's own per-PCollection element
counters, read after every harness bundle in the one stage that produces the
PCollection (`counted_outputs`, `worker.element_counts`), so counting costs a few
attribute reads per bundle and no decoding.
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.utils.proto_utils import parse_Bytes
from apache_beam.utils.timestamp import Timestamp

from beam_streams_runner.records import MAX_WATERMARK, MIN_WATERMARK
from beam_streams_runner.translators.stateless_chain import chain_step_outputs
from beam_streams_runner.worker.element_counts import CountedOutput

PROGRESS_KEPT = 100
_PAR_DO_URN = common_urns.primitives.PAR_DO.urn


class Endpoints(NamedTuple):
    """The sources and sinks of a pipeline, by transform name."""

    sources: dict[str, tuple[str, ...]]  # -> the PCollections it emits that others read
    sinks: dict[str, tuple[str, ...]]  # -> the PCollections it reads as main inputs


def find_endpoints(proto: beam_runner_api_pb2.Pipeline) -> Endpoints:
    """The outermost sources and sinks of `proto` (see the module docstring)."""
    transforms = proto.components.transforms
    parents = {sub: tid for tid, t in transforms.items() for sub in t.subtransforms}
    readers: dict[str, set[str]] = collections.defaultdict(set)
    main_readers: dict[str, set[str]] = collections.defaultdict(set)
    for tid, transform in transforms.items():
        if transform.subtransforms:
            continue  # a composite's inputs are its parts' inputs
        side = _side_input_tags(transform)
        for tag, pcollection in transform.inputs.items():
            readers[pcollection].add(tid)
            if tag not in side:
                main_readers[pcollection].add(tid)

    def within(tid: str, ancestor: str) -> bool:
        while tid is not None and tid != ancestor:
            tid = parents.get(tid)
        return tid == ancestor

    sources: dict[str, tuple[str, ...]] = {}
    sinks: dict[str, tuple[str, ...]] = {}
    pending = list(proto.root_transform_ids)
    while pending:
        tid = pending.pop(0)
        transform = transforms[tid]
        inputs = tuple(dict.fromkeys(
            pc for pc in transform.inputs.values()
            if any(within(reader, tid) for reader in main_readers[pc])))
        read_outside = tuple(dict.fromkeys(
            pc for pc in transform.outputs.values()
            if any(not within(reader, tid) for reader in readers[pc])))
        if not inputs and read_outside:
            sources[transform.unique_name] = read_outside
        elif inputs and not read_outside:
            sinks[transform.unique_name] = inputs
        else:
            pending.extend(transform.subtransforms)
    return Endpoints(sources, sinks)


def _side_input_tags(transform: beam_runner_api_pb2.PTransform) -> set[str]:
    if transform.spec.urn != _PAR_DO_URN:
        return set()
    return set(parse_Bytes(transform.spec.payload, beam_runner_api_pb2.ParDoPayload).side_inputs)


def counted_outputs(stages: Iterable, pcollections: Iterable[str]
                    ) -> dict[str, tuple[CountedOutput, ...]]:
    """Per stage name, the PCollections its tasks count. Each PCollection is counted
    in the first stage (in topological order) where a harness step emits it: the
    stage that produces it, or the first to read it back from a runner-only step
    (GroupByKey, Flatten, Reshuffle, TestStream); a stage reading it back after one
    that produced it does not count it again."""
    wanted = set(pcollections)
    counted: dict[str, list[CountedOutput]] = collections.defaultdict(list)
    for stage in stages:
        if stage.descriptor is None or not wanted:
            continue
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
        for tid, transform in descriptor.transforms.items():
            for tag, pcollection in chain_step_outputs(transform):
                if pcollection in wanted:
                    wanted.discard(pcollection)
                    counted[stage.name].append(CountedOutput(tid, tag, pcollection))
    return {name: tuple(outputs) for name, outputs in counted.items()}


class EpochProgress:
    """The driver's side: builds each epoch's record and keeps the last `keep`."""

    def __init__(self, stages: list, endpoints: Endpoints | None,
                 keep: int = PROGRESS_KEPT) -> None:
        self.endpoints = endpoints or Endpoints({}, {})
        self.counted = counted_outputs(stages, [
            pc for pcs in (*self.endpoints.sources.values(), *self.endpoints.sinks.values())
            for pc in pcs])
        self._display_names = {stage.name: stage.display_name for stage in stages}
        self._records: collections.deque[dict] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._last_start: float | None = None

    def records(self) -> list[dict]:
        """Copies of the kept records, oldest first."""
        with self._lock:
            return copy.deepcopy(list(self._records))

    def job_description(self, epoch: int) -> str:
        """The description of epoch `epoch`'s Spark job: it carries the last record."""
        with self._lock:
            last = self._records[-1] if self._records else None
        if last is None:
            return f'Beam streaming epoch {epoch}'
        return f'Beam streaming epoch {epoch} | after {summary(last)}'

    def add(self, epoch: int, started: float, duration_s: float, reports: Mapping,
            read_budget_ms: int) -> dict:
        """Records epoch `epoch` (started at `started`, seconds since the Unix epoch)
        from its partitions' `PartitionReport`s; returns the record."""
        interval = duration_s if self._last_start is None else started - self._last_start
        self._last_start = started
        elements: dict[str, int] = collections.Counter()
        for report in reports.values():
            elements.update(report.elements)

        def rates(count: int) -> dict:
            return {'elements': count,
                    'input_rate_per_s': _rate(count, interval),
                    'processed_rate_per_s': _rate(count, duration_s)}

        sizes: dict[str, int] = collections.Counter()
        loads: dict[str, int] = collections.Counter()
        load_ms: dict[str, float] = collections.Counter()
        for report in reports.values():
            for (_, name), count in report.sizes.items():
                sizes[name] += count
            loads.update(report.state_loads)
            load_ms.update(report.state_load_ms)
        record = {
            'epoch': epoch,
            'timestamp': Timestamp(micros=int(started * 1e6)).to_rfc3339(),
            'duration_ms': round(duration_s * 1000),
            'read_ms': round(1000 * max((r.read_s for r in reports.values()), default=0.0)),
            'read_budget_ms': read_budget_ms,
            'sources': {name: rates(sum(elements[pc] for pc in pcs))
                        for name, pcs in self.endpoints.sources.items()},
            'sinks': {name: {'elements': sum(elements[pc] for pc in pcs)}
                      for name, pcs in self.endpoints.sinks.items()},
            'watermark': self._slowest_stage(reports),
            'keyed_states': sizes['keyed_states'],
            'timers': sizes['timers'],
            'state_bytes_written': sum(r.state_bytes for r in reports.values()),
            'state_loads': dict(loads),
            'state_load_ms': {kind: round(ms, 1) for kind, ms in load_ms.items()},
            'hosts': sorted({r.host for r in reports.values() if r.host}),
        }
        with self._lock:
            self._records.append(record)
        return record

    def _slowest_stage(self, reports: Mapping) -> dict:
        """The stage with the lowest input watermark, and how far it lags behind now."""
        lowest: dict[str, int] = {}
        for (stage_name, _), report in reports.items():
            lowest[stage_name] = min(lowest.get(stage_name, MAX_WATERMARK),
                                     report.input_watermark)
        stage_name = min(lowest, key=lowest.get, default=None)
        watermark = lowest.get(stage_name, MAX_WATERMARK)
        if stage_name is None or watermark >= MAX_WATERMARK:
            return {'stage': None, 'input_watermark': None, 'lag_ms': None}
        if watermark <= MIN_WATERMARK:
            return {'stage': self._display_names[stage_name], 'input_watermark': None,
                    'lag_ms': None}
        return {'stage': self._display_names[stage_name],
                'input_watermark': Timestamp(micros=watermark).to_rfc3339(),
                'lag_ms': round((time.time() * 1e6 - watermark) / 1000)}


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def summary(record: Mapping) -> str:
    """One line of a progress record (the INFO log line and the Spark job description)."""
    parts = [f"epoch {record['epoch']}: {record['duration_ms']} ms "
             f"(read {record['read_ms']} ms)"]
    if record['sources']:
        parts.append('read ' + ', '.join(
            f"{name} {figures['elements']} ({figures['input_rate_per_s']:g}/s)"
            for name, figures in record['sources'].items()))
    if record['sinks']:
        parts.append('wrote ' + ', '.join(
            f"{name} {figures['elements']}" for name, figures in record['sinks'].items()))
    mark = record['watermark']
    if mark['input_watermark'] is not None:
        parts.append(f"watermark {mark['input_watermark']} (lag {mark['lag_ms'] / 1000:.1f} s)"
                     f" at {mark['stage'][:60]}")
    parts.append(f"{record['keyed_states']} keyed states, {record['timers']} timers, "
                 f"{record['state_bytes_written']} state bytes written")
    loads = record.get('state_loads') or {}
    from_store = loads.get('catch-up', 0) + loads.get('snapshot', 0)
    if from_store:
        # Tasks that ran away from their partition's live state (another worker or host).
        whole = loads.get('snapshot', 0)
        parts.append(f'{from_store} of {sum(loads.values())} state loads from the store'
                     + (f' ({whole} whole)' if whole else ''))
    if len(record.get('hosts') or ()) > 1:
        parts.append('on hosts ' + ', '.join(record['hosts']))
    return '; '.join(parts)
