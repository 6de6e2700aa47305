"""The checkpoint ledger's commit records and the machine's journal of them."""

from __future__ import annotations

import threading

from beam_streams_runner.regions.commit_records import CheckpointLedger, CommitRecord
from beam_streams_runner.stores.memory import MemoryStore


def test_regions_committing_at_once_keep_the_newest_id_in_the_journal(tmp_path,
                                                                      monkeypatch):
    """The regions of one job write their commit records from threads of their own, each
    time to the same journal; none of those writes may fail or lose the newest id."""
    monkeypatch.setenv('BEAM_STREAMS_RUNNER_HOME', str(tmp_path))
    store = MemoryStore()
    ledgers = [CheckpointLedger(store, 'job', 'memory') for _ in range(4)]
    errors = []

    def commit(ledger: CheckpointLedger, region: str) -> None:
        try:
            for sequence_id in range(1, 201):
                ledger.write(region, CommitRecord(sequence_id, sequence_id, {}))
        except Exception as e:  # noqa: BLE001 - any failure of a writer fails the test
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(ledger, f'r{i}'))
               for i, ledger in enumerate(ledgers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert ledgers[0]._journal_sequence() == 200
    assert [p.name for p in (tmp_path / 'journal').iterdir()] == [
        ledgers[0]._journal.rsplit('/', 1)[1]]  # no temporary file is left behind
    ledgers[0].delete_job()
    assert ledgers[0]._journal_sequence() == 0
