"""What to do about a Beam step that failed in a Spark task, for the failures users meet first.

`StageExecutionError` names the failed step and carries the traceback; for a
few failures the traceback alone does not say what to change, because the
exception comes from Beam's machinery rather than from the user's own line:

* an `AsSingleton` side input with more than one element;
* an element that is not a `(key, value)` pair reaching a step that groups by
  key (the harness fails encoding it, in the step that produced it);
* a `DoFn.process` that returns one value instead of an iterable;
* a file sink that cannot create its files.

`failure_hint` recognizes them and says what to do. `failed_combine_step`
names the step of a `CombineFn` that raised: the harness runs a lifted
combine's partial combine inside the step that feeds it, and so annotates the
failure with that step's name.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Mapping

from apache_beam.portability import common_urns

__all__ = ['failed_combine_step', 'failure_hint']

_COMBINE = common_urns.combine_components
# Which of the harness's operations runs each combine phase; a frame of one of them
# in the failure's traceback means a CombineFn raised (the user's frame is below it).
_PARTIAL_COMBINE_OPERATIONS = ('PGBKCVOperation', 'TaskPartialCombine')
_COMBINE_OPERATIONS = ('CombineOperation',)
_PARTIAL_COMBINE_URNS = frozenset([_COMBINE.COMBINE_PER_KEY_PRECOMBINE.urn])
_COMBINE_URNS = frozenset([
    _COMBINE.COMBINE_PER_KEY_MERGE_ACCUMULATORS.urn,
    _COMBINE.COMBINE_PER_KEY_EXTRACT_OUTPUTS.urn,
    _COMBINE.COMBINE_PER_KEY_CONVERT_TO_ACCUMULATORS.urn,
    _COMBINE.COMBINE_GROUPED_VALUES.urn,
])

_SINGLETON = (
    'An AsSingleton side input must hold exactly one element per window. Read it with '
    'beam.pvalue.AsList or beam.pvalue.AsIter instead, or reduce it to one element first '
    '(for example with beam.CombineGlobally).')
_NOT_A_PAIR = (
    "An element output by {step} is not a (key, value) pair, but the step it feeds "
    'groups by key (a GroupByKey, a CombinePerKey or a DoFn with state or timers), or the '
    'output was declared a tuple. Output 2-tuples, for example '
    'beam.Map(lambda x: (key_of(x), x)) or beam.WithKeys(key_of).')
_NOT_ITERABLE = (
    'DoFn.process (or the function given to FlatMap) must return an iterable of outputs or '
    'yield them: write `yield value` or `return [value]`, or use beam.Map for exactly one '
    'output per element.')
_SINK = (
    "The sink cannot create its files there. Check that the output path's parent is a "
    "directory, not a file, and that the user running Spark's workers may write to it; on "
    'a cluster, use a path every executor reaches (a shared file system, or an object store '
    'such as gs:// or s3://).')


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _frame_names(exc: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(exc.__traceback__)]


def _qualified_frame_names(exc: BaseException) -> list[str]:
    """Each frame's function name and qualified name: a Python method's carries its
    class (`TaskPartialCombine.add_batch`), as a compiled (Cython) frame's name does."""
    names = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        names.append(f'{code.co_name} {code.co_qualname}')
        tb = tb.tb_next
    return names


def failure_hint(exc: BaseException, step: str | None) -> str:
    """What to do about `exc`, raised running `step`: a line ending in a newline, or ''."""
    chain = list(_chain(exc))
    root = chain[-1]
    innermost = (_frame_names(root) or [''])[-1]
    named = f"step '{step}'" if step else 'the failed step'
    if any('accessed as a singleton view' in str(e) for e in chain):
        return _SINGLETON + '\n'
    if isinstance(root, (TypeError, ValueError)) and (
            'TupleCoderImpl.' in innermost
            # A chain's output kept per key unpacks each (key, value) itself.
            or (_qualified_frame_names(root) or [''])[-1].endswith(
                'KeyedOutputBatches.add_batch')):
        return _NOT_A_PAIR.format(step=named) + '\n'
    # Beam's output handler iterates a DoFn's result; in a stateless chain, the step's
    # `flattened` (translators/chain_steps.py) does.
    if (isinstance(root, TypeError) and 'not iterable' in str(root)
            and (innermost == 'handle_process_outputs'
                 or (_qualified_frame_names(root) or [''])[-1].endswith('ParDoStep.flattened'))):
        return _NOT_ITERABLE + '\n'
    if step and '/WriteImpl/' in step and any(isinstance(e, OSError) for e in chain):
        return _SINK + '\n'
    return ''


def failed_combine_step(exc: BaseException, transforms: Mapping[str, object]) -> str | None:
    """The combining step whose CombineFn raised `exc`, or None when no CombineFn did.

    `transforms`: the stage's transforms by id (its `ProcessBundleDescriptor`'s).
    The combine phases of one step (Precombine, Merge, ExtractOutputs) are named
    by the step itself; None too when the stage has several combining steps that
    could have raised.
    """
    names = _qualified_frame_names(list(_chain(exc))[-1])
    urns: frozenset[str] = frozenset()
    if any(op + '.' in name for name in names for op in _PARTIAL_COMBINE_OPERATIONS):
        urns = _PARTIAL_COMBINE_URNS
    elif any(op + '.' in name for name in names for op in _COMBINE_OPERATIONS):
        urns = _COMBINE_URNS
    steps = {transform.unique_name.rpartition('/')[0] or transform.unique_name
             for transform in transforms.values() if transform.spec.urn in urns}
    return steps.pop() if len(steps) == 1 else None
