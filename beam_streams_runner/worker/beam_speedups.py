"""Three per-element costs of Beam's SDK that a worker does not need to pay.

Design section 7 ("keep per-element work off the hot path") and section 9 (Beam's own
harness runs the DoFns; the runner only removes work that yields nothing). A profile of
a source read (`PeriodicImpulse` into fused stateless steps) spent about a tenth of the
worker's time on the two:

* `GlobalWindows.assign`, called by the harness for every `TimestampedValue` a DoFn
  outputs in the global window, builds `GlobalWindow()` each time, and
  `GlobalWindow.__init__` decodes the end of time from a proto constant on every call.
  The window is a singleton whose end never changes, so the patched `assign` hands out
  the one instance as it is.
* `ThreadsafeWatermarkEstimator`, which wraps a splittable DoFn's watermark estimator,
  reaches every method it does not define itself (`ManualWatermarkEstimator.set_watermark`,
  called per element by a source that sets its watermark) through `__getattr__`, which
  builds a new locking closure per call. The patched `__getattr__` builds it once per
  estimator and name; each call still takes the lock and looks the method up on the
  wrapped estimator, as before.
* `IntervalWindow` (Beam 2.77's Cython `_IntervalWindowBase`) clamps its bounds to
  `MIN_TIMESTAMP.micros` and `MAX_TIMESTAMP.micros` on every hash and comparison, and
  `Timestamp.micros` became a pure-Python property (nanosecond precision): 1.5 us a
  hash, 2.9 us an equality, where a dict of windows (every trigger driver, every
  windowed GroupByKey) hashes and compares windows per element and window. The patched
  module reads two `Timestamp`s equal to those (same value, hash and precision) whose
  `micros` is a plain attribute: 0.18 us a hash, 0.32 us an equality.

None changes what Beam computes: `install` swaps in equivalent methods and constants,
once per process (a worker imports it with the harness, see `runtime`).
"""

from __future__ import annotations

from apache_beam.runners import sdf_utils
from apache_beam.transforms import window
from apache_beam.utils import timestamp, windowed_value

_ORIGINALS = {
    'assign': window.GlobalWindows.assign,
    'getattr': sdf_utils.ThreadsafeWatermarkEstimator.__getattr__,
    'MIN_TIMESTAMP': windowed_value.MIN_TIMESTAMP,
    'MAX_TIMESTAMP': windowed_value.MAX_TIMESTAMP,
}


class _FixedTimestamp(timestamp.Timestamp):
    """A `Timestamp` whose `micros` is read, not computed (it never changes)."""

    micros = 0  # a plain class attribute hides the base class's property

    def __init__(self, of: timestamp.Timestamp) -> None:
        super().__init__(micros=of.micros)
        self.micros = of.micros


_FIXED = {name: _FixedTimestamp(_ORIGINALS[name]) for name in ('MIN_TIMESTAMP',
                                                               'MAX_TIMESTAMP')}


def _assign_the_global_window(self, assign_context) -> list:
    return [window.GlobalWindow._instance or window.GlobalWindow()]


def _method_wrapper_once(self, attr: str):
    # Only names the instance lacks reach __getattr__; storing the wrapper in the
    # instance's dict makes the next lookup of that name an ordinary attribute read.
    wrapper = _ORIGINALS['getattr'](self, attr)
    if not attr.startswith('_'):
        self.__dict__[attr] = wrapper
    return wrapper


def install() -> None:
    """Swaps the methods and constants in (idempotent)."""
    window.GlobalWindows.assign = _assign_the_global_window
    sdf_utils.ThreadsafeWatermarkEstimator.__getattr__ = _method_wrapper_once
    for name, fixed in _FIXED.items():
        setattr(windowed_value, name, fixed)


def uninstall() -> None:
    """Beam's own methods back (for tests that compare both)."""
    window.GlobalWindows.assign = _ORIGINALS['assign']
    sdf_utils.ThreadsafeWatermarkEstimator.__getattr__ = _ORIGINALS['getattr']
    for name in _FIXED:
        setattr(windowed_value, name, _ORIGINALS[name])
