"""NEXMark on this runner, Spark and Flink, batch and streaming, in one report
(`python -m benchmarks.compare`; see `main`)."""
