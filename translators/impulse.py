"""Impulse: the single empty-bytes element every bounded source starts from.

Reads (`Read`, `ReadFromText`, ...) and `Create` expand to Impulse followed by
SDK-side transforms (a splittable DoFn for reads, see `reshuffle`); Impulse
itself is one record in a one-partition RDD, or, for a long `Create` read in slices
(`create_slices`), one per partition.
"""

from __future__ import annotations

from apache_beam.runners.portability.fn_api_runner.execution import ENCODED_IMPULSE_VALUE
from pyspark import SparkContext
from pyspark.rdd import RDD

from beam_streams_runner.translators.create_slices import impulse_records


def impulse_rdd(sc: SparkContext, input_id: str, slices: int = 0) -> RDD:
    """The records `(input id, encoded impulse)` of an Impulse read by `input_id`: one,
    or one per slice in as many partitions when a Create reads it in `slices`."""
    if slices:
        return sc.parallelize(impulse_records(input_id, slices), slices)
    return sc.parallelize([(input_id, ENCODED_IMPULSE_VALUE)], 1)
