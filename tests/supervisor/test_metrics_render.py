"""The supervisor's /metrics page while a worker is creating its metrics file, and in the format
the scraper asks for.

prometheus_client creates a process's file empty and sizes it a moment later; a scrape in
between raised ``struct.error`` from inside the supervisor's loop and took the daemon down (the
chaos run caught it as a worker started).  Run in a child interpreter: the multiprocess mode is
chosen from PROMETHEUS_MULTIPROC_DIR when prometheus_client is first imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import os, sys
    from prometheus_client import Counter
    Counter("kdaemon_test_records_total", "records").inc(7)     # this process's file, complete
    open(os.path.join(sys.argv[1], "counter_424242.db"), "wb").close()   # a worker's, just created
    from kdaemon.supervisor import metrics
    body, ctype = metrics.render(sys.argv[2] if len(sys.argv) > 2 else "")
    sys.stdout.write(ctype + "\\n" + body.decode())
""")


def _render(tmp_path: Path, *accept: str) -> tuple[str, str]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), *accept], env=env, capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    ctype, _, body = out.stdout.partition("\n")
    return ctype, body


def test_a_scrape_skips_a_metrics_file_a_worker_has_only_just_created(tmp_path: Path):
    ctype, body = _render(tmp_path)
    assert "kdaemon_test_records_total 7.0" in body, body
    assert ctype.startswith("text/plain; version=0.0.4"), ctype


def test_openmetrics_when_the_scraper_asks_for_it(tmp_path: Path):
    """Prometheus asks for OpenMetrics first in its Accept header; the page follows it, as
    prometheus_client's own server does (``choose_encoder``)."""
    ctype, body = _render(tmp_path, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
    assert ctype.startswith("application/openmetrics-text; version=1.0.0"), ctype
    assert "kdaemon_test_records_total 7.0" in body and body.endswith("# EOF\n"), body


SHARE_SCRIPT = textwrap.dedent("""
    import sys
    from types import MappingProxyType
    from kdaemon.client.metrics import ShareConsumerMetrics
    from kdaemon.worker.metrics import WorkerMetrics
    WorkerMetrics().update_share(ShareConsumerMetrics(12, 3, MappingProxyType(
        {"accept": 7, "release": 3, "reject": 1, "renew": 2}), 1, 2))
    from kdaemon.supervisor import metrics
    sys.stdout.write(metrics.render()[0].decode())
""")


def test_a_share_workers_counters_reach_the_page(tmp_path: Path):
    """A share worker's counters (WorkerMetrics.update_share) as the supervisor serves them,
    through the multiprocess files like every worker metric."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", SHARE_SCRIPT], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    page = set(out.stdout.splitlines())
    assert {"kdaemon_share_records_acquired_total 12.0", "kdaemon_share_records_redelivered_total 3.0",
            'kdaemon_share_records_acknowledged_total{type="accept"} 7.0',
            'kdaemon_share_records_acknowledged_total{type="release"} 3.0',
            'kdaemon_share_records_acknowledged_total{type="reject"} 1.0',
            'kdaemon_share_records_acknowledged_total{type="renew"} 2.0',
            "kdaemon_share_acknowledge_errors_total 1.0", "kdaemon_share_lock_expiries_total 2.0"} <= page, out.stdout
