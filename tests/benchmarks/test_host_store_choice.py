"""The host store benchmark at tiny sizes: both stores, every case, every read checked.

Timings are never asserted: only that the run writes its report and chart, that LMDB
and RocksDB both appear in each case, and that every verdict is 'yes'.
"""

from __future__ import annotations

from benchmarks import host_store_choice

TINY = host_store_choice.Sizes(churn_keys=20, large_keys=8, large_bytes=4096, whole=2,
                               rewrite=2, opens=2)


def test_a_tiny_run_reports_both_stores_and_every_read_matches(tmp_path):
    rows = host_store_choice.main(['--tasks', '4', '--out', str(tmp_path)], TINY)
    report = (tmp_path / 'report.md').read_text()
    assert (tmp_path / 'host_store_choice.png').stat().st_size > 0
    table = [line.split('|')[1:-1] for line in report.splitlines()
             if line.startswith('| ') and not line.startswith('| case ')]
    assert len(table) == len(rows) > 0
    assert {cell.strip() for *_, cell in table} == {'yes'}
    cases = {(case.strip(), store.strip()) for case, store, *_ in table}
    assert cases == {(c, s) for c in ('churn', 'large', 'open') for s in ('lmdb', 'rocksdict')}
