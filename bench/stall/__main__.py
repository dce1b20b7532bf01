"""The stall run (testkit/stall/run.py): a sink away for ten minutes, two million records
waiting; memory, CPU, recovery.  Run from the repository root::

    python bench/stall --sink-fault jsonl-unwritable --json jsonl.json
    python bench/stall --sink-fault spark-master-down --json master.json
    python bench/stall --sink-fault spark-uploader-killed --json uploader.json

``--help`` lists the options.  The exit code is ``testkit.stall.run.main``'s: 0 when the verdict
holds, 1 when it does not.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: testkit and kdaemon from this tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from testkit.stall.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
