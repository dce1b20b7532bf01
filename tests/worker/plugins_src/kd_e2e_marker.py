"""A kdaemon plugin (entry point ``e2e_marker``) whose import leaves a trace: it writes the file
named by ``KD_E2E_MARKER_FILE``.  tests/worker/test_pipeline_e2e.py installs it (a dist-info
on PYTHONPATH) and checks that kdaemon never imports it unless ``plugins`` lists it."""

from __future__ import annotations

import os

from kdaemon.plugins import hookimpl

_MARKER = os.environ.get("KD_E2E_MARKER_FILE")
if _MARKER:
    with open(_MARKER, "a") as f:
        f.write(f"imported by pid {os.getpid()}\n")


@hookimpl
def kdaemon_deserializers():
    return {"e2e_marker": lambda settings: (lambda topic, headers, data: data)}
