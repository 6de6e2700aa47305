"""The consistent-region flags: their definitions, checks and parsed settings.

`add_checkpoint_args` adds `--checkpoint_store`, `--checkpoint_period_s`,
`--checkpoint_mode`, `--drain_timeout_s`, `--reset_timeout_s`,
`--max_consecutive_reset_attempts`, `--consistent_region`, `--autonomous_steps`,
`--checkpoint_hmac_key_env` and `--restart_from_scratch` to `StreamsSparkOptions`
(options.py); `parse_checkpoint_settings` checks them all and parses them into one
`CheckpointSettings`, or lists every problem. Where a job's checkpoints go by default
(`default_checkpoint_store`) and the name of a job run without `--job_name`
(`new_job_name`) are decided here too.
"""

from __future__ import annotations

import argparse
import getpass
import math
import os
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from beam_streams_runner.option_types import SecretUrl, float_or_text, int_or_text
from beam_streams_runner.regions.layout import RegionLayout, RegionLayoutError, parse_region_layout

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


def add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
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
              f'${RUNNER_HOME_ENV} or {DEFAULT_RUNNER_HOME}. With --checkpoint_period_s=0 '
              "a streaming run keeps its keyed state there (under the run's own name, "
              'deleted at its end) instead of a temporary directory. On a cluster, give a '
              'store every host reaches (Redis, or a directory all hosts mount).'))
    parser.add_argument(
        '--checkpoint_period_s',
        type=float_or_text,
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
        type=float_or_text,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        help=('Seconds an epoch may run while a checkpoint or a drain waits for it '
              '(every epoch, with consistent regions on); a longer epoch is cancelled and '
              'counts as a failure: the region resets. Default: '
              f'{DEFAULT_DRAIN_TIMEOUT_S:g}.'))
    parser.add_argument(
        '--reset_timeout_s',
        type=float_or_text,
        default=DEFAULT_RESET_TIMEOUT_S,
        help=('Seconds a region may take to reset to its last checkpoint before the '
              f'attempt counts as failed. Default: {DEFAULT_RESET_TIMEOUT_S:g}.'))
    parser.add_argument(
        '--max_consecutive_reset_attempts',
        type=int_or_text,
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


def _checkpoint_value_problems(opts: Any, job_name: object) -> list[str]:
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


def parse_checkpoint_settings(
        opts: Any, job_name: str | None) -> tuple[CheckpointSettings | None, list[str]]:
    """The settings, or None and every problem of the consistent-region flags, from
    the runner's options view `opts` and Beam's `--job_name`."""
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
