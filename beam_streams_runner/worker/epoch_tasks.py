"""What runs inside a Spark task of a streaming epoch (design sections 4, 5 and 8).

An epoch is one Spark job over the whole stage DAG; each task of a stage
partition runs `run_stage_epoch`, which takes the partition through its steps
(`partition_epoch.PartitionEpoch`: load, feed, read on, advance, report,
commit) inside the warnings relay and the failure naming of its stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from beam_streams_runner.errors import stage_failures_named
from beam_streams_runner.records import Record
from beam_streams_runner.worker.element_counts import CountedOutput
from beam_streams_runner.worker.epoch_info import SideInputsView
from beam_streams_runner.worker.partition_epoch import PartitionEpoch
from beam_streams_runner.worker.warnings_relay import recorded_warnings


def run_stage_epoch(plan_bc, epoch_bc, stage_name: str, metrics_acc, warnings_acc, reports_acc,
                    grouping_input: str | None, index: int,
                    records: Iterable[tuple[str, object]],
                    side_view: SideInputsView | None = None,
                    counted: tuple[CountedOutput, ...] = ()) -> Iterator[Record]:
    """Runs partition `index` of an SDK stage for one epoch; counts the elements of
    the `counted` outputs for the epoch's progress record."""
    partition = PartitionEpoch(plan_bc.value, epoch_bc.value, stage_name, index,
                               grouping_input, side_view, counted)
    partition.load()
    with recorded_warnings(warnings_acc), stage_failures_named(partition.display_name):
        try:
            yield from partition.feed(records)
            yield from partition.read_on()
            yield from partition.advance()
        finally:
            totals = partition.operator.metrics.take()
            if totals is not None:
                metrics_acc.add(totals)
    yield from partition.report()
    partition.commit(reports_acc)
