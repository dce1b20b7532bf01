"""The jars Spark needs beyond pyspark's own (Delta Lake, Apache Iceberg), staged at install time.

A running daemon never downloads: ``stage(kind)`` resolves a pinned Maven project
(``maven/<kind>.pom.xml`` beside this file: exact versions, chosen to match the installed
pyspark) from Maven Central into ``$KDAEMON_CACHE`` (default ``~/.cache/kdaemon``)
``/spark-jars/<kind>-<digest of the pom>/``, once; ``make install`` and ``make test`` call it
(``python -m kdaemon.sinks.spark.tables.jars delta``).  ``staged_jars(kind)`` is what the uploader puts
on ``spark.jars``; nothing staged is a clear error naming the command, at the uploader's start,
not a download.

Each pom says which Spark its jars are built for, in its ``spark.minor`` property (the Delta and
Iceberg artifacts carry it in their names): ``built_for(kind)`` reads it there, the one place it
is written.  A JVM loading them into another Spark fails every job with a linkage error
(``IncompatibleClassChangeError``, ``NoSuchMethodError``): a pyspark upgraded to 4.3 under jars
for 4.1 was retried once a second, 390 ERROR lines in five minutes and nothing delivered.  So
``check-config`` and the uploader's start compare the installed pyspark with it, and the
uploader compares its JVM's ``spark.version`` once the session is up (``mismatch``): a
difference is refused, naming both versions and the fix.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
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
        raise JarsMissing(f"the {kind} jars are not staged in {d}: run `python -m kdaemon.sinks.spark.tables.jars {kind}` "
                          "(Maven resolves them from Maven Central, once; `make install` does it)")
    return jars


def built_for(kind: str) -> str:
    """The Spark version (major.minor, "4.1") ``kind``'s jars are built for: its pom's
    ``spark.minor``."""
    m = re.search(r"<spark\.minor>\s*([0-9]+\.[0-9]+)\s*</spark\.minor>", _pom(kind).read_text())
    if m is None:
        raise ValueError(f"{_pom(kind)} does not say which Spark its jars are built for (<spark.minor>)")
    return m.group(1)


def installed_pyspark() -> str | None:
    """The version of the pyspark this interpreter imports (None: none).  It imports pyspark:
    for ``check-config`` and the uploader, never a worker."""
    try:
        import pyspark
    except ImportError:
        return None
    return pyspark.__version__


PYSPARK = "the installed pyspark"
JVM = "the JVM's Spark (spark.version)"


@dataclass(frozen=True)
class SparkMismatch:
    """``whose`` Spark (``PYSPARK`` or ``JVM``) is ``found``; ``kind``'s jars are built for
    ``wanted``."""

    kind: str
    whose: str
    found: str
    wanted: str

    @property
    def problem(self) -> str:
        return f"{self.whose} is {self.found}, but the staged {self.kind} jars are built for Spark {self.wanted}"

    @property
    def fix(self) -> str:
        use = (f"install pyspark {self.wanted} (pip install 'pyspark=={self.wanted}.*', as kdaemon's spark extra "
               "pins it)") if self.whose == PYSPARK else \
            (f"run the uploader with Spark {self.wanted} (pyspark starts the Spark SPARK_HOME names: unset it for "
             f"pyspark's own, or point it at a Spark {self.wanted})")
        return (f"{use}, or stage {self.kind} jars built for Spark {_minor(self.found)} ({_pom(self.kind)}: its "
                f"spark.minor and the {self.kind} version, then python -m kdaemon.sinks.spark.tables.jars {self.kind})")

    def line(self) -> str:
        return f"{self.problem}; to fix: {self.fix}"


def mismatch(kind: str, version: str, whose: str = PYSPARK) -> SparkMismatch | None:
    """None if Spark ``version`` (``whose``) is one ``kind``'s staged jars are built for (the same
    major.minor: Spark keeps binary compatibility within a minor), else what is wrong."""
    wanted = built_for(kind)
    return None if _minor(version) == wanted else SparkMismatch(kind, whose, version, wanted)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


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
