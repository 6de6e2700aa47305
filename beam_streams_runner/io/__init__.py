"""The runner's external sinks and sources (Redis).

* `WriteToRedis`: a sink of `(key, value)` pairs (SET, or HSET of a dict). It is
  exactly-once when consistent regions are on: it publishes after the cut
  (`publishes_after_checkpoint`) with fenced, idempotent writes. Otherwise, and on
  other runners, it is at-least-once (plain, idempotent writes).
* `ReadFromRedisStream`: a Redis Stream read as a splittable DoFn, unbounded or up to
  `stop_after_id`. It replays exactly from the positions saved with a consistent
  cut; it is exactly-once end to end when paired with an exactly-once sink.
"""

from beam_streams_runner.io.redis_sink import WriteToRedis
from beam_streams_runner.io.redis_stream_source import ReadFromRedisStream

__all__ = ['ReadFromRedisStream', 'WriteToRedis']
