"""Benchmarks of the StreamsSparkRunner (NEXMark, micro benchmarks); see DESIGN.md section 10."""
