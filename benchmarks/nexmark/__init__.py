"""NEXMark for the runner: a deterministic event generator that reproduces Beam's Java one.

* `config`: `NexmarkConfig` (the defaults of Java's `NexmarkConfiguration`) and
  `GeneratorConfig` (Java's `GeneratorConfig`: inter-event delays, event timestamps,
  out-of-order groups, the split into `num_event_generators` parallel timelines).
* `java_random`: `JavaRandom`, a bit-exact `java.util.Random`.
* `generator`: `event_at(config, n)` and `events(config, start, stop)`, the events of
  Java's `Generator` as Beam's Python NEXMark model objects (`Person`, `Auction`, `Bid`
  of `apache_beam.testing.benchmarks.nexmark.models.nexmark_model`), which Beam's Python
  queries consume unchanged.
"""
