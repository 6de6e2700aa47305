"""The micro benchmark runs and writes its report (timings are never asserted)."""

from __future__ import annotations

import os

from benchmarks import micro


def test_micro_benchmark_writes_table_and_plot(tmp_path, spark_session, spark_args):
    rows = micro.main(['--elements=300', '--runners=StreamsSparkRunner',
                       '--bundle_sizes=50', f'--cases=1 ParDo,{list(micro.CASES)[2]}',
                       f'--out={tmp_path}', *spark_args])
    assert [(r['case'], r['bundle_size']) for r in rows] == [
        ('1 ParDo', 50), (list(micro.CASES)[2], 50)]
    assert all(r['latency_p50_s'] != '' for r in rows)
    for name in ('micro.md', 'micro.csv', 'micro.png'):
        assert os.path.getsize(tmp_path / name) > 0
