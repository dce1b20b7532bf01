"""The chaos run of bench/chaos.py, reduced: 30,000 records over 75 s with every fault kind.

A worker is SIGKILLed every 10 s, a partition leader's broker is killed and restarted, the
group coordinator's broker is killed once, the sink refuses every write for 20 s and the
daemon's connections are cut through the proxy; then the delivered (topic, partition, offset)
set must be exactly produced - filtered - aborted: nothing lost, nothing twice, no record of
an aborted transaction and none the header rule drops.  (A worker SIGKILLed between a flush and
its commit leaves records its successor consumes again; the jsonl sink's dedupe recognises them
and writes them once.)  The full run (a million records)
is ``bench/chaos.py``; its latest figures are in docs/RELIABILITY.md.

Each fault kind must really have happened (counted by the run), else the test proves nothing.
"""

from __future__ import annotations

import pytest

from bench._chaos_faults import KINDS
from bench.chaos import ChaosOptions, print_result, run_chaos
from tests.support.apache_kafka import KafkaUnavailable

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RECORDS = 30_000
DURATION_S = 75.0


@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
def test_chaos_reduced(tmp_path, group_protocol):
    opts = ChaosOptions(records=RECORDS, duration_s=DURATION_S, workdir=tmp_path,
                        group_protocol=group_protocol, coordinator_at=0)
    try:
        result = run_chaos(opts)
    except KafkaUnavailable as exc:
        pytest.fail(f"Apache Kafka cannot start here: {exc}", pytrace=False)
    print_result(result)
    v, f = result.verdict, result.figures
    assert not result.errors, result.errors
    assert v["produced"] >= RECORDS and v["kept"] > 0 and v["filtered"] > 0 and v["aborted"] > 0, v
    injected = {kind: f["faults"][kind]["injected"] for kind in KINDS}
    assert all(n >= 1 for n in injected.values()), f"a fault kind never happened: {injected}"
    assert f["worker_restarts"] >= injected["worker_kill"] - 1, f
    assert f["proxy_cuts"] >= 1 and f["sink_refusals_logged"] >= 1, f
    assert (v["lost"], v["duplicates"], v["aborted_delivered"], v["filtered_delivered"], v["unknown_delivered"]) == (
        0, 0, 0, 0, 0), v["examples"]
    assert result.ok
