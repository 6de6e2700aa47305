"""One benchmark run on two or more commits in one invocation, their outputs compared.

A change that claims "no behaviour change" (or a speed-up) is measured against the
commit before it on the same machine, in the same invocation, one after the other:

    python -m benchmarks.side_by_side --commits c779f74,HEAD \\
        --out benchmarks/results/DATE-side-by-side -- \\
        benchmarks.nexmark --streaming --query=0-12 --events=10000 --spark_master=local[2]

Each commit is exported (`git archive`) into a directory of its own and installed,
without its dependencies, into a virtualenv of its own that sees this Python's
packages (PySpark, Beam) but not an editable install of this package; the benchmark
runs in a directory holding only the commit's `benchmarks/`, so the driver and
PySpark's workers import that commit's code and that commit's benchmark (the run
checks where the package comes from before it starts). Every run writes to
`OUT/<commit>/`; the benchmark's `--out` is appended to its arguments.

The verdict compares every file under each run's `outputs/` directory (the NEXMark
launcher writes one sorted file per query and runner there) with the first commit's:
identical, or the first differing line. A file present in one run only, or a run that
failed, fails the comparison; files that are empty in every run are reported as such,
not as equal. A benchmark that writes no `outputs/` is judged by its
exit code (the keyed-state GC benchmark fails on a broken memory rule or a wrong
output). The combined report (`side_by_side.md`) holds each run's own report (tables,
verdicts, plots) and, where the runs wrote a `results.csv` with `wall_s`, the wall
times of every commit side by side with their ratio to the first.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent


@dataclass
class CommitRun:
    commit: str
    sha: str
    out: Path
    returncode: int | None = None
    wall_s: float = 0.0

    @property
    def label(self) -> str:
        """The run's name in the report: its commit, and which run of it."""
        return self.out.name


def _resolve(commit: str) -> str:
    return subprocess.run(['git', 'rev-parse', '--short', commit], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()


# Run at every start of the virtualenv's Python (driver and PySpark workers): an editable
# install of the package in the shared site-packages appends a finder that would answer
# for any module the commit lacks; without it, a missing module fails as it should.
NO_EDITABLE_FINDERS = """import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, '__module__', '').startswith('__editable__')]
sys.path_hooks[:] = [h for h in sys.path_hooks
                     if not getattr(h, '__module__', '').startswith('__editable__')]
"""


def prepare(sha: str, work: Path) -> tuple[Path, Path]:
    """A directory to run in, holding the commit's `benchmarks/`, and the Python of a
    virtualenv with the commit's package installed (not importable from that directory:
    the package's subpackages live beside it in the tree, mapped in at install)."""
    tree, venv, run_dir = work / sha / 'tree', work / sha / 'venv', work / sha / 'run'
    installed = work / sha / 'installed'
    if not installed.exists():
        shutil.rmtree(work / sha, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(['git', 'archive', '--format=tar', sha], cwd=REPO,
                                 check=True, capture_output=True).stdout
        archive_path = work / sha / 'tree.tar'
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(tree, filter='data')
        subprocess.run([sys.executable, '-m', 'venv', '--clear', '--system-site-packages',
                        str(venv)], check=True)
        subprocess.run([str(venv / 'bin' / 'python'), '-m', 'pip', 'install', '-q',
                        '--no-deps', str(tree)], check=True)
        site = subprocess.run([str(venv / 'bin' / 'python'), '-c',
                               'import sysconfig; print(sysconfig.get_path("purelib"))'],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, 'sitecustomize.py').write_text(NO_EDITABLE_FINDERS)
        run_dir.mkdir()
        (run_dir / 'benchmarks').symlink_to(tree / 'benchmarks')
        installed.touch()
    return run_dir, venv / 'bin' / 'python'


def run_commit(run: CommitRun, work: Path, benchmark: Sequence[str]) -> None:
    run_dir, python = prepare(run.sha, work)
    probe = 'import beam_streams_runner as m; print(m.__file__)'
    found = subprocess.run([str(python), '-c', probe], cwd=run_dir, check=True,
                           capture_output=True, text=True).stdout.strip()
    if not found.startswith(str(work / run.sha)):
        raise SystemExit(f'{run.commit}: the virtualenv imports {found}, not the commit\'s own '
                         'package; remove the editable install or use a clean Python')
    run.out.mkdir(parents=True, exist_ok=True)
    command = [str(python), '-m', *benchmark, '--out', str(run.out.resolve())]
    print(f'[side-by-side] {run.commit} ({run.sha}): {" ".join(command)}', flush=True)
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    run.returncode = subprocess.run(command, cwd=run_dir, env=env).returncode
    run.wall_s = time.monotonic() - started
    print(f'[side-by-side] {run.commit}: exit {run.returncode} after {run.wall_s:.0f} s',
          flush=True)


def first_difference(a: Path, b: Path) -> str:
    left, right = a.read_text().splitlines(), b.read_text().splitlines()
    for number, (x, y) in enumerate(zip(left, right, strict=False), 1):
        if x != y:
            return f'line {number}: {x[:60]!r} vs {y[:60]!r}'
    return f'{len(left)} lines vs {len(right)} lines'


def compare_outputs(runs: Sequence[CommitRun]) -> list[tuple[str, list[int | None], str]]:
    """(file, line count per run, verdict) for every file under any run's outputs/."""
    names = sorted({p.relative_to(r.out / 'outputs').as_posix()
                    for r in runs if (r.out / 'outputs').is_dir()
                    for p in (r.out / 'outputs').rglob('*') if p.is_file()})
    rows = []
    for name in names:
        paths = [r.out / 'outputs' / name for r in runs]
        counts = [len(p.read_text().splitlines()) if p.exists() else None for p in paths]
        if None in counts:
            verdict = 'missing in ' + ', '.join(runs[i].label for i, c in enumerate(counts)
                                                if c is None)
        elif not any(counts):
            verdict = 'empty in every run'
        else:
            texts = [p.read_bytes() for p in paths]
            differing = [i for i in range(1, len(runs)) if texts[i] != texts[0]]
            verdict = ('identical' if not differing else
                       f'differs in {runs[differing[0]].label}: '
                       + first_difference(paths[0], paths[differing[0]]))
        rows.append((name, counts, verdict))
    return rows


def wall_times(runs: Sequence[CommitRun]) -> list[tuple[str, list[float | None]]]:
    """(query/runner label, wall_s per run) from each run's results.csv, if any. Rows
    without a query (another benchmark's rows, which its own report lists) are left out:
    they would all fall under one label."""
    tables = []
    for run in runs:
        path = run.out / 'results.csv'
        rows = list(csv.DictReader(path.open())) if path.exists() else []
        tables.append({(r['query'], r.get('runner', '')): r['wall_s'] for r in rows
                       if r.get('wall_s') and r.get('query')})
    labels = sorted({k for t in tables for k in t}, key=lambda k: (int(k[0]) if k[0].isdigit()
                                                                    else 0, k))
    return [(f'Q{q} {runner}', [float(t[(q, runner)]) if (q, runner) in t else None
                                for t in tables]) for q, runner in labels]


def _own_reports(runs: Sequence[CommitRun], out: Path) -> list[str]:
    """Each run's own report, its tables and verdicts, under a heading per commit."""
    lines = []
    for run in runs:
        for path in sorted(run.out.glob('*.md')):
            body = path.read_text().replace('](', f']({run.label}/')
            lines += ['', f'## {run.commit} ({run.label}): {path.name}', '',
                      body.replace('\n# ', '\n### ').removeprefix('# ')]
    return lines


def report(runs: Sequence[CommitRun], benchmark: Sequence[str], out: Path) -> bool:
    outputs = compare_outputs(runs)
    exited = all(r.returncode == 0 for r in runs)
    ok = exited and all(v in ('identical', 'empty in every run') for _, _, v in outputs)
    lines = ['# Side by side: one benchmark on several commits', '',
             f'`python -m benchmarks.side_by_side --commits {",".join(r.commit for r in runs)} '
             f'--out {out} -- {" ".join(benchmark)}`', '',
             '| commit | exit | wall s |', '|---|---|---|']
    lines += [f'| {r.commit} ({r.label}) | {r.returncode} | {r.wall_s:.0f} |' for r in runs]
    times = wall_times(runs)
    if times:
        lines += ['', '## Wall time per query and runner (s), ratio to the first commit', '',
                  '| run | ' + ' | '.join(r.label for r in runs) + ' | ratio |',
                  '|---|' + '---|' * (len(runs) + 1)]
        for label, values in times:
            ratio = (f'{values[-1] / values[0]:.2f}' if values[0] and values[-1] is not None
                     else '-')
            lines.append(f'| {label} | ' + ' | '.join('-' if v is None else f'{v:.2f}'
                                                      for v in values) + f' | {ratio} |')
    if outputs:
        lines += ['', '## Outputs compared with the first commit', '',
                  '| file | lines per commit | verdict |', '|---|---|---|']
        lines += [f'| {name} | {" / ".join("-" if c is None else str(c) for c in counts)} '
                  f'| {v} |' for name, counts, v in outputs]
        verdict = 'same outputs on every commit' if ok else 'FAILED'
    else:
        # Without outputs to compare, each run's own verdicts (its exit code) decide.
        verdict = 'every run passed its own checks' if ok else 'FAILED'
    lines += ['', f'Verdict: {verdict}', '', *_own_reports(runs, out)]
    (out / 'side_by_side.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines[:lines.index(f'Verdict: {verdict}') + 1]))
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--' not in argv:
        raise SystemExit('usage: python -m benchmarks.side_by_side --commits A,B --out DIR '
                         '-- BENCHMARK_MODULE [ARGS...]')
    split = argv.index('--')
    parser = argparse.ArgumentParser(prog='python -m benchmarks.side_by_side')
    parser.add_argument('--commits', required=True, help='comma-separated, first = baseline')
    parser.add_argument('--out', required=True)
    parser.add_argument('--work', default='/tmp/side-by-side',
                        help='where the commits are exported and installed')
    args, benchmark = parser.parse_args(argv[:split]), argv[split + 1:]
    out, work = Path(args.out).resolve(), Path(args.work)
    runs: list[CommitRun] = []
    for commit in args.commits.split(','):
        sha = _resolve(commit)
        # A commit named twice runs twice: what differs then is the run, not the code.
        repeat = sum(r.sha == sha for r in runs)
        runs.append(CommitRun(commit, sha, out / (f'{sha}-{repeat + 1}' if repeat else sha)))
    for run in runs:
        run_commit(run, work, benchmark)
    return 0 if report(runs, benchmark, out) else 1


if __name__ == '__main__':
    sys.exit(main())
