"""Naming unknown keys with the known key they most likely meant: one wording for every table
(``[daemon]``, ``[kafka]``, a sink's settings, ...), so ``check-config`` says "did you mean" the
same way everywhere.  A leaf: it imports nothing from kdaemon."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """" (did you mean 'path'?)" when a known key is close to ``key``, else ""."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_keys(unknown: Iterable[str], known: Iterable[str]) -> str:
    """"colour, pth (did you mean 'path'?)": the unknown keys, sorted, each with its guess."""
    known = list(known)
    return ", ".join(k + did_you_mean(k, known) for k in sorted(unknown))
