"""A burst published with no subscription, then read from earliest by a reader: retention must
not delete it under the reader (the benchmark user's stall of issue 31).

Pulsar keeps the burst because a ledger younger than ``managedLedgerMinLedgerRolloverTimeMinutes``
(10 by default) is not rolled however full, and the ledger being written is never trimmed;
retention with no durable cursor counts every *closed* ledger as consumed, and a reader's
non-durable cursor alone holds nothing. The test scales the burst down (entry limit 200, 1,200
messages: six ledgers' worth) and runs retention every second; with the minimum at 0 the same
sequence loses the first ledgers, which shows the test can fail.
"""

from __future__ import annotations

import time

import pytest
from broker.conftest import BrokerProcess, make_client  # tests/ is on sys.path

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

PER_LEDGER, MESSAGES = 200, 1200


def publish_then_read(tmp_path, minimum: str) -> tuple[list, list]:
    broker = BrokerProcess(
        tmp_path / "data",
        {
            "managedLedgerMaxEntriesPerLedger": str(PER_LEDGER),
            "managedLedgerMinLedgerRolloverTimeMinutes": minimum,
            "retentionCheckIntervalInSeconds": "1",
            "managedLedgerSyncData": "false",
        },
    )
    broker.start()
    client = make_client(broker.url)
    try:
        topic = f"persistent://public/default/burst-{minimum}"
        producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        sent = []
        for i in range(MESSAGES):
            producer.send_async(b"m%05d" % i, lambda res, mid: sent.append((res, mid)))
        producer.flush()
        assert all(res == pulsar.Result.Ok for res, _ in sent)
        time.sleep(2.5)  # two retention checks pass before the reader arrives
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while True:
            try:
                got.append(reader.read_next(2000).data())
            except pulsar.Timeout:
                break
        return [mid for _, mid in sent], got
    finally:
        client.close()
        broker.stop()


def test_a_young_burst_stays_in_one_ledger_and_the_reader_gets_it_all(tmp_path):
    sent, got = publish_then_read(tmp_path, "10")
    assert len(sent) == MESSAGES
    assert len({(m.ledger_id()) for m in sent}) == 1  # however full, the young ledger did not roll
    assert got == [b"m%05d" % i for i in range(MESSAGES)]


def test_with_no_minimum_retention_trims_the_closed_ledgers_of_a_topic_without_subscription(tmp_path):
    sent, got = publish_then_read(tmp_path, "0")
    assert len({m.ledger_id() for m in sent}) >= 2  # rolled (a group of appends shares one check)
    # the closed ledgers went (the full last one too: the broker's timer rolls it), as Pulsar's
    # rule with no durable cursor has it
    assert len(got) < MESSAGES
    assert got == [b"m%05d" % i for i in range(MESSAGES - len(got), MESSAGES)]
