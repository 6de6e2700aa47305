"""What runs inside Spark's Python workers.

`daemon` is the worker daemon they are forked from; `runtime` is the SDK harness of
one pipeline run in a worker; `worker_plan` what every task of a run gets broadcast;
`batch_tasks` and `epoch_tasks` run one partition of a stage (a batch task, a
streaming epoch); `shuffles` are the map sides of the shuffles between stages;
`partition_cache` keeps the stateful operators of streaming partitions across epochs;
`element_counts` counts elements for the streaming progress; `warnings_relay` sends
the tasks' warnings back to the driver. The driver side is `beam_streams_runner.driver`.
"""
