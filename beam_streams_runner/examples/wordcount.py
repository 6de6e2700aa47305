"""Word count: the classic Beam example, runnable on StreamsSparkRunner.

Reads text files, splits lines into words, counts each word and writes
`word: count` lines::

    python -m beam_streams_runner.examples.wordcount --runner=StreamsSparkRunner \
        --input README.md --output /tmp/counts

Importing `beam_streams_runner` registers the short runner name
`StreamsSparkRunner`; `--runner=beam_streams_runner.StreamsSparkRunner` works
too, and so does any other Beam runner (e.g. `--runner=DirectRunner`). Spark
options such as `--spark_master=local[2]` and `--bundle_size` pass through.
"""

from __future__ import annotations

import logging
import re

import apache_beam as beam
from apache_beam.io import ReadFromText, WriteToText
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions

import beam_streams_runner  # noqa: F401 - registers the short runner name

WORD_PATTERN = re.compile(r"[\w\']+", re.UNICODE)


class WordCountOptions(PipelineOptions):
    """The options of this example."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            '--input',
            default='README.md',
            help='Input file pattern to count the words of.')
        # Not required=True: Beam parses the flags of every PipelineOptions subclass
        # for any options object, so a required flag would break other pipelines in
        # the same process. main() checks it instead.
        parser.add_argument(
            '--output',
            default=None,
            help='Output path prefix of the result files (required).')


def extract_words(line: str) -> list[str]:
    """The words of one line of text."""
    return WORD_PATTERN.findall(line)


def format_result(word: str, count: int) -> str:
    return f'{word}: {count}'


class CountWords(beam.PTransform):
    """Lines of text -> (word, count) pairs."""

    def expand(self, lines):
        return (lines
                | 'Split' >> beam.FlatMap(extract_words).with_output_types(str)
                | 'Count' >> beam.combiners.Count.PerElement())


def build_pipeline(p: beam.Pipeline, input_pattern: str, output: str) -> None:
    (p
     | 'Read' >> ReadFromText(input_pattern)
     | 'CountWords' >> CountWords()
     | 'Format' >> beam.MapTuple(format_result)
     | 'Write' >> WriteToText(output))


def main(argv: list[str] | None = None, save_main_session: bool = True):
    """Runs the word count; returns the finished pipeline's result."""
    options = PipelineOptions(argv)
    options.view_as(SetupOptions).save_main_session = save_main_session
    wordcount_options = options.view_as(WordCountOptions)
    if not wordcount_options.output:
        raise ValueError('--output is required: the path prefix of the result files, '
                         'e.g. --output /tmp/counts')
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, wordcount_options.input, wordcount_options.output)
    result = pipeline.run()
    result.wait_until_finish()
    return result


if __name__ == '__main__':
    logging.getLogger().setLevel(logging.INFO)
    main()
