"""The tests a failed ``make test`` recorded, as node ids a plain ``pytest`` run selects: what
``.ci/run`` runs again, alone in one process.

Why not ``pytest --last-failed``: under ``--dist loadgroup`` pytest-xdist records a test of an
``xdist_group`` under its node id with ``@<group>`` appended (``test_x.py::test_y@lane-slow``).  A
run without xdist collects ``test_x.py::test_y``, finds none of the recorded ids among its tests,
and ``--last-failed`` then runs *every* test: CI once spent 3,300 s re-running the whole suite
serially after one flaky failure.  Here the suffix is taken off and the ids are named
explicitly, so an id that no longer exists is an error, never the whole suite.

``python -m testkit.rerun [CACHE_DIR]`` prints them one per line (none: nothing recorded).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# ``@<group>`` at the end of an id; a group name has no brackets, slashes or colons.
_GROUP = re.compile(r"@[^\[\]@/:]+$")


def plain_id(nodeid: str) -> str:
    """``nodeid`` without the ``@<xdist group>`` that ``--dist loadgroup`` appends."""
    return _GROUP.sub("", nodeid)


def failed_tests(cache_dir: str | Path = ".pytest_cache") -> list[str]:
    """The node ids the last run recorded as failed (its ``cache/lastfailed``), sorted, without
    their xdist group: [] when it recorded none."""
    path = Path(cache_dir) / "v" / "cache" / "lastfailed"
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    return sorted({plain_id(nodeid) for nodeid, failed in recorded.items() if failed})


if __name__ == "__main__":
    print("\n".join(failed_tests(*sys.argv[1:2])))
