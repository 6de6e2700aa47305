"""beam-streams-runner: run Apache Beam Python pipelines on Apache Spark through PySpark.

Importing this package registers the short runner name, so
`--runner=StreamsSparkRunner` works in any program that imported it;
`--runner=beam_streams_runner.StreamsSparkRunner` works always.
"""

from apache_beam.runners import runner as _beam_runner

from beam_streams_runner.options import StreamsSparkOptions
from beam_streams_runner.runner import StreamsSparkRunner

__all__ = ['StreamsSparkOptions', 'StreamsSparkRunner']
__version__ = '0.1.0'

_beam_runner._RUNNER_MAP['streamssparkrunner'] = 'beam_streams_runner.StreamsSparkRunner'
