"""The chaos run (testkit/chaos/run.py): no loss, no duplicates, no aborted record delivered,
while everything breaks.  Run from the repository root::

    python bench/chaos --records 1000000 --duration 600 --json chaos.json
    python bench/chaos --sink spark --records 1000000 --duration 600 --json chaos-spark.json

``--help`` lists the options.  The exit code is ``testkit.chaos.run.main``'s: 0 when the verdict
holds, 1 when it does not, 2 when the options cannot run.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: testkit and kdaemon from this tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from testkit.chaos.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
