"""Run fuzz targets, each in its own process, and report inputs, coverage, findings and time.

    python -m fuzz                       # every target, 1,000,000 inputs each (the full run)
    python -m fuzz records_c sasl --runs 5000 --jobs 2
    python -m fuzz --json out.json ...   # the same figures, machine-readable

A target runs in a child process (``--child``) so a crash in C, a sanitizer report or a
libFuzzer timeout ends that child, not the run, and shows as a finding.  Inside the child every
exception the target may not raise is recorded (first input per distinct exception type and
place, in ``--out``) and fuzzing goes on, so one run counts every distinct finding instead of
stopping at the first.  libFuzzer adds the inputs it finds interesting to a scratch corpus, never
to the committed seeds in ``fuzz/corpus/<target>/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import targets

CORPUS = Path(__file__).resolve().parent / "corpus"
ROOT = CORPUS.parent.parent
FULL_RUNS = 1_000_000


@dataclass
class Result:
    target: str
    inputs: int = 0
    coverage: int | None = None
    features: int | None = None
    new_units: int | None = None
    execs_per_sec: int | None = None
    wall_s: float = 0.0
    exit_code: int = 0
    findings: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.findings

    def line(self) -> str:
        cov = f"cov {self.coverage} ft {self.features}" if self.coverage is not None else "cov -"
        return (f"{self.target:15} {self.inputs:>10,} inputs  {cov:>18}  {len(self.findings)} findings  "
                f"{self.wall_s:7.1f} s  ({self.execs_per_sec or 0}/s, exit {self.exit_code})")


# -- child: one target under atheris ----------------------------------------------------------

def _signature(exc: BaseException) -> str:
    """Exception type and the innermost frame in kdaemon (else the innermost frame at all)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "/kdaemon/" in f.filename] or frames
    where = f"{Path(mine[-1].filename).name}:{mine[-1].lineno}" if mine else "?"
    return f"{type(exc).__name__} at {where}"


def child(name: str, findings: Path, out: Path, libfuzzer_args: list[str]) -> None:
    import atheris
    with atheris.instrument_imports(include=["kdaemon"]):
        target = targets.build(name)
    seen: set[str] = set()

    def one_input(data: bytes) -> None:
        try:
            target.run(data)
        except target.allowed:
            pass
        except Exception as exc:  # the oracle: anything else is a finding
            sig = _signature(exc)
            if sig in seen:
                return
            seen.add(sig)
            digest = hashlib.sha1(data).hexdigest()[:16]
            (out / f"finding-{name}-{digest}").write_bytes(data)
            record = {"signature": sig, "input": f"finding-{name}-{digest}", "message": str(exc)[:500],
                      "traceback": "".join(traceback.format_exception(exc))[-3000:]}
            with open(findings, "a") as fh:
                fh.write(json.dumps(record) + "\n")
            print(f"FINDING {name}: {sig}: {str(exc)[:200]}", file=sys.stderr, flush=True)

    atheris.Setup([sys.argv[0], *libfuzzer_args], one_input)
    atheris.Fuzz()


# -- parent ------------------------------------------------------------------------------------

_STAT = re.compile(r"^stat::(\w+):\s*(\d+)", re.M)
_COV = re.compile(r"cov: (\d+) ft: (\d+)")


def run_target(name: str, runs: int, out: Path, *, env: dict | None = None, timeout: float | None = None,
               seeds: Path | None = None, log=None) -> Result:
    """Fuzz one target for ``runs`` inputs in a child process; findings and logs go to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"kdaemon-fuzz-{name}-", dir=_memory_dir()))
    work = scratch / "corpus"
    work.mkdir()
    findings = out / f"{name}.findings.jsonl"
    findings.unlink(missing_ok=True)
    seeds = seeds if seeds is not None else CORPUS / name
    dirs = [str(work)] + ([str(seeds)] if seeds.is_dir() else [])
    cmd = [sys.executable, "-m", "fuzz.run", "--child", name, "--findings", str(findings), "--out", str(out),
           "--", *dirs, f"-runs={runs}", "-print_final_stats=1", "-timeout=30", "-rss_limit_mb=3072",
           "-max_len=65536", f"-artifact_prefix={out}/{name}-"]
    child_env = dict(os.environ if env is None else env)
    child_env[targets.SCRATCH_ENV] = str(scratch)
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), child_env.get("PYTHONPATH")]))
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout)
        output, code = proc.stdout.decode("utf-8", "replace"), proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = (exc.output or b"").decode("utf-8", "replace") + "\n[killed: timeout]", -9
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = Result(name, wall_s=time.monotonic() - start, exit_code=code)
    (out / f"{name}.log").write_text(output)
    stats = {k: int(v) for k, v in _STAT.findall(output)}
    result.inputs = stats.get("number_of_executed_units", 0)
    result.new_units = stats.get("new_units_added")
    result.execs_per_sec = stats.get("average_exec_per_sec")
    if cov := _COV.findall(output):
        result.coverage, result.features = int(cov[-1][0]), int(cov[-1][1])
    if findings.exists():
        result.findings = [json.loads(line) for line in findings.read_text().splitlines() if line]
    if code != 0 and not result.findings:
        result.findings.append({"signature": f"child exited {code}", "message": output[-3000:]})
    if log is not None:
        print(result.line(), file=log, flush=True)
    return result


def _memory_dir() -> str | None:
    """/dev/shm when writable: the config target writes a file per input, and disk is shared."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def run_all(names, runs: int, out: Path, *, jobs: int = 1, env: dict | None = None,
            timeout: float | None = None, log=sys.stdout) -> list[Result]:
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_target, n, runs, out, env=env, timeout=timeout, log=log) for n in names]
        return [f.result() for f in futures]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        p = argparse.ArgumentParser(prog="fuzz.run --child")
        p.add_argument("--child", required=True)
        p.add_argument("--findings", type=Path, required=True)
        p.add_argument("--out", type=Path, required=True)
        split = argv.index("--")
        a = p.parse_args(argv[:split])
        child(a.child, a.findings, a.out, argv[split + 1:])
        return 0
    p = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", help=f"default: all of {', '.join(targets.NAMES)}")
    p.add_argument("--runs", type=int, default=FULL_RUNS, help="inputs per target (default 1,000,000)")
    p.add_argument("--jobs", type=int, default=1, help="targets fuzzed at the same time")
    p.add_argument("--out", type=Path, default=None, help="logs and finding inputs (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here too")
    a = p.parse_args(argv)
    names = a.targets or list(targets.NAMES)
    for n in names:
        if n not in targets.NAMES:
            p.error(f"unknown target {n!r}")
    out = a.out or Path(tempfile.mkdtemp(prefix="kdaemon-fuzz-out-"))
    print(f"fuzzing {', '.join(names)}: {a.runs:,} inputs each; logs and findings in {out}", flush=True)
    results = run_all(names, a.runs, out, jobs=a.jobs)
    print("\nsummary")
    for r in results:
        print(r.line())
        for f in r.findings:
            print(f"    {f['signature']}: {f.get('message', '')[:300]}  [{f.get('input', '')}]")
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
