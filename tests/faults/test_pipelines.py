"""The pipelines P1-P8 of the fault tests under one fault each, and how they are judged.

Design section 12. The golden outputs and the judging (P3's panes, two sinks, the
files a window may be published in) are checked on made-up outputs without Spark;
then each pipeline the older fault tests do not run (P1 a stateless chain, P3
windows with early and late panes, P5 a streaming side input, P6 two sources
through CoGroupByKey into two sinks, P7 operator-driven cuts only, P8 two regions
and autonomous steps) runs once with a fault in the middle, and its sinks must
hold exactly the golden output. The whole cross of pipelines, sinks and faults is
the fault matrix (`python -m benchmarks.faults`).
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from tests.faults import harness, judging, pipelines

START = 1_000_000_000


def spec_of(pipeline: str, sink: str, out: str) -> harness.Spec:
    return harness.Spec(pipeline, sink, out, START)


def test_every_pipeline_has_golden_lines_per_label():
    for name, pipeline in pipelines.PIPELINES.items():
        golden = harness.golden(harness.Spec(name, 'files', '/nowhere', START))
        assert set(golden) == set(pipeline.labels) and all(golden.values()), name
        for lines in golden.values():
            assert lines == sorted(lines) and len(set(lines)) == len(lines), name
            identities = [pipelines.identity(line) for line in lines]
            assert len(set(identities)) == len(identities), name


def test_golden_aggregates_follow_the_input():
    # 6 s of stream A: 600 elements over 6 windows of 3 keys; each count and sum once.
    lines = harness.golden(spec_of('combine', 'files', '/x'))['']
    assert len(lines) == 18
    counts = [int(line.split()[2][1:]) for line in lines]
    sums = [int(line.split()[3][1:]) for line in lines]
    assert sum(counts) == 600 and sum(sums) == sum(range(600))
    # P3: element 99 comes a second late, alone in the window before the first one.
    windows = harness.golden(spec_of('windows', 'files', '/x'))['']
    assert f'w{START - 1} k0 n1 s99' in windows
    assert f'sw{START - 1} k0 n34 s{sum(range(0, 100, 3))}' in windows
    # P5: each element carries its window's sum of the side stream (4 side elements).
    side = harness.golden(spec_of('side_input', 'files', '/x'))['']
    assert side[0] == f'w{START} k0 n34 s{sum(range(0, 100, 3)) * 1000 + 34 * 6}'


def write_text(spec: harness.Spec, lines_per_window: dict[int, list[str]]) -> None:
    out = harness.out_of(spec)
    os.makedirs(out, exist_ok=True)
    for start, lines in lines_per_window.items():
        name = f'{harness.TEXT_PREFIX}-[{start}.0, {start + 1}.0)-00000-of-00001'
        with open(os.path.join(out, name), 'w') as f:
            f.write(''.join(f'{line}\n' for line in lines))


def by_window(lines: list[str]) -> dict[int, list[str]]:
    windows: dict[int, list[str]] = {}
    for line in lines:
        windows.setdefault(int(line.split()[0].lstrip('sw')), []).append(line)
    return windows


def with_panes(golden: list[str], panes: dict[str, list[str]]) -> list[str]:
    """P3's output: each tumbling line as the panes given for its identity (default: one
    pane, p0, holding it all)."""
    out = []
    for line in golden:
        if line.startswith('sw'):
            out.append(line)
            continue
        w, k, rest = line.split(' ', 2)
        for pane in panes.get(f'{w} {k}', [f'p0 {rest}']):
            out.append(f'{w} {k} {pane}')
    return out


def test_windows_are_judged_by_their_final_pane(tmp_path):
    spec = harness.Spec('windows', 'text', str(tmp_path / 'out'), START)
    golden = harness.golden(spec)['']
    first = next(line for line in golden if not line.startswith('sw'))
    w, k, n, s = first.split()
    early = f'p0 n1 {s[0]}1'

    def judged(panes, name):
        write_text(dataclasses.replace(spec, out=str(tmp_path / name)),
                   by_window(with_panes(golden, panes)))
        return judging.compare(dataclasses.replace(spec, out=str(tmp_path / name)))

    assert judged({}, 'a').exact
    assert judged({f'{w} {k}': [early, f'p1 {n} {s}']}, 'b').exact
    twice = judged({f'{w} {k}': [early, early, f'p1 {n} {s}']}, 'c')
    assert twice.duplicated == 1 and not twice.exact
    skipped = judged({f'{w} {k}': [early, f'p2 {n} {s}']}, 'd')
    assert skipped.lost == 1 and not skipped.exact
    short = judged({f'{w} {k}': [f'p0 {n} {s}', f'p1 n1 {s[0]}1']}, 'e')
    assert short.lost == 1 and short.wrong == 2 and not short.exact


def test_a_run_that_ended_early_may_hold_an_early_pane_only(tmp_path):
    spec = harness.Spec('windows', 'text', str(tmp_path / 'out'), START)
    golden = harness.golden(spec)['']
    first = next(line for line in golden if not line.startswith('sw'))
    w, k, n, s = first.split()
    only_early = dataclasses.replace(spec, out=str(tmp_path / 'early'))
    write_text(only_early, by_window(with_panes(golden, {f'{w} {k}': ['p0 n1 s1']})))
    assert judging.compare(only_early).wrong == 1
    judging.check_subset(only_early)
    more = dataclasses.replace(spec, out=str(tmp_path / 'more'))
    write_text(more, by_window(with_panes(golden, {f'{w} {k}': [f'p0 n{int(n[1:]) + 1} {s}']})))
    with pytest.raises(AssertionError, match='published twice, or what no golden run has'):
        judging.check_subset(more)


def test_two_sinks_are_judged_each(tmp_path):
    spec = harness.Spec('cogroup', 'text', str(tmp_path / 'out'), START)
    golden = harness.golden(spec)
    write_text(dataclasses.replace(spec, out=harness.out_of(spec, 'a')),
               by_window(golden['a']))
    assert judging.compare(spec).lost == len(golden['b'])
    write_text(dataclasses.replace(spec, out=harness.out_of(spec, 'b')),
               by_window(golden['b'] + golden['b'][:1]))
    result = judging.compare(spec)
    assert (result.lost, result.duplicated) == (0, 1)


def test_a_window_published_twice_by_writetofiles_is_found(tmp_path):
    spec = harness.Spec('combine', 'files', str(tmp_path / 'out'), START)
    lines = harness.golden(spec)['']
    os.makedirs(spec.out)
    window = '2001-09-09T01:46:40-2001-09-09T01:46:41'
    for name, part in ((f'output-{window}-00000-of-00002', lines[:9]),
                       (f'output-{window}-00001-of-00002', lines[9:])):
        with open(os.path.join(spec.out, name), 'w') as f:
            f.write(''.join(f'{line}\n' for line in part))
    assert judging.compare(spec).exact
    with open(os.path.join(spec.out, f'output-{window}-00000-of-00001'), 'w') as f:
        f.write('')
    result = judging.compare(spec)
    assert result.duplicated == 1 and 'published twice' in result.problems[0]


# Each pipeline under a fault, in process ---------------------------------------------------------
@pytest.mark.parametrize('pipeline, sink, store, mode, kind, where, at', [
    ('stateless', 'files', 'file', 'non_blocking', 'kill_worker', 'keyed', 330),
    ('windows', 'files', 'redis', 'blocking', 'raise', 'source', 250),
    ('windows', 'redis', 'file', 'non_blocking', 'kill_worker', 'keyed', 350),
    ('side_input', 'files', 'file', 'blocking', 'raise', 'source', 310),
    ('cogroup', 'redis', 'redis', 'non_blocking', 'kill_worker', 'keyed', 280),
    ('cuts', 'files', 'file', 'blocking', 'raise', 'source', 260),
    ('regions', 'files', 'redis', 'blocking', 'raise', 'keyed', 340),
    ('regions', 'redis', 'file', 'non_blocking', 'kill_worker', 'source', 300),
], ids=lambda v: str(v))
def test_a_pipeline_under_a_fault_publishes_exactly_the_golden_output(
        pipeline, sink, store, mode, kind, where, at, fault_run, attempts):
    times = attempts if kind == 'raise' else 1
    run = fault_run(pipeline, sink, store, mode, fault=(kind, where, at, times))
    run.run()
    assert run.spec.fault.done() == times
    run.check_exact()

