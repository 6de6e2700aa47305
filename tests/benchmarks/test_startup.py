"""The start-up benchmark's verdicts and summary (`benchmarks/startup.py`), without Spark."""

from __future__ import annotations

from benchmarks import startup


def test_an_empty_or_wrong_output_fails_and_a_right_one_passes(tmp_path):
    assert startup.output_verdict(str(tmp_path)).startswith('failed')
    (tmp_path / 'part-00000').write_text('B\n')
    assert startup.output_verdict(str(tmp_path)).startswith('failed')
    (tmp_path / 'part-00001').write_text('A\n')
    assert startup.output_verdict(str(tmp_path)) == 'yes'


def test_only_systems_whose_every_round_was_right_get_a_time_and_a_ratio():
    ok = {'output_ok': 'yes', 'phases': {'imports_s': 1.0, 'pipeline_s': 2.0}}
    rows = {row['system']: row for row in startup.summarize({
        startup.PYSPARK: [dict(ok, wall_s=4.0), dict(ok, wall_s=6.0)],
        startup.SPARK: [dict(ok, wall_s=9.0), dict(ok, wall_s=11.0)],
        startup.DIRECT: [dict(ok, wall_s=2.0), {'wall_s': 1.0, 'phases': {},
                                                 'output_ok': 'failed: exit 1'}],
    })}
    assert rows[startup.PYSPARK]['wall_s'] == 5.0 and rows[startup.PYSPARK]['x_pyspark'] == 1.0
    assert rows[startup.SPARK]['x_pyspark'] == 2.0 and rows[startup.SPARK]['imports_s'] == 1.0
    assert 'wall_s' not in rows[startup.DIRECT] and 'x_pyspark' not in rows[startup.DIRECT]
    assert rows[startup.DIRECT]['output_ok'] == 'failed: exit 1'
