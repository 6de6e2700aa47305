"""The map sides of the shuffles between stages, shared by the batch and streaming tasks.

Each routes a partition's chunks to the partitions of the consuming stage as
`(target partition, (buffer id, chunk))` pairs: by key (GroupByKey, stateful
ParDo input), round-robin (Reshuffle), or whole chunks dealt round-robin (the
fixed partitions of a streaming stage reading side inputs). The streaming ones
also forward the `Punctuation`s they read to every target, after the data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from beam_streams_runner.errors import StageExecutionError
from beam_streams_runner.records import Punctuation, Record
from beam_streams_runner.translators.group_by_key import KeyPartitioner
from beam_streams_runner.translators.kv_chunks import KvChunks
from beam_streams_runner.translators.reshuffle import RoundRobinPartitioner
from beam_streams_runner.worker.worker_plan import WorkerPlan


# Batch: chunks only. -----------------------------------------------------------------
def key_partition(plan_bc, coder_id: str, key_coder_id: str, tag: str,
                  chunks: Iterable[bytes]) -> Iterator[tuple[int, Record]]:
    plan: WorkerPlan = plan_bc.value
    partitioner = _key_partitioner(plan, coder_id, key_coder_id)
    return shuffle_failures_named(partitioner.partition(tag, chunks), plan, tag)


def _key_partitioner(plan: WorkerPlan, coder_id: str, key_coder_id: str) -> KeyPartitioner:
    runtime = plan.runtime()
    return KeyPartitioner(
        runtime.coder_impl(coder_id), runtime.coder_impl(key_coder_id),
        plan.num_partitions, plan.bundle_size,
        KvChunks.of(runtime.coder(coder_id), runtime.coder(key_coder_id)))


def shuffle_failures_named(routed: Iterator, plan: WorkerPlan, tag: str) -> Iterator:
    """`routed` (a keyed shuffle's map side), with a failure named after the step whose
    input `tag` is: the map side decodes every element, so a user coder's `decode`
    raises here, outside any step the harness would name."""
    try:
        yield from routed
    except StageExecutionError:
        raise  # the producing stage's, run in the same worker before the shuffle
    except Exception as exc:  # noqa: BLE001 - rewrapped with the consuming step's name
        stage = next(s for s in plan.stages.values() if tag in s.inputs)
        grouping = plan.groupings.get(stage.inputs[tag])
        where = f"Beam step '{grouping.step_name}'" if grouping else stage.display_name
        raise StageExecutionError.from_exception(exc, f'{where} (reading its input)') from None


def round_robin_partition(plan_bc, input_coder_id: str, output_coder_id: str, tag: str,
                          index: int, chunks: Iterable[bytes]) -> Iterator[tuple[int, Record]]:
    plan: WorkerPlan = plan_bc.value
    runtime = plan.runtime()
    input_impl = runtime.coder_impl(input_coder_id)
    output_impl = runtime.coder_impl(output_coder_id)
    partitioner = RoundRobinPartitioner(
        input_impl, output_impl, plan.num_partitions, plan.bundle_size, start=index)
    return partitioner.partition(tag, chunks)


# Streaming: data routed, punctuations sent to every target. ----------------------
def keyed_shuffle(plan_bc, coder_id: str, key_coder_id: str, tag: str,
                  records: Iterable[tuple[str, object]]) -> Iterator[tuple[int, tuple]]:
    plan: WorkerPlan = plan_bc.value
    partitioner = _key_partitioner(plan, coder_id, key_coder_id)
    return shuffle_failures_named(
        _routed(records, plan.num_partitions, tag, partitioner.partition), plan, tag)


def round_robin_shuffle(plan_bc, input_coder_id: str, output_coder_id: str, tag: str,
                        index: int, records: Iterable[tuple[str, object]]
                        ) -> Iterator[tuple[int, tuple]]:
    plan: WorkerPlan = plan_bc.value
    runtime = plan.runtime()
    partitioner = RoundRobinPartitioner(
        runtime.coder_impl(input_coder_id), runtime.coder_impl(output_coder_id),
        plan.num_partitions, plan.bundle_size, start=index)
    return _routed(records, plan.num_partitions, tag, partitioner.partition)


def _routed(records: Iterable[tuple[str, object]], num_partitions: int, tag: str,
            partition: Callable) -> Iterator[tuple[int, tuple]]:
    punctuations: list[Punctuation] = []

    def chunks() -> Iterator[bytes]:
        for _, payload in records:
            if isinstance(payload, Punctuation):
                punctuations.append(payload)
            else:
                yield payload

    yield from partition(tag, chunks())
    # A producer sends its punctuation after its data: forward it after the data too.
    for punctuation in punctuations:
        for target in range(num_partitions):
            yield target, (tag, punctuation)


def dealt_chunks(num_partitions: int, tag: str, index: int,
                 records: Iterable[tuple[str, object]]) -> Iterator[tuple[int, tuple]]:
    """Deals whole chunks round-robin: the fixed partitions of a stage whose
    partition state (pushed-back elements) must be found again next epoch."""
    def partition(tag: str, chunks: Iterable[bytes]) -> Iterator[tuple[int, tuple]]:
        for offset, chunk in enumerate(chunks):
            yield (index + offset) % num_partitions, (tag, chunk)
    return _routed(records, num_partitions, tag, partition)
