"""What a NEXMark run's output is: each output element as one canonical text line.

Every output element becomes one line `canonical(element) TAB window TAB timestamp`,
where `canonical` does not depend on the order of unordered parts (dicts by key,
lists/sets sorted, model objects by their fields); two runs are equal when their sorted
lines are. Batch runs write the lines with `WriteToText`; streaming runs append each
bundle's lines to a file of the writing DoFn instance's own (`lines_file_writer`).

A query whose result is a side effect is captured by what it writes. Q10 logs every
event into files named by window, shard and pane; Beam's implementation leaves the
writing to a stub (`open_writable_gcs_file` does nothing) and its last step emits
nothing, so its output collection is empty on every runner. `capture_side_effect`
taps the collection its file-writing step receives (`query10_gbk`: shard -> events of a
window's pane) and writes one line per logged event, `canonical(event) TAB window TAB
pane timing`: the contents of the log files, without the shard, which Beam's query
draws from `hash(event)` (an object's identity, different in every process).
"""

from __future__ import annotations

from typing import Any

# The step of Q10 whose input elements are the log files' contents.
Q10_LOG_STEP = 'query10_gbk'
# Queries captured by their side effect (`capture_side_effect`), not their output.
SIDE_EFFECT_QUERIES = (10,)


def canonical(value: Any) -> str:
    """A text form of `value` independent of the order of its unordered parts.

    Dicts are sorted by key (and stay `ast.literal_eval`-able when their items are
    plain), lists, sets and Beam's lazy iterables are sorted, tuples keep their order,
    NEXMark model objects (Person, Auction, Bid, AuctionBid, ...) print as
    `Class(field=value, ...)` with their fields sorted.
    """
    if isinstance(value, dict):
        items = sorted((canonical(k), canonical(v)) for k, v in value.items())
        return '{' + ', '.join(f'{k}: {v}' for k, v in items) + '}'
    if isinstance(value, tuple) and not hasattr(value, '_fields'):
        parts = [canonical(v) for v in value]
        return '(' + ', '.join(parts) + (',)' if len(parts) == 1 else ')')
    if isinstance(value, (list, set, frozenset)) or _is_beam_iterable(value):
        return '[' + ', '.join(sorted(canonical(v) for v in value)) + ']'
    if _is_model(value):
        fields = ', '.join(f'{k}={canonical(v)}' for k, v in sorted(vars(value).items()))
        return f'{type(value).__name__}({fields})'
    return repr(value)


def _is_model(value: Any) -> bool:
    module = type(value).__module__ or ''
    return module.startswith('apache_beam.testing.benchmarks.nexmark') and hasattr(
        value, '__dict__')


def _is_beam_iterable(value: Any) -> bool:
    # GroupByKey values may be a lazy iterable (e.g. `_UnwindowedValues`).
    return (not isinstance(value, (str, bytes, dict, tuple))
            and hasattr(value, '__iter__') and not hasattr(value, '__next__')
            and (type(value).__module__ or '').startswith('apache_beam'))


def output_line(element: Any, window: Any, timestamp: Any) -> str:
    """One captured output: `canonical(element) TAB window TAB timestamp`."""
    return f'{canonical(element)}\t{window!r}\t{timestamp!r}'


def format_output_fn() -> Any:
    """A DoFn turning each element into its `output_line`."""
    import apache_beam as beam

    class FormatOutput(beam.DoFn):
        """Each element as its `output_line` (with its window and timestamp)."""

        def process(self, element, window=beam.DoFn.WindowParam,
                    timestamp=beam.DoFn.TimestampParam):
            yield output_line(element, window, timestamp)

    return FormatOutput()


def log_file_lines_fn() -> Any:
    """A DoFn turning each `(shard, events)` pane of Q10's log step into one line per
    logged event: `canonical(event) TAB window TAB LOG pane <timing>`."""
    import apache_beam as beam
    from apache_beam.utils.windowed_value import PaneInfoTiming

    class LogFileLines(beam.DoFn):
        def process(self, element, window=beam.DoFn.WindowParam,
                    pane=beam.DoFn.PaneInfoParam):
            file = f'LOG pane {PaneInfoTiming.to_string(pane.timing)}'
            for event in element[1]:
                yield f'{canonical(event)}\t{window!r}\t{file}'

    return LogFileLines()


def capture_side_effect(query: int, pipeline: Any) -> Any:
    """The PCollection of lines standing for `query`'s side effect (see the module
    docstring), tapped from the constructed `pipeline`; None for a query captured by
    its output."""
    import apache_beam as beam
    if query not in SIDE_EFFECT_QUERIES:
        return None
    step = _applied_transform(pipeline, Q10_LOG_STEP)
    return step.outputs[None] | 'CaptureLogFiles' >> beam.ParDo(log_file_lines_fn())


def _applied_transform(pipeline: Any, label: str) -> Any:
    """The applied transform whose full label ends with `label` (exactly one)."""
    found = []
    pending = [pipeline.transforms_stack[0]]
    while pending:
        node = pending.pop()
        if node.full_label.rsplit('/', 1)[-1] == label:
            found.append(node)
        pending.extend(node.parts)
    if len(found) != 1:
        raise ValueError(f'expected one step {label!r} in the pipeline, found {len(found)}')
    return found[0]


def lines_file_writer(prefix: str) -> Any:
    """A DoFn appending each bundle's lines to a file of its own (`prefix-<uuid>`)."""
    import apache_beam as beam

    class WriteLinesFiles(beam.DoFn):
        """Each bundle's lines, appended and flushed at the bundle's end to a file of
        this DoFn instance's own (`prefix-<uuid>`), for streaming runs: no GroupByKey,
        so no trigger or watermark decides when lines are written. A file per instance,
        not per bundle: a file per bundle (create, write, rename) was 15% of the worker
        time of a streaming ParDo at bundle size 10, an instrument cost that grew as the
        bundles shrank. Only whole lines are written, and they are read after the run.
        """

        def setup(self):
            self._file = None

        def start_bundle(self):
            self._lines = []

        def process(self, line):
            self._lines.append(line)

        def finish_bundle(self):
            import uuid
            if self._lines:
                if self._file is None:
                    self._file = open(f'{prefix}-{uuid.uuid4().hex}', 'a', encoding='utf-8')
                self._file.write(''.join(line + '\n' for line in self._lines))
                self._file.flush()
            self._lines = []

        def teardown(self):
            if self._file is not None:
                self._file.close()
                self._file = None

    return WriteLinesFiles()
