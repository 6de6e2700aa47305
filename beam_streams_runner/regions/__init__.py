"""Consistent regions: the controller, commit records and reset (design section 12).

What user code may call: `request_checkpoint()` asks for a cut after the current
epoch; `current_fence()` is the epoch a publishing sink's input waited from.
"""

from beam_streams_runner.regions.publishing import current_fence
from beam_streams_runner.regions.requests import request_checkpoint

__all__ = ['current_fence', 'request_checkpoint']
