"""The one list of Beam conformance tests StreamsSparkRunner does not run, with reasons.

Keyed by test class name (as Beam names it) and test name. The list only shrinks.
"""

from __future__ import annotations

SKIPPED: dict[tuple[str, str], str] = {
    ('TestStreamTranscriptTest', 'test_timestamp_combiner_custom_timestamping_earliest_1'):
        'Beam 2.77 cannot translate TimestampCombiner.OUTPUT_AT_EARLIEST_TRANSFORMED to '
        'the runner API ("unknown enum label"), so the pipeline never reaches any portable '
        'runner; Beam marks it broken on its DirectRunner too',
    ('WeakTestStreamTranscriptTest', 'test_timestamp_combiner_custom_timestamping_earliest_1'):
        'as for TestStreamTranscriptTest: OUTPUT_AT_EARLIEST_TRANSFORMED has no runner-API form',
}


def skip_listed(cls: type, beam_class_name: str) -> None:
    """Marks the listed tests of `cls` skipped, with their reasons."""
    import unittest
    for (class_name, test_name), reason in SKIPPED.items():
        if class_name == beam_class_name:
            setattr(cls, test_name, unittest.skip(reason)(getattr(cls, test_name)))
