"""The C record loop under AddressSanitizer and UBSan, fuzzed through the records_c target.

    .venv/bin/python -m fuzz.sanitized [--runs N] [--out DIR]

Builds a separate copy of ``kdaemon/protocol/_speedups.c`` with gcc
(``-fsanitize=address,undefined -fno-sanitize-recover=all``: the first report aborts) into a
scratch directory, never over the installed extension, and runs the records_c target with it
(``targets.SPEEDUPS_ENV``).  ``detect_leaks=0`` because CPython keeps objects alive until exit by
design.  Any sanitizer report, or the child dying, is a finding.

Which runtime: the interpreter is not instrumented, so the sanitizer runtime has to be
``LD_PRELOAD``-ed.  gcc's own libasan cannot be: it defines the ``__sanitizer_cov_*`` hooks
itself, shadows libFuzzer's, and atheris then runs blind ("Coverage symbols are being provided
by a library other than libFuzzer": no new inputs are ever kept).  So the object is compiled by
gcc with the sanitizers but linked without gcc's runtimes, and the runtime preloaded is the one
atheris ships for native extensions, ``asan_with_fuzzer.so`` (compiler-rt's ASan, UBSan handlers
included, with libFuzzer): it provides every ``__asan_*``/``__ubsan_*`` symbol gcc 12 emits
(ASan ABI v8), which ``build`` checks.  ``canary()`` proves the set-up reports: a deliberate heap
overflow and a deliberate signed overflow must each abort with a report.

Needs gcc, the Python headers and atheris; ``sanitizer_missing()`` says why when they are not
there.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from . import run, targets

SOURCE = run.ROOT / "kdaemon" / "protocol" / "_speedups.c"
FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
         "-g", "-O1", "-fPIC"]
CANARY = Path(__file__).resolve().parent / "canary.c"
_REPORT = re.compile(r"ERROR: AddressSanitizer|runtime error:|ERROR: UndefinedBehaviorSanitizer|SUMMARY: \w+Sanitizer")


def runtime() -> Path | None:
    """atheris's ASan+UBSan+libFuzzer runtime for native extensions."""
    try:
        import atheris
    except ImportError:
        return None
    path = Path(atheris.path()) / "asan_with_fuzzer.so"
    return path if path.exists() else None


def sanitizer_missing() -> str | None:
    """Why the sanitized build cannot be made here, or None when it can."""
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    if shutil.which("nm") is None:
        return "nm (binutils) is not installed"
    if runtime() is None:
        return "atheris (with its asan_with_fuzzer.so) is not installed"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "Python.h is missing (the Python headers are needed to build the extension)"
    return None


def build(directory: Path, source: Path = SOURCE, name: str = "_speedups") -> Path:
    """Compile ``source`` with the sanitizers into ``directory``; return the .so path.

    Raises RuntimeError when the object needs a sanitizer symbol the preloaded runtime lacks
    (a gcc whose ASan ABI moved on): better to stop than to fuzz with a runtime that mismatches.
    """
    obj = directory / f"{name}.o"
    so = directory / (name + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["gcc", *FLAGS, f"-I{sysconfig.get_paths()['include']}", "-c", str(source), "-o", str(obj)],
                   check=True)
    subprocess.run(["gcc", "-shared", str(obj), "-o", str(so)], check=True)
    wanted = {line.split()[-1] for line in _nm(so) if line.split()[0] == "U"
              and line.split()[-1].startswith(("__asan", "__ubsan"))}
    provided = {line.split()[-1] for line in _nm(runtime()) if len(line.split()) == 3 and line.split()[1] != "U"}
    if missing := sorted(wanted - provided):
        raise RuntimeError(f"{runtime()} lacks {', '.join(missing)} that gcc's instrumentation calls")
    return so


def _nm(path: Path) -> list[str]:
    return subprocess.run(["nm", "-D", str(path)], capture_output=True, text=True, check=True).stdout.splitlines()


def sanitized_env(so: Path) -> dict:
    env = dict(os.environ)
    env.pop("KDAEMON_PURE_PYTHON", None)
    env["LD_PRELOAD"] = str(runtime())
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1:symbolize=1:allocator_may_return_null=1"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:abort_on_error=1:print_stacktrace=1"
    env[targets.SPEEDUPS_ENV] = str(so)
    return env


def canary() -> dict[str, str]:
    """Run each deliberate bug of canary.c under the same set-up; return what each printed.

    Both must abort with a sanitizer report, else the set-up cannot see bugs and a clean fuzz
    run would prove nothing.
    """
    results = {}
    with tempfile.TemporaryDirectory(prefix="kdaemon-asan-canary-") as tmp:
        so = build(Path(tmp), CANARY, "fuzz_canary")
        env = sanitized_env(so)
        env["PYTHONPATH"] = tmp
        for bug in ("heap_overflow", "signed_overflow"):
            proc = subprocess.run([sys.executable, "-c", f"import fuzz_canary; fuzz_canary.{bug}(1)"],
                                  env=env, capture_output=True, text=True, timeout=120)
            results[bug] = proc.stderr
            if proc.returncode == 0 or not _REPORT.search(proc.stderr):
                raise RuntimeError(f"the sanitizers did not report the canary's {bug} "
                                   f"(exit {proc.returncode}): {proc.stderr[-1500:]}")
    return results


def run_sanitized(runs: int, out: Path, *, timeout: float | None = None, log=None) -> run.Result:
    """Build, fuzz records_c with the sanitized loop, and add any sanitizer report as a finding."""
    with tempfile.TemporaryDirectory(prefix="kdaemon-asan-") as tmp:
        so = build(Path(tmp))
        result = run.run_target("records_c", runs, out, env=sanitized_env(so), timeout=timeout,
                                seeds=run.CORPUS / "records_c")
    result.target = "records_c+asan"
    output = (out / "records_c.log").read_text()
    if "Instrumenting kdaemon" not in output or not result.inputs or "Coverage symbols are being provided" in output:
        result.findings.append({"signature": "the sanitized child did not fuzz with coverage",
                                "message": output[-2000:]})
    if m := _REPORT.search(output):
        result.findings.append({"signature": f"sanitizer report: {m.group(0)}",
                                "message": output[max(0, m.start() - 200):m.start() + 3000]})
    if log is not None:
        print(result.line(), file=log, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuzz.sanitized", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=run.FULL_RUNS)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    if why := sanitizer_missing():
        print(f"cannot build the sanitized C loop: {why}", file=sys.stderr)
        return 2
    out = a.out or Path(tempfile.mkdtemp(prefix="kdaemon-fuzz-asan-"))
    canary()
    print("canary: ASan reports a heap overflow and UBSan a signed overflow in this set-up", flush=True)
    print(f"records_c with ASan+UBSan: {a.runs:,} inputs; logs in {out}", flush=True)
    result = run_sanitized(a.runs, out)
    print(result.line())
    for f in result.findings:
        print(f"    {f['signature']}: {f.get('message', '')[:3000]}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
