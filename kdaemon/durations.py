"""How long, in a log line or a STATUS= line: ``4.2s``, ``42s``, ``3m05s``, ``2h07m``.

A leaf module (it imports nothing from kdaemon): the worker, the supervisor and the Spark
uploader all word a stall's length with it, so their lines read alike.
"""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: how long, for a log line."""
    s = int(seconds)
    if s < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
