"""Run a command on a pseudo-terminal, as a person at a terminal would, and keep all it wrote.

The commands draw with rich only when stdout is a terminal (``kdaemon/cli/progress.py``), so
what a pipe gets says nothing about the live display; this is how the tests see it."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_on_pty(argv: list[str], cwd: Path, timeout: float, columns: int = 200) -> tuple[int, str]:
    """(exit code, everything written to the terminal); AssertionError if it runs past
    ``timeout`` (then it is killed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns)}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env,
                            start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError(f"{argv} ran past {timeout} s; it wrote:\n"
                                     + b"".join(chunks).decode(errors="replace")[-3000:])
            readable, _, _ = select.select([master], [], [], 0.5)
            if not readable:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:   # EIO: every holder of the terminal's other side has closed it
                break
            if not data:
                break
            chunks.append(data)
        return proc.wait(max(1.0, deadline - time.monotonic())), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)


def plain(text: str) -> str:
    """``text`` without its control sequences and carriage returns."""
    return ANSI.sub("", text).replace("\r", "")
