"""A short coverage-guided fuzz run of every target (fuzz/), in the test suite.

Each target runs a few thousand inputs in its own process, seeded from the committed corpus
(real Kafka 4.4 bytes, so no broker is needed), and the test fails on any finding: an exception
kdaemon's decoders may not raise, a disagreement between the C and the Python record loop, a
crash, or a sanitizer report.  The full run (1,000,000 inputs per target) is ``python -m fuzz``.

A finding that cannot be fixed at once may be listed in ``KNOWN`` (none is): the test then
xfails naming it rather than passing, and fails again for any other finding.
"""

from __future__ import annotations

import pytest

pytest.importorskip("atheris", reason="atheris is not installed (pip install -e .[test])")

from fuzz import run, sanitized, targets  # noqa: E402

SHORT_RUNS = 5000
TIMEOUT_S = 240   # generous: the machine is shared; a normal target takes a few seconds

# Findings reported to the owner of code this work may not change: target -> signature prefix.
KNOWN: dict[str, tuple[str, str]] = {}


def _check(result: run.Result) -> None:
    assert result.inputs >= SHORT_RUNS, f"{result.target} ran {result.inputs} inputs: {result.findings}"
    assert result.coverage, f"{result.target}: libFuzzer reported no coverage (instrumentation broken?)"
    if not result.findings:
        return
    known = KNOWN.get(result.target.split("+")[0])
    details = "\n".join(f"{f['signature']}: {f.get('message', '')[:1500]}" for f in result.findings)
    if known and all(f["signature"].startswith(known[0]) for f in result.findings):
        pytest.xfail(f"known finding: {known[1]}")
    pytest.fail(f"{result.target}: {len(result.findings)} finding(s); inputs kept in the log dir\n{details}")


@pytest.mark.parametrize("name", targets.NAMES)
def test_short_fuzz_run(name, tmp_path):
    if name == "records_c":
        from kdaemon.protocol import record_loop
        if record_loop.accelerated_loop is None:
            pytest.skip("the C record loop is not built (or KDAEMON_PURE_PYTHON is set)")
    _check(run.run_target(name, SHORT_RUNS, tmp_path, timeout=TIMEOUT_S))


def test_short_fuzz_run_of_the_c_loop_under_asan_and_ubsan(tmp_path):
    if why := sanitized.sanitizer_missing():
        pytest.skip(f"no sanitized build possible: {why}")
    sanitized.canary()   # the set-up reports a deliberate heap overflow and signed overflow
    _check(sanitized.run_sanitized(SHORT_RUNS, tmp_path, timeout=TIMEOUT_S))
