"""The launcher runs an unmodified pipeline script with the short runner name."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import sys
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    output = sys.argv[1]
    with beam.Pipeline(options=PipelineOptions(sys.argv[2:])) as p:
        (p
         | beam.Create(['a b', 'b c'])
         | beam.FlatMap(str.split)
         | beam.combiners.Count.PerElement()
         | beam.MapTuple(lambda word, count: f'{word}:{count}')
         | beam.io.WriteToText(output, shard_name_template=''))
''')


def test_launcher_runs_an_unmodified_script(tmp_path):
    script = tmp_path / 'pipeline.py'
    script.write_text(SCRIPT)
    output = tmp_path / 'counts.txt'
    completed = subprocess.run(
        [sys.executable, '-m', 'beam_streams_runner', str(script), str(output),
         '--runner=StreamsSparkRunner', '--spark_master=local[2]'],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert sorted(output.read_text().split()) == ['a:1', 'b:2', 'c:1']


def test_dotted_runner_name_works_without_the_launcher(tmp_path):
    script = tmp_path / 'pipeline.py'
    script.write_text(SCRIPT)
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path / 'out.txt'),
         '--runner=beam_streams_runner.StreamsSparkRunner', '--spark_master=local[2]'],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert sorted((tmp_path / 'out.txt').read_text().split()) == ['a:1', 'b:2', 'c:1']
