"""No import circles in `benchmarks/`: the graph of `benchmarks.*` imports is acyclic.

Every module under `benchmarks/` is parsed with `ast`; every import of a `benchmarks.*`
module counts, at module level or inside a function (a deferred import still makes
the two modules depend on each other, it only hides the circle until a call). An
import of a name from a package (`from benchmarks import micro`,
`from benchmarks.nexmark import runs`) counts as an import of that submodule when
there is one. A cycle is reported as the modules along it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / 'benchmarks'


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under `root` (packages by `__init__`)."""
    names = {}
    for path in root.rglob('*.py'):
        parts = path.relative_to(root.parent).with_suffix('').parts
        if parts[-1] == '__init__':
            parts = parts[:-1]
        names['.'.join(parts)] = path
    return names


def imported_modules(tree: ast.AST, module: str, is_package: bool,
                     known: Iterable[str]) -> set[str]:
    """The modules of `known` that `tree` (the source of `module`) imports anywhere."""
    # The parent packages an import runs first (`benchmarks/__init__.py`) are not edges
    # here: a package's own imports are its node's edges, and a submodule importing its
    # package is no circle unless that package imports it back, which those edges show.
    known = set(known)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            if base is None:
                continue
            submodules = {f'{base}.{alias.name}' for alias in node.names} & known
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(base)  # names defined in the module (or package) itself
    return (found & known) - {module}


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str | None:
    """The absolute module name of `from X import ...` in `module`."""
    if node.level == 0:
        return node.module
    package = module.split('.') if is_package else module.split('.')[:-1]
    if node.level > 1:
        package = package[:-(node.level - 1)]
    if not package:
        return None
    return '.'.join(package + ([node.module] if node.module else []))


def import_graph(root: Path = BENCHMARKS) -> dict[str, set[str]]:
    """Module -> the `benchmarks.*` modules it imports, for every module under `root`."""
    names = module_names(root)
    return {name: imported_modules(ast.parse(path.read_text(encoding='utf-8')), name,
                                   path.name == '__init__.py', names)
            for name, path in names.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, str] = {}  # 'open' while on the path, 'done' after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 'open'
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 'open':
                return [*path[path.index(target):], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 'done'
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_benchmarks_have_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 20 and 'benchmarks.nexmark.runs' in graph
    cycle = find_cycle(graph)
    assert cycle is None, 'import cycle in benchmarks/: ' + ' -> '.join(cycle)


def test_a_function_level_import_closes_a_cycle(tmp_path):
    # The old circle: micro imported sweep inside main(), sweep imports micro.
    package = tmp_path / 'benchmarks'
    (package / 'nexmark').mkdir(parents=True)
    (package / '__init__.py').write_text('')
    (package / 'nexmark' / '__init__.py').write_text('')
    (package / 'nexmark' / 'runs.py').write_text('from . import verdicts\n')
    (package / 'nexmark' / 'verdicts.py').write_text('import os\n')
    (package / 'micro.py').write_text(
        'import sys\n\ndef main():\n    from benchmarks import sweep\n    return sweep\n')
    (package / 'sweep.py').write_text(
        'from benchmarks import micro, sink_check\nfrom benchmarks.nexmark import runs\n')
    (package / 'sink_check.py').write_text('from benchmarks.nexmark.runs import x\n')
    graph = import_graph(package)
    assert graph['benchmarks.nexmark.runs'] == {'benchmarks.nexmark.verdicts'}
    assert graph['benchmarks.sweep'] == {'benchmarks.micro', 'benchmarks.sink_check',
                                         'benchmarks.nexmark.runs'}
    assert graph['benchmarks.sink_check'] == {'benchmarks.nexmark.runs'}
    assert find_cycle(graph) == ['benchmarks.micro', 'benchmarks.sweep',
                                 'benchmarks.micro']
    (package / 'micro.py').write_text('import sys\n')
    assert find_cycle(import_graph(package)) is None
