"""Checks of each transform as the pipeline is built, before Beam expands it.

`StreamsSparkRunner.apply_PTransform` runs `check_applied` on every transform
applied to a pipeline the runner was given at construction, so two mistakes
fail on the user's own line, with what to do instead:

* A cross-language transform (`ExternalTransform`: `ReadFromKafka`,
  `SqlTransform`, ...): expanding it would download and start a Java expansion
  service, and what it expands to runs in a Java SDK harness, which this runner
  does not run (it runs Python transforms, in Spark's Python workers).
* A DoFn with state or timers applied to elements whose type is known and is
  not a `(key, value)` pair: Beam's own error there does not say what to do.
"""

from __future__ import annotations

from apache_beam import coders, pvalue, typehints
from apache_beam.transforms import core, userstate
from apache_beam.transforms.external import ExternalTransform, JavaJarExpansionService

from beam_streams_runner.errors import InvalidPipelineError, UnsupportedFeatureError

__all__ = ['check_applied']

# What to use instead of well-known cross-language transforms, by a word of their URN.
_PYTHON_ALTERNATIVES = (
    ('kafka', 'for Kafka, a DoFn (or a splittable DoFn) using a Python client such as '
              'confluent-kafka or kafka-python'),
    ('jdbc', 'for JDBC, a DoFn using the database\'s Python DB-API driver'),
    ('sql', 'for SQL, Beam DataFrames (apache_beam.dataframe) or plain Python transforms'),
)
_ANY_ALTERNATIVE = ('a Python IO from apache_beam.io, or a DoFn using the system\'s Python '
                    'client')


def check_applied(transform: object, pvalueish: object) -> None:
    """Raises when `transform`, about to be applied to `pvalueish`, cannot run here."""
    if isinstance(transform, ExternalTransform):
        raise UnsupportedFeatureError(_cross_language_message(transform, pvalueish))
    if isinstance(transform, core.ParDo) and userstate.is_stateful_dofn(transform.fn):
        element_type = getattr(pvalueish, 'element_type', None)
        if (element_type is not None and element_type != typehints.Any
                and not coders.registry.get_coder(element_type).is_kv_coder()):
            raise InvalidPipelineError(_unkeyed_state_message(transform, pvalueish,
                                                              element_type))


def _full_label(transform, pvalueish) -> str:
    """The label the transform is being applied under (its composites' labels too)."""
    values = (pvalueish.values() if isinstance(pvalueish, dict)
              else pvalueish if isinstance(pvalueish, (tuple, list)) else [pvalueish])
    for value in values:
        if isinstance(value, (pvalue.PValue, pvalue.PBegin)):
            current = getattr(value.pipeline, '_current_transform', None)
            if current is not None:
                return current().full_label
    return transform.label


def _cross_language_message(transform: ExternalTransform, pvalueish) -> str:
    urn = getattr(transform, '_urn', '') or ''
    service = getattr(transform, '_expansion_service', None)
    java = (isinstance(service, JavaJarExpansionService)
            or 'org.apache.beam' in urn or ':java' in urn)
    sdk = 'a Java SDK harness' if java else 'the SDK harness of another language'
    instead = next((text for word, text in _PYTHON_ALTERNATIVES if word in urn.lower()),
                   _ANY_ALTERNATIVE)
    return (
        f"Step '{_full_label(transform, pvalueish)}' ({type(transform).__name__}, {urn}) is a "
        f'cross-language transform: an expansion service expands it, and what it expands '
        f'to runs in {sdk}, which StreamsSparkRunner does not run (it runs Python '
        f"transforms only, in Spark's Python workers). Use a Python implementation "
        f'instead ({instead}), or run this pipeline on a runner that runs cross-language '
        'transforms (FlinkRunner, DataflowRunner, or the Java SparkRunner through its job '
        'server).')


def _unkeyed_state_message(transform: core.ParDo, pvalueish, element_type) -> str:
    state_specs, timer_specs = userstate.get_dofn_specs(transform.fn)
    # TimerSpec names carry Beam's 'ts-' prefix; the user wrote the rest.
    uses = ', '.join(sorted(f"state '{spec.name}'" for spec in state_specs)
                     + sorted(f"timer '{spec.name.removeprefix(spec.prefix)}'"
                              for spec in timer_specs))
    type_name = getattr(element_type, '__name__', None) or str(element_type)
    return (
        f"Step '{_full_label(transform, pvalueish)}' ({type(transform.fn).__name__}) uses "
        f'{uses}, which Beam keeps per key and window, but its input elements are of type '
        f'{type_name}, not (key, value) pairs. Key the input first, for example '
        '`| beam.Map(lambda x: (key_of(x), x))` or `| beam.WithKeys(key_of)` before this '
        'step; process() then receives (key, value) tuples.')
