"""The batch half of the comparison: the NEXMark launcher's runs, each with its peak memory.

The same plan as `python -m benchmarks.nexmark --native spark --native flink` (this
runner, Beam's DirectRunner with one worker and with two processes, hand-written
PySpark and PyFlink over the same generated events, every row judged against the
DirectRunner's output), run here so that each run's processes are sampled
(`memory.PeakMemory`). The DirectRunner's runs are not taken from the reference cache
of earlier invocations: the cache is this invocation's own, so every row's time is
measured in this invocation (and the streaming half reuses those references).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks.compare.memory import PeakMemory
from benchmarks.nexmark import launcher
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.report import Row
from benchmarks.nexmark.verdicts import RunResult


@dataclass
class BatchRow:
    """A launcher row with the peak memory of its run."""

    row: Row
    peak_mb: float | None


def _label(spec: launcher.RunSpec, result: RunResult) -> str:
    return launcher.DIRECT_2P if spec.role == launcher.DIRECT_2P else result.runner


def run_batch(queries: Sequence[int], config: NexmarkConfig, out_dir: str,
              timeout_s: float, native: Sequence[str] = ('spark', 'flink'),
              progress: Callable[[str], None] = print) -> list[BatchRow]:
    """The batch rows of `queries` over the events of `config` (see the module docstring).
    `out_dir` gets the launcher's `outputs/` and `logs/`."""
    for sub in ('outputs', 'logs'):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    argv = [f'--query={",".join(map(str, queries))}', '--spark_master=local[2]',
            *(f'--native={name}' for name in native)]
    args, rest = launcher.build_parser().parse_known_args(argv)
    config_args = [f'--num_events={config.num_events}']
    plan = launcher.plan_runs(args, queries, rest)
    runs: dict[launcher.RunSpec, tuple[RunResult, bool]] = {}
    peaks: dict[tuple[int, str], float] = {}
    for i, spec in enumerate(plan, 1):
        with PeakMemory() as peak:
            result, cached = launcher.execute(spec, config, config_args, out_dir, timeout_s)
        runs[spec] = (result, cached)
        if not cached:
            peaks[(spec.query, _label(spec, result))] = peak.mb
        status = (f'{result.events / result.wall_s:,.0f} events/s' if result.ok
                  and result.wall_s > 0 else f'FAILED {result.error}')
        progress(f'[batch {i}/{len(plan)}] Q{spec.query} {_label(spec, result)}: '
                 f'{"cached" if cached else f"{result.wall_s:.1f} s"}, {status}, '
                 f'peak {peak.mb:,.0f} MB')
    rows = [row for q in queries for row in launcher.rows_of_query(q, runs, config, False)]
    return [BatchRow(row, peaks.get((row.query, row.runner))) for row in rows]


def reference_of(out_dir: str, timeout_s: float) -> Callable[[int, NexmarkConfig], RunResult]:
    """`reference(query, config)`: the batch DirectRunner output of `query` over `config`
    (from this invocation's cache when the batch half ran it, else run now)."""
    from benchmarks.compare.stream_runs import config_args
    from benchmarks.nexmark.runs import cached_run

    def reference(query: int, run_config: NexmarkConfig) -> RunResult:
        args = config_args(run_config)
        if run_config.base_time_ms != NexmarkConfig().base_time_ms:
            args.append(f'--base_time_ms={run_config.base_time_ms}')
        runner = launcher.reference_for(query, launcher.DEFAULT_REFERENCE)
        result, _ = cached_run(query, runner, run_config, args, (), out_dir, timeout_s,
                               f'q{query}-reference-{run_config.base_time_ms}')
        return result

    return reference
