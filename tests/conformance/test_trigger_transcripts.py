"""Beam's TestStream trigger transcripts on StreamsSparkRunner's streaming driver.

`TestStreamTranscriptTest` and `WeakTestStreamTranscriptTest`
(`apache_beam.transforms.trigger_test`, 36 tests) feed a TestStream through a
GroupByKey and a CombinePerKey under every windowing/trigger/accumulation
combination of Beam's transcripts, and check each pane (value, window,
timestamp, pane info) against the transcript at the point where it must have
fired, with a stateful DoFn. They build their pipelines with `TestPipeline()`,
so the runner comes from `--test-pipeline-options`, set here as a user would
pass it: `--runner=StreamsSparkRunner --streaming`.
"""

from __future__ import annotations

import pytest
from apache_beam.testing import test_pipeline
from apache_beam.transforms import trigger_test

import beam_streams_runner  # noqa: F401 - registers the short runner name
from tests.conformance.skips import skip_listed

# One partition per stage: the transcripts check trigger semantics over 40-150
# epochs each, and a second partition per stage costs ~40% more time per epoch
# (more Spark tasks) without testing anything about triggers. Watermarks merged
# across partitions and channels are covered at two partitions by
# tests/driver/test_streaming.py and tests/translators/test_side_input_gate.py.
# The transcripts that must fail do so in their checking DoFn, at the end of the
# stream, and again on every replay: with the default five resets in a row, counted
# again from each checkpoint reached in between (one every 10 s), such a test replayed
# its stream up to a dozen times. Here a failing transcript is reset and replayed once.
TEST_PIPELINE_OPTIONS = (
    '--runner=StreamsSparkRunner --streaming --spark_master=local[2] --parallelism=1 '
    '--checkpoint_period_s=600 --max_consecutive_reset_attempts=1')


@pytest.fixture(autouse=True)
def _streams_spark_test_pipeline(spark_session):
    pipeline_class = test_pipeline.TestPipeline
    saved = pipeline_class.pytest_test_pipeline_options
    pipeline_class.pytest_test_pipeline_options = TEST_PIPELINE_OPTIONS
    yield
    pipeline_class.pytest_test_pipeline_options = saved


class TestStreamTranscriptTest(trigger_test.TestStreamTranscriptTest):
    pass


class WeakTestStreamTranscriptTest(trigger_test.WeakTestStreamTranscriptTest):
    pass


skip_listed(TestStreamTranscriptTest, 'TestStreamTranscriptTest')
skip_listed(WeakTestStreamTranscriptTest, 'WeakTestStreamTranscriptTest')
