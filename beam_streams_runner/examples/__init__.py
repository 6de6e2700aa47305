"""Example Beam pipelines that run on StreamsSparkRunner (and on any other Beam runner)."""
