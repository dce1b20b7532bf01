"""Two trivial sinks: ``stdout`` (JSON lines, for trying things out and piping) and ``null``
(counts and discards, for benchmarks and dry runs)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from ..plugins.types import Record, SinkWriteError
from ..settings import parse_settings
from .encoding import encode_batch


@dataclass(frozen=True)
class NoSettings:
    """The settings of a sink that takes none: any key but ``type`` is unknown."""


class StdoutSink:
    """One JSON line per record (the format of ``kdaemon.sinks.encoding``) on standard output.

    ``flush()`` flushes the stream; whatever reads the pipe decides what durable means.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream  # None: whatever sys.stdout is at write time (pytest's capsys)
        self.closed = False

    @classmethod
    def from_settings(cls, settings: dict) -> StdoutSink:
        parse_settings(NoSettings, settings, "sink")
        return cls()

    def _out(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def write(self, records: Sequence[Record]) -> None:
        if self.closed:
            raise ValueError("write to a closed stdout sink")
        text, failed = encode_batch(records)
        if text:
            self._out().write(text)
        if failed:
            raise SinkWriteError(f"{len(failed)} record(s) have a key or value JSON cannot hold",
                                 failed)

    def flush(self) -> None:
        self._out().flush()

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.closed = True


class NullSink:
    """Counts what it is given and keeps nothing."""

    def __init__(self) -> None:
        self.records = 0
        self.batches = 0
        self.flushes = 0
        self.closed = False

    @classmethod
    def from_settings(cls, settings: dict) -> NullSink:
        parse_settings(NoSettings, settings, "sink")
        return cls()

    def write(self, records: Sequence[Record]) -> None:
        self.records += len(records)
        self.batches += 1

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True
