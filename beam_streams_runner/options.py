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

A checkpoint store URL may hold a Redis password. It is kept as a `SecretUrl`, a
`str` whose content is the real URL (for the Redis client) but whose str(),
repr() and format() show the password as '***', so printing the options,
logging them or an error message never shows it.
"""

from __future__ import annotations

import difflib
import getpass
import math
import os
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from beam_streams_runner.regions.layout import RegionLayout, RegionLayoutError, parse_region_layout
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

DEFAULT_CHECKPOINT_PERIOD_S = 10.0
CHECKPOINT_MODES = ('non_blocking', 'blocking')
DEFAULT_CHECKPOINT_MODE = 'non_blocking'
DEFAULT_DRAIN_TIMEOUT_S = 180.0
DEFAULT_RESET_TIMEOUT_S = 180.0
DEFAULT_MAX_CONSECUTIVE_RESET_ATTEMPTS = 5
# What the runner keeps on this machine (the default stores: <home>/checkpoints/<job>);
# the variable moves it.
RUNNER_HOME_ENV = 'BEAM_STREAMS_RUNNER_HOME'
DEFAULT_RUNNER_HOME = '~/.beam_streams_runner'

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


class SecretUrl(str):
    """A URL whose password stays out of logs and messages.

    The string content is the real URL, so `urllib.parse.urlsplit(url)` and
    `redis.Redis.from_url(url)` see the password; `str()`, `repr()`, `%s`, f-strings
    and `format()` show `redacted`, the URL with the password as '***'. Pass the
    object itself to a client: `str(url)` is the redacted text. `reveal()` gives
    the real URL as a plain `str`, for the one place that needs it.
    """

    __slots__ = ()

    def __new__(cls, value: object = '') -> SecretUrl:
        # str(value) of a SecretUrl is the redacted text: copy the real content instead.
        return super().__new__(cls, str.__str__(value) if isinstance(value, str) else value)

    @property
    def redacted(self) -> str:
        """The URL with its password shown as '***'."""
        return redacted_url(self)

    def reveal(self) -> str:
        """The real URL, password included, as a plain str: never log it."""
        return str.__str__(self)

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:
        return repr(self.redacted)

    def __format__(self, format_spec: str) -> str:
        return format(self.redacted, format_spec)

    def __reduce__(self) -> tuple[type, tuple[str]]:
        # Pickled (shipped to Spark tasks, copied) with its real content.
        return (SecretUrl, (str.__str__(self),))


def _int_or_text(value: str) -> int | str:
    """The argparse type of the runner's integer flags. A value that is not an integer
    stays text, so that validation reports it with every other problem; argparse's own
    `type=int` would print the usage of every Beam option and exit the program."""
    try:
        return int(value)
    except ValueError:
        return value


def _float_or_text(value: str) -> float | str:
    """The argparse type of the runner's number flags: see `_int_or_text`."""
    try:
        return float(value)
    except ValueError:
        return value


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
        _add_checkpoint_args(parser)


def _add_checkpoint_args(parser) -> None:
    """The consistent-region flags (streaming: checkpoint, reset and replay)."""
    parser.add_argument(
        '--checkpoint_store',
        type=SecretUrl,
        default=None,
        metavar='URL',
        help=('Where consistent regions keep their checkpoints: '
              'redis://[[user]:password@]host[:port][/db] (port 6379 and db 0 when left '
              'out), rediss://... for Redis over TLS, file:///absolute/path or a directory '
              "path. Percent-encode '/', '?', '#', '[' and ']' in a password; the password "
              'never appears in logs or messages. A job keeps its state under its '
              '--job_name: a run with the same --job_name and --checkpoint_store resumes '
              'it. Default: the directory <home>/checkpoints/<job_name>, where <home> is '
              f'${RUNNER_HOME_ENV} or {DEFAULT_RUNNER_HOME}.'))
    parser.add_argument(
        '--checkpoint_period_s',
        type=_float_or_text,
        default=DEFAULT_CHECKPOINT_PERIOD_S,
        help=('Streaming: seconds between two checkpoints of the consistent regions; 0 '
              'turns consistent regions off (no checkpoints, no recovery). Default: '
              f'{DEFAULT_CHECKPOINT_PERIOD_S:g}.'))
    parser.add_argument(
        '--checkpoint_mode',
        default=DEFAULT_CHECKPOINT_MODE,
        help=('non_blocking: a region keeps processing while its checkpoint is written; '
              'blocking: it waits for the checkpoint to be stored. Default: '
              f'{DEFAULT_CHECKPOINT_MODE}.'))
    parser.add_argument(
        '--drain_timeout_s',
        type=_float_or_text,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        help=('Seconds an epoch may run while a checkpoint or a drain waits for it '
              '(every epoch, with consistent regions on); a longer epoch is cancelled and '
              'counts as a failure: the region resets. Default: '
              f'{DEFAULT_DRAIN_TIMEOUT_S:g}.'))
    parser.add_argument(
        '--reset_timeout_s',
        type=_float_or_text,
        default=DEFAULT_RESET_TIMEOUT_S,
        help=('Seconds a region may take to reset to its last checkpoint before the '
              f'attempt counts as failed. Default: {DEFAULT_RESET_TIMEOUT_S:g}.'))
    parser.add_argument(
        '--max_consecutive_reset_attempts',
        type=_int_or_text,
        default=DEFAULT_MAX_CONSECUTIVE_RESET_ATTEMPTS,
        help=('Resets of a region in a row, without a checkpoint in between, before the '
              f'pipeline fails. Default: {DEFAULT_MAX_CONSECUTIVE_RESET_ATTEMPTS}.'))
    parser.add_argument(
        '--consistent_region',
        action='append',
        default=None,
        metavar='NAME=STEP_PREFIX[,STEP_PREFIX...]',
        help=('A consistent region: its name and the steps in it, each named by its full '
              "label or the label of a composite around it ('Count' names "
              "'Count/CombinePerKey/...'). Repeat the flag for several regions; regions "
              'must not feed each other, and every step must then be in a region or in '
              '--autonomous_steps. Default: one region, named default, of every step.'))
    parser.add_argument(
        '--autonomous_steps',
        default=None,
        metavar='STEP_PREFIX[,STEP_PREFIX...]',
        help=('Steps outside every consistent region (not checkpointed, not replayed), '
              'named as in --consistent_region; they win over a region naming them too.'))
    parser.add_argument(
        '--checkpoint_hmac_key_env',
        default=None,
        metavar='VAR',
        help=('The name of an environment variable holding a key that authenticates '
              'every checkpoint chunk (HMAC), so a checkpoint altered in the store is '
              'refused. Give the name of the variable, not the key. Default: none.'))
    parser.add_argument(
        '--restart_from_scratch',
        action='store_true',
        default=False,
        help=('Delete the stored state of this job (its --job_name in the '
              '--checkpoint_store) and start again instead of resuming it.'))


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
    problems.extend(_parse_checkpoint_settings(options)[1])
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


# Checkpoint settings (consistent regions) ---------------------------------------------

_URL_SCHEME = re.compile(r'([A-Za-z][A-Za-z0-9+.-]*)://')
# 'localhost:6379', 'redis:host', 'file:/x': a URL mistyped, not a directory name.
_SCHEME_LIKE = re.compile(r'[A-Za-z][A-Za-z0-9+.-]*:')
_STORE_FORMS = ('redis://[[user]:password@]host[:port][/db], rediss://... (Redis over TLS), '
                'file:///absolute/path or a directory path')
_ENV_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')


@dataclass(frozen=True)
class CheckpointSettings:
    """The consistent-region options, parsed and checked (see `checkpoint_settings`).

    `store_url` is None when `--checkpoint_store` is not given: the store is then
    `default_checkpoint_store(job_name)` (`store_url_for`). `job_name` is Beam's
    `--job_name`, None when not given: the run is then a new job, which nothing
    resumes (`new_job_name`).
    """

    store_url: SecretUrl | None
    period_s: float
    mode: str
    drain_timeout_s: float
    reset_timeout_s: float
    max_consecutive_reset_attempts: int
    layout: RegionLayout
    hmac_key_env: str | None
    restart_from_scratch: bool
    job_name: str | None

    @property
    def enabled(self) -> bool:
        """Whether consistent regions are on (`--checkpoint_period_s` > 0)."""
        return self.period_s > 0

    def store_url_for(self, job_name: str) -> SecretUrl:
        """`--checkpoint_store`, or else the default directory of job `job_name`."""
        if self.store_url is not None:
            return self.store_url
        return default_checkpoint_store(job_name)


def default_checkpoint_root() -> str:
    """The directory holding the default stores, absolute: <home>/checkpoints, where
    <home> is $BEAM_STREAMS_RUNNER_HOME or else ~/.beam_streams_runner."""
    home = os.environ.get(RUNNER_HOME_ENV) or DEFAULT_RUNNER_HOME
    return os.path.join(os.path.abspath(os.path.expanduser(home)), 'checkpoints')


def default_checkpoint_store(job_name: str) -> SecretUrl:
    """The default store of job `job_name`: a directory named after it under the root.

    The name is percent-escaped (every character but letters, digits, '-', '_' and
    '.', and a leading '.'), so any job name is one directory of its own and two
    names never share one.
    """
    if not job_name:
        raise ValueError('A job name is needed to name the default checkpoint store')
    name = quote(job_name, safe='-_.')
    if name.startswith('.'):  # '.', '..' and hidden directories
        name = '%2E' + name[1:]
    return SecretUrl(os.path.join(default_checkpoint_root(), name))


def new_job_name() -> str:
    """A fresh job name, for a run without --job_name: beamapp-<user>-<UTC time>-<random>."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ImportError):  # no login name, no passwd entry
        user = ''
    user = re.sub(r'[^a-z0-9]+', '-', user.lower()).strip('-') or 'user'
    stamp = time.strftime('%Y%m%d-%H%M%S', time.gmtime())
    return f'beamapp-{user}-{stamp}-{secrets.token_hex(3)}'


def _redis_problems(url: SecretUrl, where: str) -> list[str]:
    """The form of a redis:// or rediss:// URL; messages show only its redacted text."""
    form = f"{url.split(':', 1)[0].lower()}://[[user]:password@]host[:port][/db]"
    try:
        parsed = urlsplit(url)
        port = parsed.port  # a ValueError when not a number from 0 to 65535
    except ValueError:
        return [f'{where} is not a {form} URL: its host or port cannot be read; '
                "percent-encode '/', '?', '#', '[' and ']' in the password."]
    problems = []
    if not parsed.hostname:
        problems.append(f'{where} has no host; write {form}.')
    if port == 0:
        problems.append(f'{where}: port 0 is not a port; write {form} (default port 6379).')
    db = parsed.path.strip('/')
    if db and not db.isdigit():
        problems.append(f'{where}: the database after the host must be a number, as in '
                        f'{form.replace("[/db]", "/0")}.')
    return problems


def _store_problems(value: object) -> list[str]:
    """Whether `--checkpoint_store` has one of the accepted forms (not reachability)."""
    if value is None:
        return []
    if not isinstance(value, str):
        return [f'--checkpoint_store must be a URL or a path, not {type(value).__name__}.']
    url = SecretUrl(value)
    where = f'--checkpoint_store={url!r}'  # redacted
    match = _URL_SCHEME.match(url)
    if not url.strip():
        return [f'{where} is empty; use one of {_STORE_FORMS}, or leave it out for a '
                'directory named after the job.']
    if match is None:
        if _SCHEME_LIKE.match(url):
            return [f'{where} is neither a URL nor a directory path; use one of '
                    f'{_STORE_FORMS} (./{url.redacted} for a directory with this name).']
        return []
    scheme = match.group(1).lower()
    if scheme in ('redis', 'rediss'):
        return _redis_problems(url, where)
    if scheme == 'file':
        parsed = urlsplit(url)
        if parsed.netloc not in ('', 'localhost') or not parsed.path.startswith('/'):
            return [f"{where}: a file URL names a local absolute path, as in "
                    "'file:///tmp/checkpoints'."]
        return []
    if scheme == 'memory':  # the stores' in-process store, for tests
        return [] if not url[match.end():] else [f"{where}: write 'memory://' alone."]
    return [f'{where}: unknown scheme {scheme!r}; use one of {_STORE_FORMS}.']


def _seconds_problem(name: str, value: object, default: float, *, zero: str = '') -> list[str]:
    """A finite number of seconds > 0 (>= 0 when `zero` says what 0 means)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0 or (value == 0 and not zero)):
        kind = 'a number of seconds >= 0' if zero else 'a positive number of seconds'
        return [f'--{name}={value!r} must be {kind} (default {default:g}{zero}).']
    return []


def _checkpoint_value_problems(opts: StreamsSparkOptions, job_name: object) -> list[str]:
    """Every consistent-region flag but the layout."""
    problems = _store_problems(opts.checkpoint_store)
    problems += _seconds_problem('checkpoint_period_s', opts.checkpoint_period_s,
                                 DEFAULT_CHECKPOINT_PERIOD_S,
                                 zero='; 0 turns consistent regions off')
    if opts.checkpoint_mode not in CHECKPOINT_MODES:
        problems.append(f'--checkpoint_mode={opts.checkpoint_mode!r} must be '
                        f'{" or ".join(CHECKPOINT_MODES)} (default {DEFAULT_CHECKPOINT_MODE}).')
    problems += _seconds_problem('drain_timeout_s', opts.drain_timeout_s,
                                 DEFAULT_DRAIN_TIMEOUT_S)
    problems += _seconds_problem('reset_timeout_s', opts.reset_timeout_s,
                                 DEFAULT_RESET_TIMEOUT_S)
    attempts = opts.max_consecutive_reset_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        problems.append(f'--max_consecutive_reset_attempts={attempts!r} must be an integer '
                        f'>= 1 (default {DEFAULT_MAX_CONSECUTIVE_RESET_ATTEMPTS}).')
    env = opts.checkpoint_hmac_key_env
    if env is not None and not (isinstance(env, str) and _ENV_NAME.fullmatch(env)):
        # Not echoed: a user who misread the flag may have given the key itself.
        problems.append('--checkpoint_hmac_key_env is not an environment variable name '
                        "(letters, digits and '_', not starting with a digit): give the "
                        'name of the variable that holds the key, not the key.')
    if isinstance(job_name, str) and not job_name.strip():
        problems.append(f'--job_name={job_name!r} is empty: it names the job in the '
                        'checkpoint store; give a name, or leave it out for a new job '
                        'each run.')
    return problems


def _parse_checkpoint_settings(
        options: PipelineOptions) -> tuple[CheckpointSettings | None, list[str]]:
    """The settings, or None and every problem of the consistent-region flags."""
    opts = options.view_as(StreamsSparkOptions)
    job_name = options.view_as(GoogleCloudOptions).job_name
    problems = _checkpoint_value_problems(opts, job_name)
    try:
        layout = parse_region_layout(opts.consistent_region, opts.autonomous_steps)
    except RegionLayoutError as exc:
        problems.extend(exc.problems)
    if problems:
        return None, problems
    store = opts.checkpoint_store
    if store is not None:
        # '~' left unexpanded by the shell (as in --checkpoint_store=~/ckpt) means home.
        store = SecretUrl(store if _URL_SCHEME.match(store) else os.path.expanduser(store))
    return CheckpointSettings(
        store_url=store,
        period_s=float(opts.checkpoint_period_s),
        mode=opts.checkpoint_mode,
        drain_timeout_s=float(opts.drain_timeout_s),
        reset_timeout_s=float(opts.reset_timeout_s),
        max_consecutive_reset_attempts=int(opts.max_consecutive_reset_attempts),
        layout=layout,
        hmac_key_env=opts.checkpoint_hmac_key_env,
        restart_from_scratch=bool(opts.restart_from_scratch),
        job_name=job_name,
    ), []


def checkpoint_settings(options: PipelineOptions) -> CheckpointSettings:
    """The consistent-region options, parsed; raises `InvalidOptionsError` listing the
    problems of these flags (`validate_streams_spark_options` lists them with the rest).

    The region layout is checked here for its form only; the runner checks it
    against the pipeline with `settings.layout.assign(steps)` and `check_edges`.
    """
    settings, problems = _parse_checkpoint_settings(options)
    if settings is None:
        raise InvalidOptionsError(_format(problems))
    return settings
