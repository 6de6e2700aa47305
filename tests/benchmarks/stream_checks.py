"""What the streaming comparison's program tests share: a program's options from a
NEXMark config and the check that its records equal the batch DirectRunner's output
(`benchmarks.compare.stream_runs.records_verdict`, as the comparison judges a row)."""

from __future__ import annotations

import functools
import threading

from benchmarks.compare.stream_runs import config_args, records_verdict
from benchmarks.nexmark import stream_files
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.runs import run_query
from benchmarks.nexmark.verdicts import RunResult

__all__ = ['assert_records_equal_batch', 'config_args', 'reference']


@functools.lru_cache(maxsize=None)
def reference(query: int, config: NexmarkConfig) -> RunResult:
    """The batch DirectRunner's output of `query` over `config` (run once per pair)."""
    result = run_query(query, 'DirectRunner', config)
    assert result.ok and result.lines, result.error or 'the reference is empty'
    return result


def assert_records_equal_batch(query: int, records: list[dict], config: NexmarkConfig
                               ) -> None:
    """Asserts the records are the batch output (Q3: less its unfired last panes)."""
    assert records, 'the streaming run wrote no output'
    verdict, note = records_verdict(query, 'tested', records, reference(query, config),
                                    config)
    assert verdict.startswith('yes'), f'{verdict}: {note}'


def start_feeder(config: NexmarkConfig, events_dir: str, ready: str, rate: float
                 ) -> tuple[threading.Thread, list[stream_files.EventFiles]]:
    """A thread that feeds `config`'s events into `events_dir` at `rate` once the
    program has written `ready` (`stream_files.feed`); the list gets what it fed."""
    fed: list[stream_files.EventFiles] = []

    def feeder() -> None:
        if stream_files.wait_for(ready, timeout_s=120):
            fed.append(stream_files.feed(config, events_dir, rate))
    thread = threading.Thread(target=feeder, daemon=True)
    thread.start()
    return thread, fed
