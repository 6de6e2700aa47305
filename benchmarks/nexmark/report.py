"""The NEXMark report: results table (text, Markdown, CSV), plot and notes.

`write_report` writes `results.csv`, `report.md` (environment, command, table, plot,
notes on how runs are compared, and the findings: every row whose verdict is not
`yes`) and `nexmark.png` (events/s per query and runner, log scale).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.nexmark.verdicts import RunResult


@dataclass
class Row:
    """One line of the results table."""

    query: int
    runner: str
    events: int
    wall_s: float
    events_per_s: float
    output_count: int
    equal: str
    note: str = ''


def make_row(result: RunResult, equal: str, note: str = '') -> Row:
    eps = result.events / result.wall_s if result.ok and result.wall_s > 0 else 0.0
    return Row(result.query, result.runner, result.events, round(result.wall_s, 2),
               round(eps, 1), result.output_count if result.ok else 0, equal, note)


COLUMNS = ('query', 'runner', 'events', 'wall time s', 'events/s', 'output count',
           'equal to reference')

NOTES = """\
* **Verdicts**: each run's output is captured as sorted lines `element TAB window TAB
  timestamp` (dicts sorted by key, lists/sets sorted, model objects by their fields) and
  compared with the reference's: a batch run of the reference runner over the same
  events (kept in a cache per event set; "cached run" in the note). `yes`: equal.
  `empty`: no output on either side, so nothing was compared (never counted as equal).
  `no (...)`: differs in a way the note explains and the launcher checked; plain `no`:
  differs, with examples.
* **Q4, Q6, Q9**: Beam's DirectRunner (FnApiRunner) cannot run their custom merging
  window (`Cannot convert _OpaqueWindow`), so their reference is the
  `BundleBasedDirectRunner` when `--compare DirectRunner`.
* **"no (equal to the ms)"**: elements and windows are equal but output timestamps differ
  below 1 ms. Beam's WindowedValue coder carries timestamps in milliseconds, so runners
  that encode elements between steps (DirectRunner/FnApiRunner, StreamsSparkRunner) give
  an end-of-window output timestamp of `end - 1 ms`, while the BundleBasedDirectRunner,
  which passes Python objects between steps without encoding them, keeps Python's
  `IntervalWindow.max_timestamp()` = `end - 1 us`. This is the Q4/Q9 difference against
  the BundleBasedDirectRunner; on the DirectRunner the same windowed queries (Q5, Q7, ...)
  agree exactly.
* **Q6** fails on every runner: Beam's `query6` negates a `Timestamp`
  (`TypeError: bad operand type for unary -`); it is reported as failing, not skipped.
  With `--corrected-q6` it runs `benchmarks/nexmark/query6_corrected.py` instead: Beam's
  query with the sort key negating the bid time in micros, nothing else changed.
* **Q10** logs every event into files per window, shard and pane, through a stub
  (`open_writable_gcs_file` does nothing), and its last step emits nothing. It is
  compared by what it would write: one line per logged event with its window and pane
  timing, taken from the input of its writing step (the shard is left out: Beam's query
  draws it from `hash(event)`, an object identity).
* **Q12** fires on processing time (`Repeatedly(AfterProcessingTime)`, discarding panes):
  the number and contents of its panes depend on timing, so it is compared on its
  deterministic part, the total bid count per bidder summed over all panes. The
  DirectRunner fails on it in batch (`'NoneType' object has no attribute 'time'`); when
  the reference fails, the totals are compared with counts taken straight from the
  generator (the "generator oracle").
* **DirectRunner (2 processes)**: the DirectRunner with
  `--direct_num_workers=2 --direct_running_mode=multi_processing`, the two cores
  StreamsSparkRunner gets with `local[2]`, next to its default of one worker.
* **SparkNative** (`--native spark`): hand-written PySpark RDD programs for Q0, Q1, Q2,
  Q3, Q5, Q7 (`benchmarks/nexmark/spark_baselines.py`) over the same events, generated in
  the Spark tasks; their output is written as the same canonical lines and compared
  exactly. Q3 reproduces Beam's batch behaviour of its `AfterCount(30)` trigger (only
  sellers with >= 30 grouped elements produce output; see that module).
* **FlinkNative** (`--native flink`, optional extra): hand-written PyFlink DataStream
  programs (batch execution mode) for the same six queries
  (`benchmarks/nexmark/flink_baselines.py`), run by the python of the separate
  virtualenv `.venv-flink` (`bash benchmarks/nexmark/setup_flink_venv.sh`; PyFlink pins
  an old apache-beam); events generated in the Flink tasks, output records turned into
  the same canonical lines and compared exactly. Its wall time includes starting Flink's
  local cluster and its Python workers (about 15-25 s on this machine).
* Wall time is measured around a fresh Python subprocess per (query, runner), so it
  includes interpreter and (for StreamsSparkRunner) JVM/Spark start-up; events/s =
  events / wall time.
* **"(streaming)" rows** (`--with-streaming`): the tested runner again, with
  `--streaming` over the unbounded source as fast as possible (Q6 as
  `query6_corrected`), compared with the batch reference like a streaming run; the note
  gives its events/s as a ratio to the same runner's batch row.
"""

STREAMING_NOTES = """* **Streaming** (`--streaming`): the runner under test reads the unbounded
  source (`ReadUnboundedNexmarkEvents`: a splittable DoFn over parts of whole generator
  timelines, watermark = event time of the last emitted event minus the out-of-order
  bound, +inf at the end of a part) with Beam's `--streaming` option; with `--rate` the
  source paces itself to that many events/s over all parts (self-checkpointing with
  resume delays), so events/s cannot exceed the rate. Its output is compared with the
  batch reference over the same events.
* **"no (bids closed before their auction)"**, Q4, Q6, Q9: Beam's `WinningBids` joins a
  bid to its auction by merging the bid's window [t, t + 33.3 s) into the auction's
  window. In batch every window is merged at once; in streaming a bid's window that has
  ended (the watermark passed it) fires alone, with no auction and no output, and is
  gone when its auction is created later (Beam's DirectRunner does the same). The
  generator makes such bids: its timelines each hold a block of event ids and all start
  at the base time, so a timeline's first bids name auctions from the end of the
  previous block, created up to one timeline's length later in event time. The verdict
  holds when the output equals a second batch reference run over the same events
  without those bids ("(batch, without early bids)" rows); the note gives their number
  and how far the nearest one ended before its auction (a margin the watermark would
  have to lag by to change the result).
* **Q6 in streaming** (`--corrected-q6`): `Repeatedly(AfterCount(1))` with ACCUMULATING
  panes emits the moving mean each time a seller's winning bids arrive; the batch
  reference fires once per seller. When every batch line is one of the seller's streaming
  panes (its last) and no other seller appears, it is reported as "no (accumulating
  panes)".
* **"no (unfired last panes)"**, Q3: its `Repeatedly(AfterCount(30))` panes fire each
  time 30 more elements of a seller have arrived, with all that arrived; in batch all of
  a seller's elements arrive at once and fire as one pane. In streaming what arrived
  after a seller's last firing (fewer than 30 elements) is never fired, as the global
  window never ends. The verdict holds when the output has no pair outside the batch
  output and no duplicate, and each seller lacks either fewer than 30 of its auctions
  or all of them (its person arrived after its last pane; the join holds auctions until
  their person comes).
"""


def _cells(row: Row) -> list[str]:
    return [f'Q{row.query}', row.runner, str(row.events), f'{row.wall_s:.2f}',
            f'{row.events_per_s:.0f}' if row.events_per_s else '-',
            str(row.output_count), row.equal]


def format_table(rows: Sequence[Row]) -> str:
    """The results as an aligned plain-text table."""
    table = [list(COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    out = ['  '.join(c.ljust(w) for c, w in zip(line, widths, strict=True))
           .rstrip() for line in table]
    out.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(out)


def markdown_table(rows: Sequence[Row]) -> str:
    """The results as a Markdown table."""
    lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
    for row in rows:
        cells = [c.replace('|', '\\|') for c in _cells(row)]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def write_csv(path: str, rows: Sequence[Row]) -> None:
    import csv
    with open(path, 'w', newline='', encoding='utf-8') as f:
        writer = csv.writer(f)
        writer.writerow(['query', 'runner', 'events', 'wall_s', 'events_per_s',
                         'output_count', 'equal_to_reference', 'note'])
        for r in rows:
            writer.writerow([r.query, r.runner, r.events, r.wall_s, r.events_per_s,
                             r.output_count, r.equal, r.note])


def write_plot(path: str, rows: Sequence[Row]) -> None:
    """Grouped bar chart of events/s per query per runner, log scale (failed: no bar)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    queries = sorted({r.query for r in rows})
    runners = list(dict.fromkeys(r.runner for r in rows))
    rate = {(r.query, r.runner): r.events_per_s for r in rows}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(queries) + 2), 4.5))
    # Each query groups only the runners that ran it (Q4/Q9 have another reference).
    present = {q: [r for r in runners if (q, r) in rate] for q in queries}
    width = 0.8 / max(1, max(len(v) for v in present.values()))
    for runner in runners:
        xs, ys = [], []
        for q in queries:
            if runner in present[q]:
                i, n = present[q].index(runner), len(present[q])
                xs.append(q + (i - (n - 1) / 2) * width)
                ys.append(rate[(q, runner)] or float('nan'))
        ax.bar(xs, ys, width=width, label=runner)
    ax.set_yscale('log')
    ax.set_xticks(queries)
    ax.set_xticklabels([f'Q{q}' for q in queries])
    ax.set_ylabel('events/s (wall time incl. start-up)')
    events = sorted({r.events for r in rows})
    ax.set_title(f'NEXMark, {", ".join(map(str, events))} events (missing bar = failed)')
    ax.legend()
    ax.grid(axis='y', which='both', alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def environment() -> dict[str, str]:
    """Date, versions and cores for the report."""
    import datetime
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return 'not installed'

    return {
        'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        'Apache Beam': version('apache-beam'),
        'PySpark': version('pyspark'),
        'Python': platform.python_version(),
        'machine': f'{platform.machine()}, {os.cpu_count()} cores, {platform.system()}',
    }


def write_report(out_dir: str, rows: Sequence[Row], command: str,
                 mode: str = 'batch') -> None:
    """Write `results.csv`, `report.md` and `nexmark.png` into `out_dir`."""
    write_csv(os.path.join(out_dir, 'results.csv'), rows)
    write_plot(os.path.join(out_dir, 'nexmark.png'), rows)
    env = environment()
    findings = [f'* Q{r.query} on {r.runner}: {r.equal}' + (f' -- {r.note}' if r.note else '')
                for r in rows if r.note or r.equal.startswith(('no', 'failed'))]
    text = ['# NEXMark results', '']
    text += [f'* {k}: {v}' for k, v in env.items()]
    text += [f'* mode: {mode}']
    notes = NOTES + (STREAMING_NOTES if mode.startswith('streaming') else '')
    text += ['', 'Command:', '', '```', command, '```', '', markdown_table(rows), '',
             '![events/s per query](nexmark.png)', '', '## Notes', '', notes, '## Findings', '']
    text += findings or ['* every query equal to its reference']
    with open(os.path.join(out_dir, 'report.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(text) + '\n')
