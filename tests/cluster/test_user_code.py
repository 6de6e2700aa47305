"""The user's code on a cluster: a pipeline program whose DoFns are functions of the
main script calling a module of the user's own, next to it. The script's functions
travel with the pipeline (Beam pickles them by value); the module reaches the
executors the PySpark way (`spark.submit.pyFiles`), and without it the run fails
naming the module."""

from __future__ import annotations

import sys

from tests.cluster.fixtures import read_lines, run_program

MODULE = '''
def shout(word):
    return word.upper() + '!'
'''

PROGRAM = '''
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

import mylib


def exclaim(word):
    return mylib.shout(word)


if __name__ == '__main__':
    with beam.Pipeline(options=PipelineOptions(sys.argv[2:])) as p:
        (p | beam.Create(['a', 'b', 'c']) | beam.Map(exclaim)
           | beam.io.WriteToText(sys.argv[1]))
'''


def _run(cluster, directory, *extra: str):
    (directory / 'mylib.py').write_text(MODULE)
    (directory / 'my_pipeline.py').write_text(PROGRAM)
    return run_program([sys.executable, str(directory / 'my_pipeline.py'),
                        str(directory / 'out'), '--runner=beam_streams_runner.StreamsSparkRunner',
                        f'--spark_master={cluster.url}', *extra], cwd=str(directory))


def test_the_users_module_through_py_files(local_cluster, tmp_path):
    done = _run(local_cluster, tmp_path,
                f'--spark_conf=spark.submit.pyFiles={tmp_path / "mylib.py"}')
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_lines(str(tmp_path / 'out')) == ['A!', 'B!', 'C!']


def test_a_module_the_executors_lack_is_named(local_cluster, tmp_path):
    done = _run(local_cluster, tmp_path)
    assert done.returncode != 0
    # The runner's error, the last line of the program's traceback. Not always the
    # last line of stderr: the driver's JVM writes there from its own process, and a
    # task of the failed job that Spark kills afterwards is logged (WARN TaskSetManager:
    # Lost task ... TaskKilled) when it stops, which may be after the traceback.
    errors = [line for line in done.stderr.splitlines()
              if line.startswith('beam_streams_runner.errors.PipelineExecutionError: ')]
    assert errors, done.stderr[-3000:]
    assert "failed: ModuleNotFoundError: No module named 'mylib'" in errors[-1]
