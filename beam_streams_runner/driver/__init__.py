"""The driver side: from a Beam pipeline to Spark jobs.

`plan` fuses the pipeline into stages; `construction_checks` rejects what cannot
run before Beam expands it; `java`, `worker_python` and `spark_session` get a
SparkSession whose Python workers can run the stages; `batch` (an RDD lineage)
and `streaming` (epochs of Spark jobs) turn the stages into Spark jobs, with
what both share in `lineage`; `progress` makes the streaming progress records.
What the jobs run inside Spark's Python workers is in `beam_streams_runner.worker`.
"""
