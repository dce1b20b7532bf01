"""The jars Spark needs beyond pyspark's own (Delta Lake, Apache Iceberg), staged at install time.

A running daemon never downloads: ``stage(kind)`` resolves a pinned Maven project
(``maven/<kind>.pom.xml`` beside this file: exact versions, chosen to match the installed
pyspark) from Maven Central into ``$KDAEMON_CACHE`` (default ``~/.cache/kdaemon``)
``/spark-jars/<kind>-<digest of the pom>/``, once; ``make install`` and ``make test`` call it
(``python -m kdaemon.sinks.spark.jars delta``).  ``staged_jars(kind)`` is what the uploader puts
on ``spark.jars``; nothing staged is a clear error naming the command, at the uploader's start,
not a download.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

POM_DIR = Path(__file__).with_name("maven")
KINDS = ("delta", "iceberg")


class JarsMissing(Exception):
    """The jars a format needs are not staged (or cannot be)."""


def _pom(kind: str) -> Path:
    if kind not in KINDS:
        raise ValueError(f"no staged jars of kind {kind!r} (known: {', '.join(KINDS)})")
    return POM_DIR / f"{kind}.pom.xml"


def stage_dir(kind: str) -> Path:
    root = Path(os.environ.get("KDAEMON_CACHE") or Path.home() / ".cache" / "kdaemon")
    digest = hashlib.sha256(_pom(kind).read_bytes()).hexdigest()[:12]
    return root / "spark-jars" / f"{kind}-{digest}"


def staged_jars(kind: str) -> list[str]:
    d = stage_dir(kind)
    jars = sorted(str(p) for p in d.glob("*.jar")) if (d / "complete").exists() else []
    if not jars:
        raise JarsMissing(f"the {kind} jars are not staged in {d}: run `python -m kdaemon.sinks.spark.jars {kind}` "
                          "(Maven resolves them from Maven Central, once; `make install` does it)")
    return jars


def stage(kind: str) -> Path:
    """Resolve ``kind``'s pinned jars into ``stage_dir(kind)`` unless they are there already."""
    d = stage_dir(kind)
    if (d / "complete").exists():
        return d
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsMissing("staging the Spark jars needs Maven (`mvn`) on PATH: apt-get install maven")
    partial = d.with_name(d.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    proc = subprocess.run([mvn, "-B", "-q", "-f", str(_pom(kind)), "dependency:copy-dependencies",
                           f"-DoutputDirectory={partial}", "-DincludeScope=runtime"],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise JarsMissing(f"Maven could not resolve the {kind} jars from {_pom(kind)} (is Maven Central "
                          f"reachable?):\n{tail}")
    (partial / "complete").write_text("")
    shutil.rmtree(d, ignore_errors=True)
    partial.rename(d)
    return d


def main(argv: list[str]) -> int:
    for kind in argv or KINDS:
        try:
            d = stage(kind)
        except (JarsMissing, ValueError) as exc:
            print(f"kdaemon spark jars: {exc}", file=sys.stderr)
            return 1
        print(f"{kind}: {len(list(d.glob('*.jar')))} jars in {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
