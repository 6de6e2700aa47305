"""Impulse: the single empty-bytes element every bounded source starts from.

Reads (`Read`, `ReadFromText`, ...) and `Create` expand to Impulse followed by
SDK-side transforms (a splittable DoFn for reads, see `reshuffle`); Impulse
itself is one record in a one-partition RDD.
"""

from __future__ import annotations

from apache_beam.runners.portability.fn_api_runner.execution import ENCODED_IMPULSE_VALUE
from pyspark import SparkContext
from pyspark.rdd import RDD


def impulse_rdd(sc: SparkContext, input_id: str) -> RDD:
    """The records `(input id, encoded impulse)` of an Impulse read by `input_id`."""
    return sc.parallelize([(input_id, ENCODED_IMPULSE_VALUE)], 1)
