"""The chaos run of testkit/chaos/run.py, reduced: 30,000 records over 75 s with every fault kind,
into the jsonl sink under both group protocols and into the Spark sink.

A worker is SIGKILLed every 10 s, a partition leader's broker is killed and restarted, the
group coordinator's broker is killed once, the sink refuses every write for 20 s and the
daemon's connections are cut through the proxy; then the delivered (topic, partition, offset)
set must be exactly produced - filtered - aborted: nothing lost, nothing twice, no record of
an aborted transaction and none the header rule drops.  (A worker SIGKILLed between a flush and
its commit leaves records its successor consumes again; the jsonl sink's dedupe recognises them
and writes them once, the Spark uploader's manifests likewise.)  With the Spark sink the
uploader is SIGKILLed twice as well, and the verdict reads the output back with Spark.  The
full run (a million records) is ``testkit/chaos/run.py``; its latest figures are in
docs/RELIABILITY.md.

Each fault kind must really have happened (counted by the run), else the test proves nothing.
"""

from __future__ import annotations

import pytest

from testkit.chaos.faults import KINDS
from testkit.chaos.run import ChaosOptions, print_result, run_chaos
from testkit.apache_kafka import KafkaUnavailable

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RECORDS = 30_000
DURATION_S = 75.0


@pytest.mark.parametrize("group_protocol,sink", [
    ("classic", "jsonl"), ("consumer", "jsonl"),
    pytest.param("consumer", "spark", marks=pytest.mark.spark)])
def test_chaos_reduced(tmp_path, group_protocol, sink):
    if sink == "spark":
        from testkit.spark import requires_spark
        requires_spark()
    # The uploader is killed early and late: a restart takes about 25 s here, and in 75 s the
    # default times (a quarter, two thirds) leave the sink down through the whole sink-failure
    # window, so no write would meet the refusal.
    opts = ChaosOptions(records=RECORDS, duration_s=DURATION_S, workdir=tmp_path,
                        group_protocol=group_protocol, coordinator_at=0, sink=sink,
                        uploader_kills_at=(0.05, 0.8))
    try:
        result = run_chaos(opts)
    except KafkaUnavailable as exc:
        pytest.fail(f"Apache Kafka cannot start here: {exc}", pytrace=False)
    print_result(result)
    v, f = result.verdict, result.figures
    assert not result.errors, result.errors
    assert v["produced"] >= RECORDS and v["kept"] > 0 and v["filtered"] > 0 and v["aborted"] > 0, v
    kinds = [k for k in KINDS if sink == "spark" or k != "uploader_kill"]
    injected = {kind: f["faults"][kind]["injected"] for kind in kinds}
    assert all(n >= 1 for n in injected.values()), f"a fault kind never happened: {injected}"
    if sink == "spark":
        assert injected["uploader_kill"] == 2 and f["uploader_starts_logged"] >= 3, f
    assert f["worker_restarts"] >= injected["worker_kill"] - 1, f
    assert f["proxy_cuts"] >= 1 and f["sink_refusals"] >= 1, f
    assert (v["lost"], v["duplicates"], v["aborted_delivered"], v["filtered_delivered"], v["unknown_delivered"]) == (
        0, 0, 0, 0, 0), v["examples"]
    assert result.ok
