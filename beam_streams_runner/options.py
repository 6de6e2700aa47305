"""Pipeline options of the StreamsSparkRunner, and their validation.

`StreamsSparkOptions` adds the runner's flags to Beam's `PipelineOptions`
(`--spark_master`, `--spark_conf`, `--parallelism`, `--bundle_size`,
`--bundle_time_ms`, `--target_latency_ms`, `--no_keyed_state_gc`).
`validate_streams_spark_options` checks them all at once and raises one
`InvalidOptionsError` that lists every problem and its fix, so a user fixes a
command line in one go instead of one flag per run.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable

from apache_beam.options.pipeline_options import PipelineOptions

__all__ = [
    'InvalidOptionsError',
    'StreamsSparkOptions',
    'configured_parallelism',
    'parse_spark_conf',
    'spark_parallelism',
    'validate_streams_spark_options',
]

DEFAULT_SPARK_MASTER = 'local[*]'
DEFAULT_BUNDLE_SIZE = 1000
DEFAULT_BUNDLE_TIME_MS = 100
DEFAULT_TARGET_LATENCY_MS = 1000
_UNSET_PARALLELISM = -1  # FlinkRunnerOptions' default for the shared --parallelism flag

# local, local[N], local[*], local[N,F], local[*,F] (F = max task failures).
_LOCAL_MASTER = re.compile(r'local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?')
# spark://host:port[,host:port...] (several hosts: standby masters with ZooKeeper).
_HOST_PORT = r'[A-Za-z0-9._-]+:[0-9]{1,5}'
_STANDALONE_MASTER = re.compile(rf'spark://{_HOST_PORT}(,{_HOST_PORT})*')
_K8S_MASTER = re.compile(r'k8s://\S+')

_MASTER_FORMS = ('local, local[N], local[*], local[N,F], local[*,F], '
                 'spark://host:port[,host:port...], yarn, k8s://https://host:port')


class InvalidOptionsError(ValueError):
    """The runner's pipeline options are wrong; the message lists every problem."""


def _int_or_text(value: str) -> int | str:
    """The argparse type of the runner's integer flags. A value that is not an integer
    stays text, so that validation reports it with every other problem; argparse's own
    `type=int` would print the usage of every Beam option and exit the program."""
    try:
        return int(value)
    except ValueError:
        return value


class StreamsSparkOptions(PipelineOptions):
    """Options of the StreamsSparkRunner (where Spark runs, and how data is bundled)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            '--spark_master',
            default=DEFAULT_SPARK_MASTER,
            help=('Spark master URL the runner starts its SparkSession with, when no '
                  'SparkSession is already active in this process: local (1 thread), '
                  'local[N], local[*] (one thread per core), local[N,F] (F = task '
                  'retries), spark://host:port for a standalone cluster, yarn, or '
                  f'k8s://https://host:port. Default: {DEFAULT_SPARK_MASTER}.'))
        parser.add_argument(
            '--spark_conf',
            action='append',
            default=None,
            metavar='KEY=VALUE',
            help=('A Spark configuration property for the SparkSession the runner '
                  'starts, as key=value (for example spark.driver.memory=4g). Repeat '
                  'the flag for several properties. Ignored when a SparkSession is '
                  'already active.'))
        # Beam's FlinkRunnerOptions already defines --parallelism (int, default -1), and
        # Beam parses every options class with one parser: defining it twice there is an
        # argparse conflict. So it is added only where absent (this class's own parser,
        # hence --help); elsewhere Flink's definition parses it, and -1 means "not set".
        if '--parallelism' not in parser._option_string_actions:
            parser.add_argument(
                '--parallelism',
                type=_int_or_text,
                default=None,
                help=('Number of Spark partitions of each stage (and '
                      'spark.default.parallelism of a session the runner starts). '
                      "Default (or -1): Spark's defaultParallelism (the number of cores "
                      'for local[*]).'))
        parser.add_argument(
            '--bundle_size',
            type=_int_or_text,
            default=DEFAULT_BUNDLE_SIZE,
            help=('Maximum number of elements in one bundle read from a source. Bundles '
                  'are cut only at the sources; downstream steps keep them whole '
                  '(start_bundle/finish_bundle run once per source bundle). Default: '
                  f'{DEFAULT_BUNDLE_SIZE}.'))
        parser.add_argument(
            '--bundle_time_ms',
            type=_int_or_text,
            default=DEFAULT_BUNDLE_TIME_MS,
            help=('Maximum time in milliseconds a source spends filling one bundle '
                  '(streaming): a bundle closes after bundle_size elements or '
                  f'bundle_time_ms, whichever comes first. Default: {DEFAULT_BUNDLE_TIME_MS}.'))
        parser.add_argument(
            '--target_latency_ms',
            type=_int_or_text,
            default=DEFAULT_TARGET_LATENCY_MS,
            help=('Streaming: the latency goal in milliseconds. Each epoch (one Spark job '
                  'over the whole pipeline) reads its sources bundle after bundle for as '
                  'long as the goal allows once the measured cost of the epoch itself is '
                  'taken off, so small bundles do not mean small Spark jobs; a larger goal '
                  'means fewer, longer epochs and more throughput. Default: '
                  f'{DEFAULT_TARGET_LATENCY_MS}.'))
        parser.add_argument(
            '--no_keyed_state_gc',
            dest='keyed_state_gc',
            action='store_false',
            default=True,
            help=('Keep the keyed state of expired windows instead of garbage-collecting '
                  'it through the ordered expiry index. Memory then grows with every key '
                  'ever seen: only for comparison benchmarks.'))


def configured_parallelism(options: PipelineOptions) -> int | None:
    """The --parallelism given, or None when it was not (absent, or Flink's -1 default)."""
    value = options.view_as(StreamsSparkOptions).parallelism
    return None if value is None or value == _UNSET_PARALLELISM else value


def _conf_problems(entries: Iterable[str] | None) -> list[str]:
    problems = []
    for entry in entries or ():
        key, sep, _ = str(entry).partition('=')
        if not sep or not key.strip():
            problems.append(
                f'--spark_conf={entry!r} is not of the form key=value; write it as '
                '--spark_conf=spark.some.property=value (one flag per property).')
    return problems


def parse_spark_conf(entries: Iterable[str] | None) -> dict[str, str]:
    """Turn `--spark_conf` entries (`key=value`) into a dict; later entries win.

    The value is everything after the first `=`, so values may contain `=`.
    Raises InvalidOptionsError for an entry without `=` or with an empty key.
    """
    problems = _conf_problems(entries)
    if problems:
        raise InvalidOptionsError(_format(problems))
    conf: dict[str, str] = {}
    for entry in entries or ():
        key, _, value = str(entry).partition('=')
        conf[key.strip()] = value
    return conf


def is_valid_spark_master(master: str) -> bool:
    """Whether `master` is a Spark master URL form the runner accepts."""
    return bool(master == 'yarn'
                or _LOCAL_MASTER.fullmatch(master)
                or _STANDALONE_MASTER.fullmatch(master)
                or _K8S_MASTER.fullmatch(master))


def _format(problems: list[str]) -> str:
    lines = '\n'.join(f'  - {problem}' for problem in problems)
    return (f'Invalid StreamsSparkRunner options ({len(problems)} problem'
            f'{"s" if len(problems) > 1 else ""}):\n{lines}')


# The runner's flags as written on a command line (--no_keyed_state_gc sets keyed_state_gc).
_RUNNER_FLAGS = ('spark_master', 'spark_conf', 'parallelism', 'bundle_size', 'bundle_time_ms',
                 'target_latency_ms', 'no_keyed_state_gc')


def _known_flags() -> set[str]:
    """Every flag some PipelineOptions class defines, as Beam's own parsing sees them."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    # Beam dedupes the classes by name the same way (a class may be defined twice).
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return set(parser._option_string_actions)


def _misspelled_flags(options: PipelineOptions) -> list[str]:
    """Given flags no options class defines that look like one of the runner's.

    Beam logs and drops unknown flags, so `--spark-master=spark://...` would run on the
    default local[*]. Only explicit flag lists are checked: options parsed from
    sys.argv share it with the program's own flags, which may look alike.
    """
    flags = getattr(options, '_flags', None)
    if not flags:
        return []
    known: set[str] | None = None
    problems = []
    for arg in flags:
        if not isinstance(arg, str) or not arg.startswith('--'):
            continue
        name = arg[2:].split('=', 1)[0]
        normalized = name.replace('-', '_').lower()
        close = difflib.get_close_matches(normalized, _RUNNER_FLAGS, n=1, cutoff=0.85)
        if not close:
            continue
        known = _known_flags() if known is None else known
        if '--' + name not in known:
            problems.append(f'{arg!r} is not an option of the runner or of Beam (Beam would '
                            f'ignore it and use the default); did you mean --{close[0]}?')
    return problems


def validate_streams_spark_options(options: PipelineOptions) -> StreamsSparkOptions:
    """Check the runner's options and return them as a `StreamsSparkOptions` view.

    Every problem found is listed in one `InvalidOptionsError`, each naming the
    option, the bad value and what to write instead.
    """
    opts = options.view_as(StreamsSparkOptions)
    problems: list[str] = []
    master = opts.spark_master
    if not isinstance(master, str) or not is_valid_spark_master(master.strip()):
        problems.append(f'--spark_master={master!r} is not a Spark master URL; use one of '
                        f'{_MASTER_FORMS}.')
    for name in ('bundle_size', 'bundle_time_ms', 'target_latency_ms', 'parallelism'):
        value = getattr(opts, name)
        if name == 'parallelism' and configured_parallelism(opts) is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            hint = {'bundle_size': f'(default {DEFAULT_BUNDLE_SIZE})',
                    'bundle_time_ms': f'(default {DEFAULT_BUNDLE_TIME_MS})',
                    'target_latency_ms': f'(default {DEFAULT_TARGET_LATENCY_MS})',
                    'parallelism': "(or leave it out to use Spark's defaultParallelism)"}[name]
            problems.append(f'--{name}={value!r} must be a positive integer {hint}.')
    conf = opts.spark_conf
    if isinstance(conf, str):  # set programmatically as one string
        conf = [conf]
    problems.extend(_conf_problems(conf))
    problems.extend(_misspelled_flags(options))
    if problems:
        raise InvalidOptionsError(_format(problems))
    return opts


def spark_parallelism(options: PipelineOptions) -> int:
    """Number of partitions per stage: --parallelism, else Spark's defaultParallelism.

    Uses the active SparkContext when there is one; otherwise derives it from
    --spark_master (local[N] -> N, local -> 1, anything else -> CPU count).
    """
    opts = options.view_as(StreamsSparkOptions)
    parallelism = configured_parallelism(opts)
    if parallelism is not None:
        return int(parallelism)
    from pyspark import SparkContext  # imported late: options must load without a JVM

    sc = SparkContext._active_spark_context
    if sc is not None:
        return int(sc.defaultParallelism)
    match = _LOCAL_MASTER.fullmatch((opts.spark_master or '').strip())
    if match:
        threads = match.group(2)
        if threads is None:
            return 1
        if threads != '*':
            return int(threads)
    return os.cpu_count() or 1
