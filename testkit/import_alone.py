"""Import each named module as the first of its package in a process of its own, cheaply.

``python -m testkit.import_alone PACKAGE MODULE...`` imports the heavy third-party libraries the
package uses (pyarrow, pyspark, deltalake, ...) once, checks that nothing of ``PACKAGE`` is
loaded yet, then forks a child per module that imports it and exits: each module is the first
of ``PACKAGE`` its process imports, which is what an import cycle hidden from the static check
(testkit/layers.py) trips on.  A fresh interpreter per module did the same but imported those
libraries again for every module that uses them: 46-63 s of a test run's CPU for some 250
modules, against a few seconds here.  The libraries are not the package's own code, so loading
them first hides nothing the check is for.

Prints one line per module that failed (``FAILED <module>``, then its traceback) and exits 1
if any did.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

# Loaded before the fork when installed (each is optional: the package's extras).
PRELOAD = ("pyarrow", "pyarrow.parquet", "pyarrow.dataset", "pyspark.sql", "deltalake", "pyiceberg.catalog",
           "pyiceberg.table", "click", "rich.console", "prometheus_client", "pluggy", "psutil", "lz4.frame",
           "zstandard", "cramjam", "msgspec", "orjson", "opentelemetry.sdk.trace", "google.protobuf")


def _child(module: str, out: int) -> None:
    code = 0
    try:
        importlib.import_module(module)
    except BaseException:
        os.write(out, traceback.format_exc().encode())
        code = 1
    os._exit(code)


def main(package: str, names: list[str]) -> int:
    for lib in PRELOAD:
        try:
            importlib.import_module(lib)
        except ImportError:
            pass
    early = sorted(m for m in sys.modules if m == package or m.startswith(package + "."))
    if early:
        print(f"FAILED (preload) the libraries loaded {early}: not alone any more", flush=True)
        return 1
    failed = 0
    for module in names:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _child(module, write)
        os.close(write)
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
        os.close(read)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            failed += 1
            print(f"FAILED {module}\n{b''.join(chunks).decode(errors='replace')[-2000:]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
