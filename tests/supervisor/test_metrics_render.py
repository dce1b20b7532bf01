"""The supervisor's /metrics page while a worker is creating its metrics file.

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
    body, ctype = metrics.render()
    sys.stdout.write(body.decode())
""")


def test_a_scrape_skips_a_metrics_file_a_worker_has_only_just_created(tmp_path: Path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "kdaemon_test_records_total 7.0" in out.stdout, out.stdout
