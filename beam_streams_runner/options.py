"""Pipeline options of the StreamsSparkRunner, and their validation.

`StreamsSparkOptions` adds the runner's flags to Beam's `PipelineOptions`
(`--spark_master`, `--spark_conf`, `--parallelism`, `--bundle_size`,
`--bundle_time_ms`, `--target_latency_ms`, `--no_keyed_state_gc`, and the
consistent-region flags `--checkpoint_store`, `--checkpoint_period_s`,
`--checkpoint_mode`, `--drain_timeout_s`, `--reset_timeout_s`,
`--max_consecutive_reset_attempts`, `--consistent_region`, `--autonomous_steps`,
`--checkpoint_hmac_key_env`, `--restart_from_scratch`).
`validate_streams_spark_options` checks them all at once and raises one
`InvalidOptionsError` that lists every problem and its fix, so a user fixes a
command line in one go instead of one flag per run; `checkpoint_settings` hands
the runner the consistent-region flags parsed into one `CheckpointSettings`.

The consistent-region flags are defined and parsed in `checkpoint_options`, the
types of flag values (numbers that stay text when invalid, `SecretUrl` for a store
URL's password) in `option_types`; both are re-exported here.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from beam_streams_runner.checkpoint_options import (
    CheckpointSettings,
    add_checkpoint_args,
    default_checkpoint_root,
    default_checkpoint_store,
    new_job_name,
    parse_checkpoint_settings,
)
from beam_streams_runner.option_types import SecretUrl, int_or_text
from beam_streams_runner.stores.urls import redacted_url

__all__ = [
    'CheckpointSettings',
    'InvalidOptionsError',
    'SecretUrl',
    'StreamsSparkOptions',
    'checkpoint_settings',
    'configured_parallelism',
    'default_checkpoint_root',
    'default_checkpoint_store',
    'new_job_name',
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


class StreamsSparkOptions(PipelineOptions):
    """Options of the StreamsSparkRunner (where Spark runs, how data is bundled, and
    the consistent regions of a streaming pipeline)."""

    def __setattr__(self, name: str, value) -> None:
        # A store URL set from code is kept out of logs as one given on the command line.
        if name == 'checkpoint_store' and isinstance(value, str):
            value = SecretUrl(value)
        super().__setattr__(name, value)

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
                type=int_or_text,
                default=None,
                help=('Number of Spark partitions of each stage (and '
                      'spark.default.parallelism of a session the runner starts). '
                      "Default (or -1): Spark's defaultParallelism (the number of cores "
                      'for local[*]).'))
        parser.add_argument(
            '--bundle_size',
            type=int_or_text,
            default=DEFAULT_BUNDLE_SIZE,
            help=('Maximum number of elements in one bundle read from a source. Bundles '
                  'are cut only at the sources; downstream steps keep them whole '
                  '(start_bundle/finish_bundle run once per source bundle). Default: '
                  f'{DEFAULT_BUNDLE_SIZE}.'))
        parser.add_argument(
            '--bundle_time_ms',
            type=int_or_text,
            default=DEFAULT_BUNDLE_TIME_MS,
            help=('Maximum time in milliseconds a source spends filling one bundle '
                  '(streaming): a bundle closes after bundle_size elements or '
                  f'bundle_time_ms, whichever comes first. Default: {DEFAULT_BUNDLE_TIME_MS}.'))
        parser.add_argument(
            '--target_latency_ms',
            type=int_or_text,
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
        parser.add_argument(
            '--no_stateless_chains',
            dest='stateless_chains',
            action='store_false',
            default=True,
            help=('Run every fused Map, FlatMap, Filter, WindowInto and simple DoFn through '
                  "Beam's SDK harness step by step instead of as one composed call per "
                  'run of such steps, and read bounded sources record by record through '
                  "Beam's splittable DoFn instead of in batches: only for comparison "
                  'benchmarks and diagnosis.'))
        add_checkpoint_args(parser)


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
                 'target_latency_ms', 'no_keyed_state_gc', 'checkpoint_store',
                 'checkpoint_period_s', 'checkpoint_mode', 'drain_timeout_s', 'reset_timeout_s',
                 'max_consecutive_reset_attempts', 'consistent_region', 'autonomous_steps',
                 'checkpoint_hmac_key_env', 'restart_from_scratch')


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
            # The flag may carry a store URL: its password must not reach the message.
            problems.append(f'{redacted_url(arg)!r} is not an option of the runner or of Beam '
                            '(Beam would ignore it and use the default); did you mean '
                            f'--{close[0]}?')
    return problems


def validate_streams_spark_options(options: PipelineOptions) -> StreamsSparkOptions:
    """Check the runner's options and return them as a `StreamsSparkOptions` view.

    Every problem found is listed in one `InvalidOptionsError`, each naming the
    option, the bad value and what to write instead.
    """
    opts = options.view_as(StreamsSparkOptions)
    if isinstance(opts.checkpoint_store, str):
        # Given to PipelineOptions(checkpoint_store=...) as a plain str: hide it from now on.
        opts.checkpoint_store = opts.checkpoint_store
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
    problems.extend(_checkpoint_settings_and_problems(options)[1])
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


def _checkpoint_settings_and_problems(
        options: PipelineOptions) -> tuple[CheckpointSettings | None, list[str]]:
    return parse_checkpoint_settings(options.view_as(StreamsSparkOptions),
                                     options.view_as(GoogleCloudOptions).job_name)


def checkpoint_settings(options: PipelineOptions) -> CheckpointSettings:
    """The consistent-region options, parsed; raises `InvalidOptionsError` listing the
    problems of these flags (`validate_streams_spark_options` lists them with the rest).

    The region layout is checked here for its form only; the runner checks it
    against the pipeline with `settings.layout.assign(steps)` and `check_edges`.
    """
    settings, problems = _checkpoint_settings_and_problems(options)
    if settings is None:
        raise InvalidOptionsError(_format(problems))
    return settings
