"""The stall run of testkit/stall/run.py, reduced: 60,000 records and a 20 s stall per sink fault.

Each fault must really have taken the sink away (each worker logged "sink unavailable" and,
once it was back, "sink available again", as often), the workers must have waited as invariant
27 says (nothing fetched once every worker had paused, nothing rewound and read again, nothing
delivered before the sink came back), every worker's RSS must have stayed within the default
budget (``[daemon] memory_budget_mb``) during the stall and the recovery, and the output must
hold every produced (partition, offset) exactly once.  Nothing here is timed: how long the
recovery took, and the CPU-seconds of the stall, are figures of the full run
(``testkit/stall/run.py``, two million records and ten minutes; docs/RELIABILITY.md), not assertions.
"""

from __future__ import annotations

import pytest

from testkit.stall.run import BUDGET_MB, StallOptions, print_result, run_stall

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# Enough that records still wait when the workers pause (the Spark scenarios flush at 20,000
# records a worker: testkit/stall/faults.py SPARK_BATCH), so "nothing polled while paused" is
# about records that were there to poll.
RECORDS = 60_000
STALL_S = 20.0


@pytest.mark.parametrize("fault", [
    "jsonl-unwritable",
    pytest.param("spark-uploader-killed", marks=pytest.mark.spark),
    pytest.param("spark-master-down", marks=pytest.mark.spark),
])
def test_stall_reduced(kafka, tmp_path, fault):
    if fault.startswith("spark"):
        from testkit.spark import requires_spark
        requires_spark()
    result = run_stall(StallOptions(fault=fault, records=RECORDS, stall_s=STALL_S, workdir=tmp_path,
                                    bootstrap=kafka.bootstrap))
    print_result(result)
    v, f = result.verdict, result.figures
    assert not result.errors, result.errors

    # The sink was away, for every worker, and came back once for each.
    logged = {i: w["logged"] for i, w in f["per_worker"].items()}
    assert sorted(logged) == [0, 1], logged
    for i, n in logged.items():
        assert n["unavailable"] >= 1, (i, n)
        assert n["available_again"] == n["unavailable"], (i, n)
        # Held, not rewound: no batch was dropped and read (or staged) again.
        assert n["rewinding"] == 0 and n["rebuilt"] == 0, (i, n)
    assert f["records_in_sink_at_heal"] == 0, f
    paused = f["fetched_while_paused"]
    assert "error" not in paused, paused
    assert paused["records_unpolled_at_pause"] > 0, paused
    assert paused["records"] == 0 and paused["bytes"] == 0, paused
    assert paused["sink_down_workers_at_heal"] == 2, paused

    if fault == "jsonl-unwritable":
        assert "Permission denied" in f["fault"]["preflight_refusal"], f["fault"]
        assert "Permission denied" in f["first_unavailable_line"], f["first_unavailable_line"]
    elif fault == "spark-uploader-killed":
        assert f["fault"]["uploader_kills"] >= 1, f["fault"]
        assert f["uploader_starts_logged"] >= f["fault"]["uploader_kills"] + 1, f
    else:
        assert f["fault"]["recovered_by"].startswith("the standalone master returning"), f["fault"]

    peaks = {i: (w["rss_mb_peak_stall"], w["rss_mb_peak_recovery"]) for i, w in f["per_worker"].items()}
    assert all(p is not None and p <= BUDGET_MB for pair in peaks.values() for p in pair), (BUDGET_MB, peaks)

    assert (v["lost"], v["duplicates"], v["unknown_delivered"]) == (0, 0, 0), v["examples"]
    assert v["produced"] == v["delivered_distinct"] == RECORDS, v
    assert result.ok
