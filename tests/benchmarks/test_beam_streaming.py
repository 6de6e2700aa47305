"""This runner's side of the streaming comparison (`benchmarks.nexmark.beam_streaming`,
over `benchmarks.nexmark.file_stream_source`).

* Q0, Q3, Q5, Q7 through the program's `main` on the test session's SparkSession, with
  consistent regions on (Q0 also off): its records, turned into canonical lines by
  `native.flink_record_line`, pass `verdicts.equality_verdict` (streaming) against Beam's
  batch run on the DirectRunner over the same events; the summary counts every event.
* The ready-file mode: `stream_files.feed` writes the events once the source wrote the
  ready file; every record has a finite latency.
* The source's restriction: cut anywhere (a runner's checkpoint after any element, or
  any position at all) and resumed, every event is read exactly once, in order, the
  sentinel never; the watermark ends at +inf.
* A record's line is the element's `capture.output_line`; bad input is refused.
"""

from __future__ import annotations

import json
import math
import os
import random

import pytest
from apache_beam.runners.sdf_utils import RestrictionTrackerView, ThreadsafeRestrictionTracker
from apache_beam.testing.benchmarks.nexmark.models.nexmark_model import Auction, Bid
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from benchmarks.nexmark import beam_streaming, file_stream_source, stream_files
from benchmarks.nexmark.capture import output_line
from benchmarks.nexmark.config import NexmarkConfig
from benchmarks.nexmark.generator import event_at, wallclock_order
from benchmarks.nexmark.native import flink_record_line
from benchmarks.sweep import nexmark_latency_config
from tests.benchmarks.stream_checks import (
    assert_records_equal_batch,
    config_args,
    start_feeder,
)

# Q3 needs ~30,000 events for a seller to reach its 30-element pane. At 1,000 events/s
# the others span a few seconds: several 2-s windows (slid by 1 s for Q5).
CONFIGS = {
    0: NexmarkConfig(num_events=2000),
    3: NexmarkConfig(num_events=30_000),
    5: NexmarkConfig(num_events=3000, first_event_rate=1000, next_event_rate=1000,
                     window_size_sec=2, window_period_sec=1, out_of_order_group_size=7),
    7: NexmarkConfig(num_events=3000, first_event_rate=1000, next_event_rate=1000,
                     window_size_sec=2),
    # Persons and the auctions they open in the same 2-s window (Q8's join).
    8: NexmarkConfig(num_events=4000, first_event_rate=1000, next_event_rate=1000,
                     window_size_sec=2),
}
def run_program(query: int, config: NexmarkConfig, events_dir: str, out_dir,
                *extra: str) -> tuple[int, list[dict], dict]:
    records, summary = str(out_dir / f'q{query}.jsonl'), str(out_dir / f'q{query}.json')
    status = beam_streaming.main([
        f'--query={query}', f'--events_dir={events_dir}', f'--records={records}',
        f'--summary={summary}', *extra, *config_args(config)])
    with open(summary, encoding='utf-8') as f:
        summary_fields = json.load(f)
    return status, stream_files.read_records(records), summary_fields


@pytest.mark.parametrize('query', [0, 3, 5, 7, 8])
def test_query_with_checkpoints_equals_the_batch_reference(query, spark_session, tmp_path):
    config = CONFIGS[query]
    events_dir = str(tmp_path / 'events')
    stream_files.write_event_files(config, events_dir, events_per_file=700)
    status, records, summary = run_program(
        query, config, events_dir, tmp_path, f'--checkpoint_dir={tmp_path / "ckpt"}',
        '--checkpoint_period_s=0.5')
    assert status == 0, summary
    assert summary['events'] == config.num_events
    assert summary['wall_s'] > 0 and summary['setup_s'] >= 0
    assert isinstance(summary['checkpoints'], int)
    assert_records_equal_batch(query, records, config)


def test_q0_without_checkpoints_equals_the_batch_reference(spark_session, tmp_path):
    config = CONFIGS[0]
    events_dir = str(tmp_path / 'events')
    stream_files.write_event_files(config, events_dir, events_per_file=300)
    status, records, summary = run_program(0, config, events_dir, tmp_path)
    assert status == 0, summary
    assert 'checkpoints' not in summary and summary['events'] == config.num_events
    assert_records_equal_batch(0, records, config)


def test_ready_file_mode_reads_a_fed_directory(spark_session, tmp_path):
    rate = 1000.0
    config = nexmark_latency_config(NexmarkConfig(num_events=3000), rate)
    events_dir, ready = tmp_path / 'events', str(tmp_path / 'ready')
    events_dir.mkdir()
    thread, fed = start_feeder(config, str(events_dir), ready, rate)
    status, records, summary = run_program(0, config, str(events_dir), tmp_path,
                                          f'--ready_file={ready}')
    thread.join(timeout=60)
    assert status == 0, summary
    assert fed and fed[0].num_events == config.num_events
    records = stream_files.read_records(str(tmp_path / 'q0.jsonl'))
    latencies = [stream_files.latency_s(r) for r in records]
    assert len(latencies) == config.num_events
    assert all(x is not None and math.isfinite(x) for x in latencies)
    assert_records_equal_batch(0, records, config)


# ---------------------------------------------------------------- the restriction


def _drive(fn, element, restriction, cut_after: int | None):
    """One `process` call over `restriction`, as the SDK harness makes it; with
    `cut_after`, a runner checkpoint (`try_split(0)`) right after that many outputs.
    Returns (events, residual restriction or None, the estimator)."""
    tracker = ThreadsafeRestrictionTracker(fn.create_tracker(restriction))
    estimator = fn.create_watermark_estimator(fn.initial_estimator_state(element, None))
    events, residual = [], None
    for value in fn.process(element, tracker=RestrictionTrackerView(tracker),
                            watermark_estimator=estimator):
        events.append(value)
        if cut_after is not None and len(events) == cut_after:
            split = tracker.try_split(0)
            residual = split[1] if split else None
    deferred = tracker.deferred_status()
    if deferred is not None:
        residual = deferred[0]
    tracker.check_done()
    return events, residual, estimator


def _read_part(fn, element, restriction, rng: random.Random) -> tuple[list, object]:
    """Every event of a part's restriction, resumed after random runner checkpoints."""
    events, estimator = [], None
    while restriction is not None:
        cut = rng.choice([None, 1, 2, 5, 40])
        got, restriction, estimator = _drive(fn, element, restriction, cut)
        events.extend(got)
        if restriction is not None and restriction.start >= restriction.stop:
            restriction = None
    return events, estimator


def _expected(config: NexmarkConfig, part: int, parts: int, per_file: int) -> list:
    ordered = [event_at(config, n) for n in wallclock_order(config)]
    return [(vars(e.event), e.timestamp) for i, e in enumerate(ordered)
            if (i // per_file) % parts == part]


@pytest.fixture(scope='module')
def small_dir(tmp_path_factory):
    config = NexmarkConfig(num_events=500, out_of_order_group_size=5)
    directory = str(tmp_path_factory.mktemp('events'))
    stream_files.write_event_files(config, directory, events_per_file=37)
    return config, directory


@pytest.mark.parametrize('seed', range(3))
def test_a_part_resumed_after_any_checkpoint_reads_each_event_once(small_dir, seed):
    config, directory = small_dir
    fn = file_stream_source.EventFilesFn(directory, config)
    for part in range(2):
        element = (part, 2)
        events, estimator = _read_part(fn, element, fn.initial_restriction(element),
                                       random.Random(seed))
        got = [(vars(v.value), v.timestamp) for v in events]
        assert got == _expected(config, part, 2, 37)
        assert estimator.current_watermark() == MAX_TIMESTAMP


def test_a_restriction_cut_at_any_position_splits_the_lines_exactly(small_dir):
    config, directory = small_dir
    fn = file_stream_source.EventFilesFn(directory, config)
    element = (1, 2)
    whole, _ = _read_part(fn, element, fn.initial_restriction(element), random.Random(0))
    rng = random.Random(1)
    stride = file_stream_source.FILE_STRIDE
    cuts = [0, 1, stride - 1, stride, stride + 1] + [
        rng.randrange(7) * stride + rng.randrange(12_000) for _ in range(30)]
    for cut in cuts:
        first, _ = _read_part(fn, element, file_stream_source.OffsetRange(0, cut), rng)
        rest, _ = _read_part(
            fn, element, file_stream_source.OffsetRange(cut, file_stream_source.END_POSITION),
            rng)
        assert [vars(v.value) for v in first + rest] == [vars(v.value) for v in whole], cut


def test_a_part_waiting_for_its_next_file_defers_without_output(tmp_path):
    config = NexmarkConfig(num_events=100)
    fn = file_stream_source.EventFilesFn(str(tmp_path), config,
                                         started_dir=str(tmp_path), ready_file=str(
                                             tmp_path / 'ready'))
    events, residual, estimator = _drive(fn, (0, 2), fn.initial_restriction((0, 2)), None)
    assert events == [] and residual.start == 0
    assert os.path.exists(tmp_path / 'ready')
    assert file_stream_source.started_time(str(tmp_path)) is not None
    assert estimator.current_watermark() < MAX_TIMESTAMP


# ---------------------------------------------------------------- records, input


def test_records_give_back_the_canonical_lines():
    bid = Bid(1, 2, 300, Timestamp(micros=1_500_000), 'x')
    auction = Auction(5, 'item', 'd', 10, 20, Timestamp(micros=1_000_000),
                      Timestamp(micros=9_000_000), 7, 10, 'e')
    window = IntervalWindow(Timestamp(0), Timestamp(2))
    end = Timestamp(micros=window.max_timestamp().micros // 1000 * 1000)
    glob_end = Timestamp(micros=GlobalWindow().max_timestamp().micros // 1000 * 1000)
    cases = [(bid, GlobalWindow(), bid.date_time), (auction, GlobalWindow(), auction.date_time),
             ({'auction_id': 5, 'num': 3}, window, end),
             ({'name': 'n', 'city': 'c', 'state': 'OR', 'auction_id': 9}, GlobalWindow(),
              glob_end),
             (bid, window, bid.date_time)]
    for element, w, ts in cases:
        record = json.loads(json.dumps(beam_streaming.output_record(element, w, ts, 1.0)))
        assert flink_record_line(record) == output_line(element, w, ts)
    assert beam_streaming.output_record(cases[2][0], window, end, 1.0)['timestamp'] == 'end'
    with pytest.raises(TypeError, match='only NEXMark model objects and dicts'):
        beam_streaming.output_record((1, 2), GlobalWindow(), Timestamp(0), 1.0)


def test_bad_input_is_refused_with_what_to_do(tmp_path, capsys):
    base = [f'--records={tmp_path / "r"}', f'--summary={tmp_path / "s"}']
    with pytest.raises(SystemExit):
        beam_streaming.main(['--query=0', f'--events_dir={tmp_path / "none"}', *base])
    assert 'write the events first' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        beam_streaming.main(['--query=0', f'--events_dir={tmp_path}',
                             f'--checkpoint_dir={tmp_path}', *base])
    assert 'go together' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        beam_streaming.main(['--query=4', f'--events_dir={tmp_path}', *base])
