"""The consistent-region controller's log of a reset: when the failed epoch reached it,
and when every member was back at the cut (design section 12).

The checkpoint benchmark splits a recovery into detection, reset and catch-up by the
times of these two lines; a fake ledger and member stand in for the store and the
driver's state, so no Spark runs.
"""

from __future__ import annotations

import logging

from beam_streams_runner.regions.commit_records import CommitRecord
from beam_streams_runner.regions.controller import ConsistentRegionController
from beam_streams_runner.regions.hooks import MemberBase

LOGGER = 'beam_streams_runner.regions.controller'


class Ledger:
    """The newest record written, as the region's `latest`."""

    def __init__(self) -> None:
        self.records: dict[str, CommitRecord] = {}

    def write(self, region: str, record: CommitRecord) -> None:
        self.records[region] = record

    def latest(self, region: str) -> CommitRecord | None:
        return self.records.get(region)

    def retire(self, region: str, sequence_id: int) -> None:
        pass


class Member(MemberBase):
    name = 'positions'

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def checkpoint(self, sequence_id, stages):
        return sequence_id

    def reset(self, sequence_id, stages, part):
        self.events.append(('reset', sequence_id, part))

    def reset_to_initial_state(self, stages):
        self.events.append(('initial',))


def controller(member: Member) -> ConsistentRegionController:
    return ConsistentRegionController('default', frozenset({'stage-1'}), Ledger(), [member],
                                      period_s=1.0, non_blocking=False, max_reset_attempts=3,
                                      reset_timeout_s=60.0)


def test_a_reset_logs_when_it_starts_and_when_it_is_done(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    member = Member()
    region = controller(member)
    region.cut(4)
    caplog.clear()
    region.reset(RuntimeError('worker lost\nmore detail'))
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert messages[0] == ("Consistent region 'default': resetting after a failed epoch: "
                           'RuntimeError: worker lost')
    assert messages[-1].startswith("Consistent region 'default': reset 1 of 3 to checkpoint 1 "
                                   'after: RuntimeError: worker lost (')
    assert member.events == [('reset', 1, 1)]


def test_a_reset_before_the_first_cut_logs_both_lines_too(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    member = Member()
    controller(member).reset(ValueError('boom'))
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 2 and 'resetting after a failed epoch: ValueError: boom' in messages[0]
    assert 'reset 1 of 3 to checkpoint 0 after: ValueError: boom' in messages[1]
    assert member.events == [('initial',)]
