"""Warnings raised in Spark tasks, raised again in the launching program.

User code and Beam's harness warn inside Python workers (for example Beam's
`InefficientExecutionWarning` when batched DoFns must rebatch); those warnings
would stay in executor logs. Tasks record them (`recorded_warnings`) and send
them through a Spark accumulator; the driver re-issues each distinct warning
once, with its original category, after the run.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator

from pyspark import AccumulatorParam

_MAX_WARNINGS = 100

WarningRecord = tuple[str, str, str]  # (category module, category name, message)


class WarningsAccumulator(AccumulatorParam):
    def zero(self, value: list) -> list:
        return []

    def addInPlace(self, value1: list, value2: list) -> list:
        for record in value2:
            if record not in value1 and len(value1) < _MAX_WARNINGS:
                value1.append(record)
        return value1


@contextlib.contextmanager
def recorded_warnings(accumulator) -> Iterator[None]:
    """Records the warnings raised inside the block into `accumulator`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('default')
        try:
            yield
        finally:
            records: list[WarningRecord] = []
            for item in caught:
                record = (item.category.__module__, item.category.__qualname__,
                          str(item.message))
                if record not in records:
                    records.append(record)
            if records:
                accumulator.add(records[:_MAX_WARNINGS])


def reissue(records: list[WarningRecord]) -> None:
    """Raises each recorded warning again, in the calling (driver) thread."""
    for module, name, message in records:
        try:
            category = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            category = UserWarning
        if not (isinstance(category, type) and issubclass(category, Warning)):
            category = UserWarning
        warnings.warn(message, category, stacklevel=2)
