"""How a fault run is judged: what its sinks published against the golden output.

Design section 12 (golden-run fault tests). `compare` reads every sink of a spec
(the final files of a file sink and what else it left in its directory, or the keys
of a Redis sink) and counts, against the golden lines (`pipelines`), results lost,
published more than once, or that no golden run has, and files left behind
(`Comparison`). P3's windows are judged by their final pane, each pane index
published once and none skipped (`final_panes`). `check_exact` asserts a run's output
equal to the golden one, `check_subset` that a run that failed published golden
lines only, each once (`partial`: for P3, a window's last pane may be an earlier one
than the final pane, holding no more elements).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from collections.abc import Sequence

from tests.faults import pipelines
from tests.faults.harness import TEXT_PREFIX, Spec, golden, out_of
from tests.faults.pipelines import PIPELINES

# WriteToText's final names for a window: part-[1795567632.0, 1795567633.0)-00000-of-00001
_TEXT_FINAL = re.compile(re.escape(TEXT_PREFIX) + r'-\[[0-9.]+, [0-9.]+\)-00000-of-00001$')
# WriteToFiles' final names (`file_naming`): output[-destination]-<start>-<end>-<k>-of-<n>
_FILES_FINAL = re.compile(r'output(-[a-z0-9_]+)?-[0-9T:.-]+-[0-9T:.-]+-\d{5}-of-\d{5}$')


@dataclasses.dataclass
class FileOutput:
    lines: list[str]  # every line of every final file, sorted
    finals: list[str]  # the final files' names
    others: list[str]  # anything else under the output directory (temporary leftovers)


def read_files(spec: Spec, label: str = '') -> FileOutput:
    """What a label's file sink left in its directory: final files' lines, and the rest."""
    pattern = _TEXT_FINAL if spec.sink == 'text' else _FILES_FINAL
    out = out_of(spec, label)
    lines: list[str] = []
    finals: list[str] = []
    others: list[str] = []
    if not os.path.isdir(out):
        return FileOutput([], [], [])
    for root, dirs, files in os.walk(out):
        for name in dirs:
            others.append(os.path.relpath(os.path.join(root, name), out) + '/')
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, out)
            if root == out and pattern.match(name):
                finals.append(relative)
                with open(path, encoding='utf-8') as f:
                    lines.extend(line for line in f.read().splitlines())
            else:
                others.append(relative)
    return FileOutput(sorted(lines), sorted(finals), sorted(others))


def read_redis(spec: Spec, client, label: str = '') -> dict[str, str]:
    """A label's keys (without the prefix) -> their values."""
    prefix = out_of(spec, label)
    keys = client.keys(prefix.encode() + b'*')
    values = client.mget(keys) if keys else []
    return {key.decode()[len(prefix):]: value.decode()
            for key, value in zip(keys, values, strict=True)}


@dataclasses.dataclass
class Comparison:
    """A sink's output against the golden one: results missing, published more than
    once, or that no golden run has, and files left behind, each also in words."""

    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    leftovers: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems


_PANE = re.compile(r'^(\S+ \S+) p(\d+) (.*)$')


def final_panes(lines: Sequence[str], result: Comparison, where: str) -> list[str]:
    """The lines with the final pane of each window and key instead of all its panes
    (without the `p` token), counting a pane index published twice as duplicated, an
    index skipped as lost and an earlier pane holding more than the final as wrong."""
    panes: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    out = []
    for line in lines:
        found = _PANE.match(line)
        if found is None:
            out.append(line)
        else:
            panes[found[1]].append((int(found[2]), f'{found[1]} {found[3]}'))
    for window_key, fired in sorted(panes.items()):
        fired.sort()
        indices = [index for index, _ in fired]
        twice = len(indices) - len(set(indices))
        skipped = sorted(set(range(indices[-1] + 1)) - set(indices))
        final = fired[-1][1]
        count = int(final.split()[2][1:])
        larger = [line for _, line in fired if int(line.split()[2][1:]) > count]
        result.duplicated += twice
        result.lost += len(skipped)
        result.wrong += len(larger)
        if twice or skipped or larger:
            result.problems.append(
                f'{where}: the panes of {window_key} are {indices} (skipped {skipped}); '
                f'earlier panes larger than the final one: {larger}')
        out.append(final)
    return sorted(out)


_SHARD = re.compile(r'^(.*)-(\d{5})-of-(\d{5})$')


def _surplus_files(spec: Spec, expected: list[str], finals: list[str]) -> list[str]:
    """Final files beyond one publication per window: WriteToText with one shard writes
    one file a window; WriteToFiles writes a file per bundle, named `k-of-n`, so the
    files of a window and pane must be 0..n-1 of one n."""
    if spec.sink == 'text':
        windows = len({line.split()[0] for line in expected})
        return finals[windows:] if not PIPELINES[spec.pipeline].panes else []
    publications: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for name in finals:
        found = _SHARD.match(name)
        publications[found[1]].append((int(found[2]), int(found[3])))
    surplus = []
    for prefix, shards in publications.items():
        totals = {total for _, total in shards}
        if len(totals) > 1 or sorted(shards) != [(k, shards[0][1]) for k in range(shards[0][1])]:
            surplus.append(prefix)
    return surplus


def _count(line: str) -> int:
    return int(next(token for token in line.split() if token.startswith('n'))[1:])


def _unfinished(line: str, wanted: dict[str, str]) -> bool:
    """An earlier pane of a golden line (P3 in a run that ended early): the same window
    and key, no more elements than the final pane."""
    final = wanted.get(pipelines.identity(line))
    return final is not None and _count(line) <= _count(final)


def _compare_redis(spec: Spec, label: str, expected: list[str], client,
                   result: Comparison, partial: bool) -> None:
    got = read_redis(spec, client, label)
    values = sorted(got.values())
    if PIPELINES[spec.pipeline].panes:
        values = final_panes(values, result, f'Redis {label or "sink"}')
    keyed = {pipelines.identity(line): line for line in values}
    wanted = {pipelines.identity(line): line for line in expected}
    missing = sorted(set(wanted) - set(keyed))
    extra = sorted(set(keyed) - set(wanted))
    unfinished = partial and PIPELINES[spec.pipeline].panes
    wrong = sorted((k, keyed[k], wanted[k]) for k in set(keyed) & set(wanted)
                   if keyed[k] != wanted[k] and not (unfinished and _unfinished(keyed[k], wanted)))
    result.lost += len(missing)
    result.wrong += len(extra) + len(wrong)
    if missing or extra or wrong:
        result.problems.append(
            f'Redis output {label!r} differs from the golden one: missing {missing}, extra '
            f'{extra}, wrong (key, got, expected) {wrong}')


def _compare_files(spec: Spec, label: str, expected: list[str], result: Comparison,
                   partial: bool) -> None:
    out = read_files(spec, label)
    where = f'sink {label!r}' if label else 'the sink'
    lines = out.lines
    if PIPELINES[spec.pipeline].panes:
        lines = final_panes(lines, result, where)
    g, e = collections.Counter(lines), collections.Counter(expected)
    surplus = g - e
    result.lost += sum((e - g).values())
    result.duplicated += sum(n for line, n in surplus.items() if line in e)
    wanted = ({pipelines.identity(line): line for line in expected}
              if partial and PIPELINES[spec.pipeline].panes else {})
    result.wrong += sum(n for line, n in surplus.items()
                        if line not in e and not _unfinished(line, wanted))
    result.leftovers += len(out.others)
    if not out.lines:
        result.problems.append(f'{where} published nothing (left: {out.others})')
    elif lines != expected:
        result.problems.append(
            f'{where}: {len(lines)} lines, {len(expected)} expected; missing '
            f'{sorted((e - g).elements())}, extra or duplicated {sorted(surplus.elements())}')
    surplus_files = _surplus_files(spec, expected, out.finals)
    if out.lines and surplus_files:
        result.duplicated += len(surplus_files)
        result.problems.append(f'{where}: final files of a window published twice: '
                               f'{surplus_files} (all: {out.finals})')
    if out.others:
        result.problems.append(f'left in the output directory of {where}: {out.others}')


def compare(spec: Spec, redis_client=None, partial: bool = False) -> Comparison:
    """Every sink's output against the golden output (see `Comparison`): a window's
    final file written twice shows as an extra file or line, a temporary file of a
    failed attempt as a leftover, an empty output as everything lost; with `partial`
    (a run that ended early), a P3 window's earlier pane is not wrong."""
    result = Comparison()
    for label, expected in sorted(golden(spec).items()):
        if spec.sink == 'redis':
            _compare_redis(spec, label, expected, redis_client, result, partial)
        else:
            _compare_files(spec, label, expected, result, partial)
    return result


def check_exact(spec: Spec, redis_client=None) -> None:
    """Asserts the sink holds exactly the golden output (see `compare`)."""
    problems = compare(spec, redis_client).problems
    assert not problems, '; '.join(problems)


def check_subset(spec: Spec, redis_client=None) -> None:
    """Asserts that what the sink holds is a part of the golden output without
    duplicates (a run that failed published only what its cuts covered)."""
    result = compare(spec, redis_client, partial=True)
    assert not (result.duplicated or result.wrong), (
        f'published twice, or what no golden run has: {result.problems}')
