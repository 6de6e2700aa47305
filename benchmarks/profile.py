"""Where a run's Python time goes: py-spy over the driver and every Python worker.

    python -m benchmarks.profile --query=5 --events=300000 --out bench-out/profile-q5 \\
        [--streaming] [runner options, e.g. --spark_master=local[2]]
    python -m benchmarks.profile --churning=dofn --events=300000 --out bench-out/profile-churn
    python -m benchmarks.profile --batch=wordcount --out bench-out/profile-wordcount
    python -m benchmarks.profile --query=7 --events_dir=DIR --num_events=N --out OUT \\
        [--checkpoint_dir=D --checkpoint_period_s=5]

Runs one NEXMark query on StreamsSparkRunner (`benchmarks.nexmark.launcher --run-one`),
one case of the churning-keys stateful workload (`benchmarks.churning_keys`), or one
case of the batch speed benchmark (`benchmarks.batch_speed`: one warm-up at a hundredth
of the size, then one run at full size, StreamsSparkRunner only), or with `--events_dir`
the streaming comparison's program of this runner over a directory of event files
(`benchmarks.nexmark.beam_streaming`, as `benchmarks.compare` runs it), under
`py-spy record --subprocesses` (sampling the driver, PySpark's worker daemon and the
workers it forks; idle frames left out) and writes `OUT/profile.md`: the samples per
process kind, the functions with the most samples in the Python workers (inclusive:
a function counts once per sample it is on the stack of), and the share of a few
categories that answer "where does the time go" (the NEXMark generator, Beam's SDK
harness, the runner's GroupByKey, PySpark's worker I/O and (de)serialization,
imports). Also `OUT/profile.raw`, py-spy's collapsed stacks, for a flame graph.
py-spy comes with the `bench` extra (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

from benchmarks.batch_cases import CASES as BATCH_CASES
from benchmarks.churning_keys import CASES as CHURNING_CASES

# category -> (frames (function @ file) that put a sample in it, whether only the
# innermost two frames count); the first matching category wins.
CATEGORIES = {
    'NEXMark generator (shared by every runner)': (('@generator.py', '@java_random.py'), False),
    # The comparison's event files: reading and parsing their JSON lines into events.
    'event files read and parsed (JSON lines)': (('@file_stream_source.py',), False),
    "runner's GroupByKey (reduce side)": (('advance @group_by_key.py',
                                           'advance @streaming_group_by_key.py',
                                           'process_bundle @streaming_group_by_key.py'),
                                          False),
    # A streaming source stage's reads, the steps fused after the source included.
    'source reads (splittable DoFn, fused steps after it)': (('read_residual @par_do.py',),
                                                              False),
    "stateful DoFns' timers firing": (('FusedStageOperator._fire @par_do.py',), False),
    "stateful DoFns' state and timers (direct user state)": (('@direct_user_state.py',), False),
    'keyed-state commit': (('PartitionEpoch.commit @partition_epoch.py',), False),
    "Beam's SDK harness (user DoFns, coders)": (('process_bundle @bundle_processor.py',), False),
    'imports': (('_find_and_load @<frozen importlib._bootstrap>',), False),
    'PySpark (de)serialization and socket I/O': (('@serializers.py', '@worker_util.py',
                                                  '@socket.py', '@pickle.py'), True),
}
_FRAME = re.compile(r'(.*?) \((.*?):\d+\)')


def frame_name(frame: str) -> str:
    """'function @file' of one py-spy frame ('function (path/file.py:line)')."""
    match = _FRAME.match(frame)
    return f'{match.group(1)} @{os.path.basename(match.group(2))}' if match else frame


def summarize(raw_path: str, top: int = 30) -> str:
    """The markdown summary of py-spy's collapsed stacks in `raw_path`."""
    kinds: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    categories: collections.Counter = collections.Counter()
    worker_samples = 0
    with open(raw_path, encoding='utf-8') as f:
        for line in f:
            stack, _, count = line.rstrip('\n').rpartition(' ')
            names = [frame_name(frame) for frame in stack.split(';')]
            samples = int(count)
            if 'worker @daemon.py' not in names:  # not in a forked worker's task
                in_daemon = any('daemon' in name for name in names[:3])
                kinds['PySpark worker daemon' if in_daemon else 'driver'] += samples
                continue
            kinds['Python workers'] += samples
            worker_samples += samples
            for name in set(names):
                inclusive[name] += samples
            for category, (markers, innermost) in CATEGORIES.items():
                searched = names[-2:] if innermost else names
                if any(marker in name for name in searched for marker in markers):
                    categories[category] += samples
                    break
    lines = ['| process | samples |', '|---|---|']
    lines += [f'| {kind} | {samples} |' for kind, samples in kinds.most_common()]
    lines += ['', "(The worker daemon's samples are mostly its wait for the next task: py-spy "
              'cannot tell that wait from work without stopping the process.)']
    lines += ['', '| where (Python workers) | share of worker samples |', '|---|---|']
    for category in [*CATEGORIES, 'other']:
        counted = (worker_samples - sum(categories.values()) if category == 'other'
                   else categories[category])
        lines.append(f'| {category} | {counted / max(worker_samples, 1):.0%} |')
    lines += ['', f'Top {top} functions in the Python workers (inclusive samples):', '',
              '| samples | share | function |', '|---|---|---|']
    functions = [(name, samples) for name, samples in inclusive.most_common()
                 if not _is_root(name)][:top]
    lines += [f'| {samples} | {samples / max(worker_samples, 1):.0%} | `{name}` |'
              for name, samples in functions]
    return '\n'.join(lines) + '\n'


def _is_root(name: str) -> bool:
    """A process or interpreter start frame, on every stack of its process."""
    return name.startswith(('process ', '<module> @')) or '<frozen runpy>' in name or any(
        name.startswith(f'{function} @') for function in ('manager', 'worker', 'main'))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument('--query', type=int)
    target.add_argument('--churning', choices=CHURNING_CASES,
                        help='a case of benchmarks.churning_keys (streaming) instead of a query')
    target.add_argument('--batch', choices=list(BATCH_CASES),
                        help='a case of benchmarks.batch_speed instead of a query')
    parser.add_argument('--events', type=int, default=100_000)
    parser.add_argument('--streaming', action='store_true')
    parser.add_argument('--events_dir', default=None,
                        help="with --query: the streaming comparison's program over this "
                             'directory of event files (give its --num_events)')
    parser.add_argument('--rate', type=int, default=25, help='py-spy samples per second')
    parser.add_argument('--out', required=True)
    known, runner_args = parser.parse_known_args(argv)
    py_spy = shutil.which('py-spy')
    if py_spy is None:
        parser.error("py-spy is not installed: pip install -e '.[bench]'")
    os.makedirs(known.out, exist_ok=True)
    raw = os.path.join(known.out, 'profile.raw')
    if known.batch:
        child = [sys.executable, '-m', 'benchmarks.batch_speed', f'--cases={known.batch}',
                 '--runners=StreamsSparkRunner', '--repeats=1', '--warm_ups=1',
                 '--no_cores_check', f'--out={os.path.join(known.out, "batch_speed")}',
                 *runner_args]
        title = f'batch speed case {known.batch}'
    elif known.events_dir:
        if known.query is None:
            parser.error('--events_dir goes with --query')
        child = [sys.executable, '-m', 'benchmarks.nexmark.beam_streaming',
                 f'--query={known.query}', f'--events_dir={known.events_dir}',
                 f'--records={os.path.join(known.out, "records.jsonl")}',
                 f'--summary={os.path.join(known.out, "summary.json")}', *runner_args]
        title = f'NEXMark Q{known.query}, streaming over the event files of {known.events_dir}'
    elif known.churning:
        child = [sys.executable, '-m', 'benchmarks.churning_keys', f'--events={known.events}',
                 f'--case={known.churning}', *runner_args]
        title = f'churning keys ({known.churning}), {known.events} events, streaming'
    else:
        child = [sys.executable, '-m', 'benchmarks.nexmark.launcher', '--run-one',
                 f'--query={known.query}', '--runner=StreamsSparkRunner',
                 f'--result={os.path.join(known.out, "result.json")}',
                 f'--lines={os.path.join(known.out, "lines.txt")}',
                 f'--num_events={known.events}',
                 *(['--streaming'] if known.streaming else []), *runner_args]
        title = (f'NEXMark Q{known.query}, {known.events} events, '
                 f'{"streaming" if known.streaming else "batch"}')
    print(f'profiling {title} ...', flush=True)
    subprocess.run([py_spy, 'record', '--subprocesses', '--nonblocking', '-r', str(known.rate),
                    '--format', 'raw', '-o', raw, '--', *child], check=True)
    report = (f'# Profile: {title}\n\n'
              f'Command: `python -m benchmarks.profile {" ".join(argv or sys.argv[1:])}`\n\n'
              + summarize(raw))
    with open(os.path.join(known.out, 'profile.md'), 'w', encoding='utf-8') as f:
        f.write(report)
    print(report)
    return 0


if __name__ == '__main__':
    sys.exit(main())
