"""Flatten: the union of the PCollections written into one buffer.

Beam's `sink_flattens` phase turns a multi-input Flatten into several writers of
one buffer (single-input Flattens are fused into the SDK stages); reading the
buffer is the union of what every producing stage wrote to it, selected by
buffer id. No data moves: Spark's union is a narrow dependency.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark import SparkContext
from pyspark.rdd import RDD


def flattened(sc: SparkContext, producer_rdds: Sequence[RDD], buffer_id: bytes) -> RDD:
    """The records of `buffer_id` written by any of `producer_rdds`."""
    selected = [rdd.filter(_has_tag(buffer_id)) for rdd in producer_rdds]
    if not selected:
        return sc.emptyRDD()
    return selected[0] if len(selected) == 1 else sc.union(selected)


def _has_tag(buffer_id: bytes):
    def has_tag(record) -> bool:
        return record[0] == buffer_id
    return has_tag
