"""Tests of the consistent region layout: parsing the options, assigning steps, edges."""

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_streams_runner.regions.layout import (
    DEFAULT_REGION,
    RegionLayout,
    RegionLayoutError,
    parse_region_layout,
    prefix_matches,
)

STEPS = ['Read/Impulse', 'Read/Split', 'Parse', 'Count/CombinePerKey/GroupByKey',
         'Count/CombinePerKey/Merge', 'Write/Sink']


def _problems(call, *args) -> tuple[str, ...]:
    with pytest.raises(RegionLayoutError) as info:
        call(*args)
    assert len(info.value.problems) >= 1
    assert f'({len(info.value.problems)} problem' in str(info.value)
    return info.value.problems


# Parsing the options ---------------------------------------------------------------------

@pytest.mark.parametrize('regions', [None, []])
def test_default_layout_is_one_region_of_every_step(regions):
    layout = parse_region_layout(regions, None)
    assert layout == RegionLayout()
    assert layout.regions == {DEFAULT_REGION: ()}
    assert layout.autonomous == ()
    assert layout.covers_every_step
    assert layout.assign(STEPS) == dict.fromkeys(STEPS, DEFAULT_REGION)


def test_default_layout_with_autonomous_steps():
    layout = parse_region_layout(None, 'Write')
    assert layout.covers_every_step
    assignment = layout.assign(STEPS)
    assert assignment['Write/Sink'] is None
    assert {assignment[step] for step in STEPS[:-1]} == {DEFAULT_REGION}


def test_default_layout_may_be_all_autonomous():
    assert parse_region_layout(None, 'Read,Parse,Count,Write').assign(STEPS) == dict.fromkeys(
        STEPS)


def test_regions_are_parsed():
    layout = parse_region_layout(
        ['ingest=Read, Parse/', ' counting = Count/CombinePerKey,Count/CombinePerKey'],
        ' Write ,Other/')
    assert layout.regions == {'ingest': ('Read', 'Parse'),
                              'counting': ('Count/CombinePerKey',)}
    assert layout.autonomous == ('Write', 'Other')
    assert not layout.covers_every_step


def test_region_set_from_code_as_one_string():
    assert parse_region_layout('a=Read', None).regions == {'a': ('Read',)}


def test_prefix_may_hold_equals_sign():
    assert parse_region_layout(['a=Map(x=1)'], None).regions == {'a': ('Map(x=1)',)}


@pytest.mark.parametrize('entry, words', [
    ('ingest', ["no '='", '--consistent_region=NAME=STEP_PREFIX']),
    ('=Read', ['no region name']),
    (' =Read', ['no region name']),
    ('my region=Read', ["'my region'", 'letters, digits']),
    ('.hidden=Read', ['letters, digits']),
    ('a=', ['empty step prefix']),
    ('a=Read,,Parse', ['empty step prefix']),
    ('a=Read,', ['empty step prefix']),
    ('a=/', ['empty step prefix']),
])
def test_malformed_region(entry, words):
    (problem,) = _problems(parse_region_layout, [entry], None)
    assert f'--consistent_region={entry!r}' in problem
    for word in words:
        assert word in problem


def test_region_given_twice():
    (problem,) = _problems(parse_region_layout, ['a=Read', 'a=Parse'], None)
    assert "'a' is given twice" in problem
    assert '--consistent_region=a=A,B' in problem


def test_prefix_in_two_regions():
    (problem,) = _problems(parse_region_layout, ['a=Read,Parse', 'b=Parse/'], None)
    assert "'Parse'" in problem and "'a'" in problem and "'b'" in problem


@pytest.mark.parametrize('autonomous', ['', 'Read,,Write', ','])
def test_malformed_autonomous_steps(autonomous):
    (problem,) = _problems(parse_region_layout, None, autonomous)
    assert '--autonomous_steps' in problem
    assert 'empty step prefix' in problem


def test_all_parse_problems_at_once():
    problems = _problems(parse_region_layout, ['x', '=Read', 'a=Read', 'a=Parse', 'b='],
                         'Write,')
    assert len(problems) == 5


# Assigning steps -------------------------------------------------------------------------

def test_prefix_matches_whole_label_segments():
    assert prefix_matches('Read', 'Read')
    assert prefix_matches('Read', 'Read/Impulse')
    assert prefix_matches('Read/Impulse', 'Read/Impulse')
    assert not prefix_matches('Read', 'ReadMore')
    assert not prefix_matches('Read', 'ReadMore/Impulse')
    assert not prefix_matches('Read/Impulse', 'Read')


def test_assign_explicit_regions():
    layout = parse_region_layout(['ingest=Read,Parse', 'counting=Count'], 'Write')
    assert layout.assign(STEPS) == {
        'Read/Impulse': 'ingest', 'Read/Split': 'ingest', 'Parse': 'ingest',
        'Count/CombinePerKey/GroupByKey': 'counting', 'Count/CombinePerKey/Merge': 'counting',
        'Write/Sink': None}


def test_assign_keeps_the_first_of_repeated_steps():
    layout = parse_region_layout(['a=Read'], None)
    assert layout.assign(['Read/Impulse', 'Read/Impulse']) == {'Read/Impulse': 'a'}


def test_autonomous_wins_over_a_region():
    layout = parse_region_layout(['a=Read,Parse'], 'Read/Split')
    assert layout.assign(['Read/Impulse', 'Read/Split', 'Parse']) == {
        'Read/Impulse': 'a', 'Read/Split': None, 'Parse': 'a'}


def test_step_in_two_regions_names_both():
    layout = parse_region_layout(['a=Count', 'b=Count/CombinePerKey/Merge', 'c=Read'], None)
    (problem,) = _problems(layout.assign, ['Count/CombinePerKey/Merge', 'Count/Other',
                                           'Read'])
    assert "regions 'a', 'b'" in problem
    assert "'Count/CombinePerKey/Merge'" in problem
    assert "'Count/Other'" not in problem


def test_steps_in_no_region_are_listed_up_to_ten():
    layout = parse_region_layout(['a=Read'], None)
    steps = ['Read'] + [f'Step{i}' for i in range(13)]
    (problem,) = _problems(layout.assign, steps)
    assert '13 steps are in no consistent region and not autonomous' in problem
    assert "'Step9'" in problem and "'Step10'" not in problem
    assert 'and 3 more' in problem
    assert '--consistent_region' in problem and '--autonomous_steps' in problem


def test_one_step_in_no_region():
    (problem,) = _problems(parse_region_layout(['a=Read'], None).assign, ['Read', 'Parse'])
    assert "1 step is in no consistent region and not autonomous: 'Parse'" in problem


def test_region_matching_no_step():
    layout = parse_region_layout(['a=Read,Parse,Count,Write', 'typo=Cuont'], None)
    (problem,) = _problems(layout.assign, STEPS)
    assert "--consistent_region 'typo': no step matches its prefixes 'Cuont'" in problem
    # The hint lists the top-level steps once each.
    assert "top-level steps are 'Read', 'Parse', 'Count', 'Write'" in problem


def test_region_whose_steps_are_all_autonomous():
    layout = parse_region_layout(['a=Read,Parse,Count', 'b=Write'], 'Write/Sink')
    (problem,) = _problems(layout.assign, STEPS)
    assert "'b'" in problem and '--autonomous_steps' in problem and 'empty' in problem


def test_autonomous_prefix_matching_no_step():
    (problem,) = _problems(parse_region_layout(None, 'Wirte').assign, STEPS)
    assert "--autonomous_steps prefix 'Wirte' matches no step" in problem


def test_all_assign_problems_at_once():
    layout = parse_region_layout(['a=Read', 'b=Read/Split', 'c=Nothing'], 'Nowhere')
    problems = _problems(layout.assign, STEPS)
    assert len(problems) == 4  # overlap, unmatched, empty region, unused autonomous


def test_error_pickles_and_is_value_error():
    error = RegionLayoutError(['one', 'two'], 'Title')
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, ValueError)
    assert copy.problems == ('one', 'two')
    assert str(copy) == str(error)
    assert str(error).startswith('Title (2 problems):\n  - one\n  - two')


def test_layout_rejects_incoherent_regions():
    with pytest.raises(ValueError, match='at least one region'):
        RegionLayout({})
    with pytest.raises(ValueError, match='without prefixes'):
        RegionLayout({'a': (), 'b': ('Read',)})


def test_layout_copies_its_inputs():
    regions = {'a': ['Read']}
    autonomous = ['Write']
    layout = RegionLayout(regions, autonomous)
    regions['b'] = ['Parse']
    autonomous.append('Parse')
    assert layout.regions == {'a': ('Read',)}
    assert layout.autonomous == ('Write',)
    assert hash(layout) == hash(RegionLayout({'a': ('Read',)}, ('Write',)))
    assert pickle.loads(pickle.dumps(layout)) == layout


# Edges -----------------------------------------------------------------------------------

def test_edges_within_a_region_and_to_autonomous_steps_are_fine():
    layout = parse_region_layout(['a=Read', 'b=Count'], 'Parse,Write')
    assignment = layout.assign(STEPS)
    layout.check_edges([('Read/Impulse', 'Read/Split'), ('Read/Split', 'Parse'),
                        ('Parse', 'Count/CombinePerKey/GroupByKey'),
                        ('Count/CombinePerKey/Merge', 'Write/Sink')], assignment)


def test_edge_between_regions():
    layout = parse_region_layout(['a=Read,Parse', 'b=Count', 'c=Write'], None)
    assignment = layout.assign(STEPS)
    problems = _problems(layout.check_edges,
                         [('Read/Split', 'Parse'), ('Parse', 'Count/CombinePerKey/GroupByKey'),
                          ('Count/CombinePerKey/Merge', 'Write/Sink'),
                          ('Read/Impulse', 'Count/CombinePerKey/GroupByKey')],
                         assignment)
    assert len(problems) == 2
    ab, bc = problems
    assert ab.startswith("region 'a' feeds region 'b'")
    assert "'Parse' -> 'Count/CombinePerKey/GroupByKey'" in ab
    assert "'Read/Impulse' -> 'Count/CombinePerKey/GroupByKey'" in ab
    assert 'merge them into one region, or make the boundary steps autonomous' in ab
    assert bc.startswith("region 'b' feeds region 'c'")


def test_many_edges_between_two_regions_are_summed_up():
    layout = RegionLayout({'a': ('A',), 'b': ('B',)})
    steps = [f'A/{i}' for i in range(5)] + ['B']
    (problem,) = _problems(layout.check_edges, [(f'A/{i}', 'B') for i in range(5)],
                           layout.assign(steps))
    assert 'and 2 more' in problem


def test_edge_with_an_unknown_step_is_a_bug():
    layout = RegionLayout()
    with pytest.raises(ValueError, match="'Nope'") as info:
        layout.check_edges([('Read', 'Nope')], {'Read': DEFAULT_REGION})
    assert not isinstance(info.value, RegionLayoutError)


# Properties ------------------------------------------------------------------------------

# Label segments where one is a prefix of another as text ('a', 'ab'): a prefix must match
# whole segments only.
_SEGMENT = st.sampled_from(['a', 'ab', 'b'])
_PATH = st.lists(_SEGMENT, min_size=1, max_size=3).map('/'.join)


@st.composite
def _layouts_and_steps(draw):
    steps = draw(st.lists(_PATH, min_size=1, max_size=12, unique=True))
    prefix = st.one_of(st.sampled_from(steps), _PATH)
    count = draw(st.integers(0, 3))
    regions = {f'r{i}': tuple(draw(st.lists(prefix, min_size=1, max_size=3, unique=True)))
               for i in range(count)}
    autonomous = tuple(draw(st.lists(prefix, max_size=3, unique=True)))
    return RegionLayout(regions or {DEFAULT_REGION: ()}, autonomous), steps


@st.composite
def _partitioned_layouts_and_steps(draw):
    """Layouts that name each step once, exactly: mostly valid (unless steps nest)."""
    steps = draw(st.lists(_PATH, min_size=1, max_size=12, unique=True))
    owners = draw(st.lists(st.sampled_from(['r0', 'r1', 'r2', None]),
                           min_size=len(steps), max_size=len(steps)))
    regions: dict[str, tuple[str, ...]] = {}
    for step, owner in zip(steps, owners, strict=True):
        if owner is not None:
            regions[owner] = (*regions.get(owner, ()), step)
    autonomous = tuple(step for step, owner in zip(steps, owners, strict=True) if owner is None)
    return RegionLayout(regions or {DEFAULT_REGION: ()}, autonomous), steps


def _naming(layout, step):
    return [name for name, prefixes in layout.regions.items()
            if not prefixes or any(prefix_matches(p, step) for p in prefixes)]


@settings(max_examples=300, deadline=None)
@given(st.one_of(_layouts_and_steps(), _partitioned_layouts_and_steps()))
def test_assign_properties(layout_and_steps):
    layout, steps = layout_and_steps
    free = [step for step in steps
            if not any(prefix_matches(p, step) for p in layout.autonomous)]
    # The layout is wrong exactly when a step outside --autonomous_steps is not in one
    # region, a region names no such step, or an autonomous prefix names no step.
    wrong = (any(len(_naming(layout, step)) != 1 for step in free)
             or any(prefixes and not any(prefix_matches(p, step)
                                         for p in prefixes for step in free)
                    for prefixes in layout.regions.values())
             or any(not any(prefix_matches(p, step) for step in steps)
                    for p in layout.autonomous))
    try:
        assignment = layout.assign(steps)
    except RegionLayoutError:
        assert wrong
        return
    assert not wrong
    assert list(assignment) == steps
    for step, region in assignment.items():
        if step not in free:
            assert region is None  # autonomous wins
        else:
            assert _naming(layout, step) == [region]  # exactly one region names it
            if layout.regions[region]:
                assert any(prefix_matches(p, step) for p in layout.regions[region])


@settings(max_examples=200, deadline=None)
@given(st.lists(_PATH, min_size=1, max_size=12, unique=True), st.data())
def test_exact_step_name_prefix_matches_itself(paths, data):
    # Leaves only: no step is inside another, so naming the others exactly leaves this one.
    steps = [p for p in paths if not any(q.startswith(p + '/') for q in paths)]
    step = data.draw(st.sampled_from(steps))
    assert prefix_matches(step, step)
    others = [s for s in steps if s != step]
    layout = RegionLayout({'mine': (step,), **({'rest': tuple(others)} if others else {})})
    assignment = layout.assign(steps)
    assert assignment[step] == 'mine'
    assert all(assignment[s] == 'rest' for s in others)
    # Made autonomous, the same step leaves its region whatever names it.
    if others:
        layout = RegionLayout({'mine': (step,), 'rest': tuple(others)}, (step,))
        with pytest.raises(RegionLayoutError, match="'mine'"):
            layout.assign(steps)  # 'mine' is left empty
