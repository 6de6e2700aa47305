"""Two per-element costs of Beam's SDK harness that a worker does not need to pay.

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

Neither changes what the harness computes: `install` swaps in equivalent methods, once per
process (a worker imports it with the harness, see `runtime`).
"""

from __future__ import annotations

from apache_beam.runners import sdf_utils
from apache_beam.transforms import window

_ORIGINALS = {
    'assign': window.GlobalWindows.assign,
    'getattr': sdf_utils.ThreadsafeWatermarkEstimator.__getattr__,
}


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
    """Swaps the two methods in (idempotent)."""
    window.GlobalWindows.assign = _assign_the_global_window
    sdf_utils.ThreadsafeWatermarkEstimator.__getattr__ = _method_wrapper_once


def uninstall() -> None:
    """Beam's own methods back (for tests that compare both)."""
    window.GlobalWindows.assign = _ORIGINALS['assign']
    sdf_utils.ThreadsafeWatermarkEstimator.__getattr__ = _ORIGINALS['getattr']
