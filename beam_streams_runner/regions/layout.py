"""Which consistent region each step of a pipeline belongs to.

`parse_region_layout` reads the `--consistent_region NAME=STEP_PREFIX[,...]` and
`--autonomous_steps STEP_PREFIX,...` options into a `RegionLayout`. Once the
runner knows the pipeline's steps, `RegionLayout.assign` maps every step to its
region (or to None: autonomous, outside every region) and
`RegionLayout.check_edges` checks that no region feeds another.

Every problem is reported at once, in one `RegionLayoutError` (a ValueError)
whose `problems` the options validation merges into its own list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    'DEFAULT_REGION',
    'RegionLayout',
    'RegionLayoutError',
    'parse_region_layout',
    'prefix_matches',
]

DEFAULT_REGION = 'default'
# Region names appear in logs, metrics and store entry names: keep them plain.
_REGION_NAME = re.compile(r'[A-Za-z0-9_][A-Za-z0-9_.-]*')
_MAX_LISTED = 10
_REGION_FORM = '--consistent_region=NAME=STEP_PREFIX[,STEP_PREFIX...]'
_OPTIONS_TITLE = 'Invalid consistent region options'
_ASSIGN_TITLE = "The consistent region options do not fit the pipeline's steps"
_EDGES_TITLE = 'The consistent regions are not independent'
_INDEPENDENT_FIX = ('regions must be independent: merge them into one region, or make the '
                    'boundary steps autonomous (--autonomous_steps)')


class RegionLayoutError(ValueError):
    """The region options are wrong, or do not fit the pipeline; `problems` lists each."""

    def __init__(self, problems: Iterable[str], title: str = _OPTIONS_TITLE) -> None:
        self.problems = tuple(problems)
        self.title = title
        count = len(self.problems)
        lines = '\n'.join(f'  - {problem}' for problem in self.problems)
        super().__init__(f'{title} ({count} problem{"s" if count != 1 else ""}):\n{lines}')

    def __reduce__(self):
        # The default would call __init__ with the formatted message as `problems`.
        return (type(self), (self.problems, self.title))


def prefix_matches(prefix: str, step: str) -> bool:
    """Whether `prefix` names `step`: the step itself, or a composite step containing it."""
    return step == prefix or step.startswith(prefix + '/')


def _listed(items: Iterable[str], limit: int = _MAX_LISTED) -> str:
    items = list(items)
    shown = ', '.join(repr(item) for item in items[:limit])
    return shown + (f' and {len(items) - limit} more' if len(items) > limit else '')


@dataclass(frozen=True)
class RegionLayout:
    """The consistent regions of a pipeline, as step prefixes, and its autonomous steps.

    `regions` maps a region's name to its step prefixes; a prefix names a step when
    the step's full label (as 'Count/CombinePerKey/GroupByKey') equals it or starts
    with it followed by '/', so a composite's label names every step inside it. A
    region without prefixes (only the default layout has one) covers every step
    that is not autonomous. Treat `regions` as read-only.

    The rules `assign` applies:

    * a step named by an `autonomous` prefix is autonomous (None), whatever region
      also names it: autonomous prefixes win;
    * otherwise the step belongs to the one region naming it; a step named by two
      regions is a problem naming both;
    * with explicit regions, a step named by no region and not autonomous is a
      problem (add it to a --consistent_region or to --autonomous_steps);
    * a region left with no step (its prefixes name none, or only autonomous ones)
      and an autonomous prefix that names no step are problems: probably typos.
    """

    regions: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {DEFAULT_REGION: ()}, hash=False)
    autonomous: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Own copies: a caller's dict or list changing later must not change the layout.
        regions = {str(name): tuple(prefixes) for name, prefixes in self.regions.items()}
        object.__setattr__(self, 'regions', regions)
        object.__setattr__(self, 'autonomous', tuple(self.autonomous))
        if not regions:
            raise ValueError('A RegionLayout has at least one region')
        if len(regions) > 1 and not all(regions.values()):
            raise ValueError('Only a layout of one region may have a region without '
                             'prefixes (the region of every step)')

    @property
    def covers_every_step(self) -> bool:
        """One region of every step that is not autonomous (no --consistent_region)."""
        return len(self.regions) == 1 and not next(iter(self.regions.values()))

    def _regions_naming(self, step: str) -> tuple[str, ...]:
        return tuple(name for name, prefixes in self.regions.items()
                     if not prefixes or any(prefix_matches(p, step) for p in prefixes))

    def assign(self, step_names: Iterable[str]) -> dict[str, str | None]:
        """Each step's region name, or None for an autonomous step (rules: class doc).

        Raises `RegionLayoutError` listing every problem.
        """
        steps = list(dict.fromkeys(step_names))
        assignment: dict[str, str | None] = {}
        overlaps: dict[tuple[str, ...], list[str]] = {}
        unmatched: list[str] = []
        for step in steps:
            if any(prefix_matches(prefix, step) for prefix in self.autonomous):
                assignment[step] = None
                continue
            names = self._regions_naming(step)
            if len(names) == 1:
                assignment[step] = names[0]
            elif names:
                overlaps.setdefault(names, []).append(step)
            else:
                unmatched.append(step)
        problems = [
            f'regions {_listed(names)} all name the steps {_listed(named, 3)}: a step '
            'belongs to one region; narrow the prefixes, or make the steps autonomous '
            '(--autonomous_steps).'
            for names, named in overlaps.items()]
        if unmatched:
            problems.append(
                f'{len(unmatched)} step{"s are" if len(unmatched) > 1 else " is"} in no '
                f'consistent region and not autonomous: {_listed(unmatched)}; add them to a '
                '--consistent_region or to --autonomous_steps.')
        problems.extend(self._unused_prefix_problems(steps))
        if problems:
            raise RegionLayoutError(problems, _ASSIGN_TITLE)
        return assignment

    def _unused_prefix_problems(self, steps: list[str]) -> list[str]:
        """Regions left without steps, and autonomous prefixes naming no step."""
        problems = []
        hint = ("; the pipeline's top-level steps are "
                + (_listed(dict.fromkeys(step.split('/', 1)[0] for step in steps))
                   or 'none'))
        for name, prefixes in self.regions.items():
            if not prefixes:  # the region of every step: empty only if all are autonomous
                continue
            named = [step for step in steps
                     if any(prefix_matches(prefix, step) for prefix in prefixes)]
            if not named:
                problems.append(f'--consistent_region {name!r}: no step matches its '
                                f'prefixes {_listed(prefixes)} (check the spelling){hint}.')
            elif all(any(prefix_matches(p, step) for p in self.autonomous) for step in named):
                problems.append(f'--consistent_region {name!r}: every step it names is also '
                                'named by --autonomous_steps (which wins), so the region is '
                                'empty; remove the region or narrow --autonomous_steps.')
        for prefix in self.autonomous:
            if not any(prefix_matches(prefix, step) for step in steps):
                problems.append(f'--autonomous_steps prefix {prefix!r} matches no step '
                                f'(check the spelling){hint}.')
        return problems

    def check_edges(self, edges: Iterable[tuple[str, str]],
                    assignment: Mapping[str, str | None]) -> None:
        """Raise `RegionLayoutError` if a step of one region feeds a step of another.

        `edges` are (producer step, consumer step) pairs; `assignment` is what `assign`
        returned. Edges between a region and an autonomous step are fine: the
        autonomous step is outside every region's checkpoint and replay. An edge
        naming a step missing from `assignment` is a ValueError (a runner bug).
        """
        crossings: dict[tuple[str, str], list[str]] = {}
        unknown: list[str] = []
        for producer, consumer in edges:
            missing = [step for step in (producer, consumer) if step not in assignment]
            if missing:
                unknown.extend(missing)
                continue
            source, target = assignment[producer], assignment[consumer]
            if source is not None and target is not None and source != target:
                crossings.setdefault((source, target), []).append(
                    f'{producer!r} -> {consumer!r}')
        if unknown:
            raise ValueError(f'Edges name steps without a region assignment: '
                             f'{_listed(dict.fromkeys(unknown))}')
        if crossings:
            raise RegionLayoutError(
                [f'region {source!r} feeds region {target!r} ({", ".join(pairs[:3])}'
                 f'{f" and {len(pairs) - 3} more" if len(pairs) > 3 else ""}); '
                 f'{_INDEPENDENT_FIX}.'
                 for (source, target), pairs in crossings.items()],
                _EDGES_TITLE)


def _parse_prefixes(text: str, where: str) -> tuple[tuple[str, ...], list[str]]:
    """Comma-separated step prefixes, stripped of spaces and of a trailing '/'."""
    prefixes = [item.strip().rstrip('/').strip() for item in text.split(',')]
    if not all(prefixes):
        return (), [f'{where} has an empty step prefix (two commas, a trailing comma, or '
                    "only '/'); list step prefixes separated by single commas."]
    return tuple(dict.fromkeys(prefixes)), []


def _parse_region(entry: str) -> tuple[str, tuple[str, ...], list[str]]:
    """One `NAME=STEP_PREFIX[,...]` entry: (name, prefixes, problems)."""
    where = f'--consistent_region={entry!r}'
    name, sep, rest = str(entry).partition('=')
    name = name.strip()
    if not sep:
        return name, (), [f"{where} has no '='; write {_REGION_FORM}."]
    problems = []
    if not name:
        problems.append(f'{where} has no region name before the first \'=\'; write '
                        f'{_REGION_FORM}.')
    elif not _REGION_NAME.fullmatch(name):
        problems.append(f'{where}: the region name {name!r} may hold only letters, digits, '
                        "'_', '.' and '-', and not start with '.' or '-'.")
    prefixes, prefix_problems = _parse_prefixes(rest, where)
    return name, prefixes, problems + prefix_problems


def parse_region_layout(consistent_region: list[str] | None,
                        autonomous_steps: str | None) -> RegionLayout:
    """The layout the `--consistent_region` and `--autonomous_steps` options describe.

    With no `--consistent_region`, one region named 'default' covers every step
    that is not autonomous. Raises `RegionLayoutError` listing every malformed
    entry: no '=', an empty or unusual region name, an empty prefix, a region
    given twice, a prefix listed by two regions.
    """
    if isinstance(consistent_region, str):  # set from code as one string
        consistent_region = [consistent_region]
    problems: list[str] = []
    regions: dict[str, tuple[str, ...]] = {}
    owners: dict[str, str] = {}  # prefix -> the first region listing it
    for entry in consistent_region or ():
        name, prefixes, entry_problems = _parse_region(entry)
        problems.extend(entry_problems)
        if entry_problems:
            continue
        if name in regions:
            problems.append(f'--consistent_region {name!r} is given twice; give a region '
                            f'once, with all its prefixes: --consistent_region={name}=A,B.')
            continue
        for prefix in prefixes:
            owner = owners.setdefault(prefix, name)
            if owner != name:
                problems.append(f'step prefix {prefix!r} is in regions {owner!r} and '
                                f'{name!r}; a step belongs to one region.')
        regions[name] = prefixes
    autonomous: tuple[str, ...] = ()
    if autonomous_steps is not None:
        autonomous, autonomous_problems = _parse_prefixes(
            str(autonomous_steps), f'--autonomous_steps={autonomous_steps!r}')
        problems.extend(autonomous_problems)
    if problems:
        raise RegionLayoutError(problems, _OPTIONS_TITLE)
    return RegionLayout(regions or {DEFAULT_REGION: ()}, autonomous)
