"""A daemon in share mode (``[kafka] group_type = "share"``) for the tests: its configuration,
and the plugins a test puts on its PYTHONPATH.

``share_daemon_config`` is ``testkit.daemon.daemon_config`` for a share group: the consumer-
group options a share group refuses (``auto_offset_reset``, the session and heartbeat) are left
out, and the group's own settings go in ``[share]``, which worker 0 sets when it starts (a test
needs ``auto_offset_reset = "earliest"`` to read what it produced before the group existed, and
a lock of a second or two to see a killed member's records come back within seconds; the shared
broker allows locks from 1 s: testkit/apache_kafka.py).

``plugin_dir`` makes a directory kdaemon finds plugins in exactly as installed ones (a
dist-info whose ``entry_points.txt`` names them), from modules under tests/.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from testkit.daemon import daemon_config

# Options of testkit.daemon.daemon_config's [kafka] that a share group refuses.
_CONSUMER_GROUP_ONLY = ("auto_offset_reset", "session_timeout_ms", "heartbeat_interval_ms")


def share_daemon_config(root: Path, bootstrap: str, topic: str, group: str, *, workers: int = 2,
                        share: Mapping | None = None, filters: list | None = None, **daemon) -> dict:
    config = daemon_config(root, bootstrap, topic, group, workers=workers, filters=filters, **daemon)
    kafka = config["kafka"]
    for key in _CONSUMER_GROUP_ONLY:
        kafka.pop(key, None)
    kafka["group_type"] = "share"
    config["share"] = {"auto_offset_reset": "earliest", **(share or {})}
    return config


def plugin_dir(root: Path, modules: Mapping[str, Path]) -> Path:
    """``root`` holding each module file (entry point name -> file) and a dist-info naming them
    as ``kdaemon`` entry points; put ``root`` on the daemon's PYTHONPATH."""
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, source in modules.items():
        shutil.copy(source, root / source.name)
        lines.append(f"{name} = {source.stem}")
    dist = root / "kd_test_plugins-0.1.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kd-test-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[kdaemon]\n" + "\n".join(lines) + "\n")
    return root
