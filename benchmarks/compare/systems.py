"""The streaming systems of the comparison: which program runs each, with which python,
on which queries, and how each turns fault tolerance on.

Every system is a program with the common interface of `benchmarks.nexmark.stream_files`
(events from a directory of JSON-lines files, records and a summary back):

* `StreamsSparkRunner`: Beam's own NEXMark queries on this runner in streaming
  (`benchmarks.nexmark.beam_streaming`); fault tolerance = consistent regions.
* Spark Structured Streaming, two ways a Spark user writes a query: the DataFrame API,
  JVM-native and UDF-free (`sql`), and the Python state API `transformWithStateInPandas`
  for the stateful queries (`state`) (`benchmarks.nexmark.spark_streaming`); fault
  tolerance = a `checkpointLocation` (Spark commits offsets and state every micro-batch).
* PyFlink, two ways: the Python DataStream API (`datastream`) and Flink SQL / the Table
  API, JVM-native (`sql`) (`benchmarks.nexmark.flink_streaming`, run by the python of
  the PyFlink virtualenv); fault tolerance = exactly-once checkpoints.

Each gets two cores (`local[2]`, parallelism 2) and the same checkpoint period.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.nexmark.native import FLINK_SETUP, flink_python


@dataclass(frozen=True)
class StreamingSystem:
    """One row family of the streaming table."""

    name: str
    module: str
    queries: tuple[int, ...]
    args: tuple[str, ...] = ()
    flink: bool = False

    @property
    def python(self) -> str:
        return flink_python() if self.flink else sys.executable

    def available(self) -> str:
        """'' when the system can run here, else why not and what to do."""
        if self.flink and not os.path.exists(self.python):
            return f'no PyFlink virtualenv at {os.path.dirname(os.path.dirname(self.python))}: ' \
                   f'create it with `{FLINK_SETUP}`'
        return ''

    def command(self, query: int, run_args: Sequence[str]) -> list[str]:
        return [self.python, '-m', self.module, f'--query={query}', *self.args, *run_args]


OURS = StreamingSystem('StreamsSparkRunner', 'benchmarks.nexmark.beam_streaming',
                       (0, 1, 2, 3, 5, 7, 8), ('--spark_master=local[2]',))
SPARK_SQL = StreamingSystem('Spark Structured Streaming (DataFrame)',
                            'benchmarks.nexmark.spark_streaming', (0, 1, 2, 5, 7, 8),
                            ('--variant=sql', '--spark_master=local[2]'))
SPARK_STATE = StreamingSystem('Spark Structured Streaming (transformWithStateInPandas)',
                              'benchmarks.nexmark.spark_streaming', (3, 5, 7),
                              ('--variant=state', '--spark_master=local[2]'))
FLINK_DATASTREAM = StreamingSystem('PyFlink (Python DataStream)',
                                   'benchmarks.nexmark.flink_streaming', (0, 1, 2, 3, 5, 7, 8),
                                   ('--variant=datastream', '--parallelism=2'), flink=True)
FLINK_SQL = StreamingSystem('PyFlink (Flink SQL)', 'benchmarks.nexmark.flink_streaming',
                            (0, 1, 2, 5, 7, 8), ('--variant=sql', '--parallelism=2'),
                            flink=True)
SYSTEMS = (OURS, SPARK_SQL, SPARK_STATE, FLINK_DATASTREAM, FLINK_SQL)
# The Python-level engines this runner means to be at least as fast as: PyFlink's
# Python API, and Spark's Python state API on the stateful queries.
PYTHON_PEERS = (FLINK_DATASTREAM, SPARK_STATE)
# The JVM-native ones, whose lead the report states and explains.
JVM_NATIVE = (SPARK_SQL, FLINK_SQL)


def short_name(system: StreamingSystem) -> str:
    """The name in plots and narrow tables."""
    return {OURS.name: 'ours', SPARK_SQL.name: 'Spark SQL', SPARK_STATE.name: 'Spark tWSIP',
            FLINK_DATASTREAM.name: 'PyFlink DS', FLINK_SQL.name: 'Flink SQL'}[system.name]
