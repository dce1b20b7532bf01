"""bench/daemon's daemon side: ``kdaemon run`` as a subprocess with the bench's configuration,
its progress read from outside (the supervisor's ``/metrics``, ``/proc`` for CPU, RSS and
run-queue wait), and the progress curves turned into a 10-90% rate.  bench/daemon's peers
use the same rate and CPU functions on their own progress points, so both sides are measured
alike.

Only the standard library at module level: bench/daemon's peer children import this too.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from testkit.workload import FETCH_MAX_BYTES, MAX_PARTITION_FETCH_BYTES, TARGET, TOPIC

REPO_ROOT = Path(__file__).resolve().parents[2]
WINDOW = (0.10, 0.90)
SAMPLE_S = 0.25
STOP_TIMEOUT_S = 60.0
PROFILE_PLUGIN = "bench.daemon.profile_plugin"   # enabled by Python path for --profile runs
PROFILE_ENV = "KDAEMON_BENCH_PROFILE_DIR"  # where it writes the profiles (bench/daemon/profile_plugin.py)


# -- progress → rate -----------------------------------------------------------------------------

def crossing(times: list[float], values: list[float], target: float) -> float | None:
    """The first instant a piecewise-linear, non-decreasing curve reaches target."""
    for i, v in enumerate(values):
        if v >= target:
            if i == 0:
                return times[0]
            v0, t0 = values[i - 1], times[i - 1]
            return t0 + (target - v0) / (v - v0) * (times[i] - t0)
    return None


def window_rate(times: list[float], values: list[float], total: int) -> dict | None:
    """Records/s between the 10% and 90% crossings of a piecewise-linear progress curve."""
    lo, hi = WINDOW[0] * total, WINDOW[1] * total
    if not times or values[-1] < hi:
        return None
    if values[0] >= lo:  # the curve only starts later (the daemon's first corners)
        ta, na = times[0], values[0]
    else:
        ta, na = crossing(times, values, lo), lo
    tb = crossing(times, values, hi)
    if tb is None or tb <= ta:
        return None
    return {"records_per_s": (hi - na) / (tb - ta), "t_start": ta, "t_end": tb,
            "window": [na / total, WINDOW[1]], "window_s": tb - ta,
            "points": sum(ta < t < tb for t in times)}


def partition_corners(samples: list[tuple[float, dict]], partitions: int) -> dict:
    """{partition: [(t, processed)]}: the first sample that shows each new value of a partition's
    counter, i.e. (shortly after) the instant its worker published it.  A partition's counter
    exists only once it has a record, so its curve starts at (the last sample without it, 0)."""
    corners: dict = {p: [] for p in range(partitions)}
    last_absent: dict = {}
    for t, parts in samples:
        for p in range(partitions):
            v = parts.get(p, 0)
            c = corners[p]
            if not v and not c:
                last_absent[p] = t
            elif not c or v != c[-1][1]:
                if not c:
                    c.append((last_absent.get(p, t), 0))
                c.append((t, v))
    return {p: c for p, c in corners.items() if c}


def _value_at(corners: list[tuple[float, float]], t: float) -> float:
    if t <= corners[0][0]:
        return corners[0][1]
    for (t0, v0), (t1, v1) in zip(corners, corners[1:]):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return corners[-1][1]


def daemon_rate(samples: list[tuple[float, dict]], partitions: int, total: int) -> dict | None:
    corners = partition_corners(samples, partitions)
    if not corners:
        return None
    grid = sorted({t for c in corners.values() for t, _ in c})
    values = [sum(_value_at(c, t) for c in corners.values()) for t in grid]
    return window_rate(grid, values, total)


def stalls(samples: list[tuple[float, dict]], ta: float, tb: float, min_s: float = 0.5) -> tuple[float, float]:
    """(total, longest) time inside [ta, tb] during which the processed count stood still for at
    least min_s (two counter updates): a worker that processes records shows progress at every
    update, so a longer standstill is waiting (for a Fetch answer, or for a CPU)."""
    total = longest = 0.0
    since, last = None, None
    for t, parts in samples:
        n = sum(parts.values())
        if n != last:
            if since is not None:
                overlap = min(t, tb) - max(since, ta)
                if t - since >= min_s and overlap > 0:
                    total += overlap
                    longest = max(longest, overlap)
            since, last = t, n
    return total, longest


def cpu_over(samples: list[tuple[float, float]], ta: float, tb: float) -> float | None:
    """CPU seconds per wall second between ta and tb, from (t, cumulative CPU s) samples
    (interpolated; None when the samples do not cover the window)."""
    if len(samples) < 2 or samples[0][0] > ta or samples[-1][0] < tb:
        return None
    ts = [t for t, _ in samples]
    cs = [c for _, c in samples]
    return (_interp(ts, cs, tb) - _interp(ts, cs, ta)) / (tb - ta)


def _interp(ts: list[float], vs: list[float], t: float) -> float:
    for i in range(1, len(ts)):
        if ts[i] >= t:
            return vs[i - 1] + (vs[i] - vs[i - 1]) * (t - ts[i - 1]) / (ts[i] - ts[i - 1] or 1e-9)
    return vs[-1]


# -- the daemon ---------------------------------------------------------------------------------

def child_env() -> dict:
    """Children import kdaemon, its bundled plugins (the json deserializer) and bench from the
    tree this script lives in, so a copy of the tree can be measured; the daemon's own
    environment (its metrics directory, the profile plugin's) is not passed on."""
    from testkit import common as _common
    return _common.child_env(after=[str(REPO_ROOT / "plugins")], drop=("PROMETHEUS_MULTIPROC_DIR", PROFILE_ENV))


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m:
            out.append((m.group(1), dict(_LABEL_RE.findall(m.group(2) or "")), float(m.group(3))))
    return out


def scrape(port: int) -> str | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read()
        return body.decode() if resp.status == 200 else None
    except OSError:
        return None
    finally:
        conn.close()


def _proc_status(pid: int) -> dict:
    """VmHWM / VmRSS in MiB and CPU seconds (user + system, all threads) of one process."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    out[line[:5]] = int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        return {}
    from testkit import common as _common
    cpu = _common.process_cpu_s(pid)
    if cpu is None:
        return {}
    out["cpu"] = cpu
    return out


def run_delay_s(pid: int) -> float:
    """Seconds the threads of a process spent runnable but waiting for a CPU
    (/proc/PID/task/*/schedstat, second field): what other processes on the machine cost it."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


# The group's session timeout.  Under the classic protocol the daemon's [kafka] session_timeout_ms;
# under the consumer protocol the broker decides it: bench/daemon starts Apache Kafka with
# group.consumer.session.timeout.ms set to the same, and the option is left out of the file
# (an explicit group_protocol = "consumer" refuses it; "auto" drops it when it picks consumer).
SESSION_TIMEOUT_MS = 6000
GROUP_PROTOCOLS = ("auto", "classic", "consumer")
# A worker's log lines naming the protocol it speaks and why, and the classic-only options it
# dropped when "auto" chose the consumer protocol (kdaemon/worker/main.py).
_PROTOCOL_LINE = re.compile(r"worker \d+: (group protocol .*|.* not used under the consumer protocol.*)")


def write_config(path: Path, *, bootstrap: str, group: str, mode: str, workers: int, state_dir: Path,
                 metrics_port: int, poll_records: int | None, metrics_interval_s: float, profile: bool,
                 group_protocol: str = "auto") -> None:
    plugins = ", ".join(f'"{p}"' for p in ["json"] + ([f"{PROFILE_PLUGIN}:"] if profile else []))
    filters = ""
    if mode == "filter":
        filters = (f'[[filters]]\nheader = "type"\nop = "equals"\nvalues = ["{TARGET.decode()}"]\n'
                   'action = "keep"\n\n')
    path.write_text(f"""\
# Written by bench/daemon for one run ({mode}, {workers} worker(s)).
plugins = [{plugins}]

[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
auto_offset_reset = "earliest"
group_protocol = "{group_protocol}"
{f"session_timeout_ms = {SESSION_TIMEOUT_MS}" if group_protocol != "consumer"
 else "# session timeout: the broker's group.consumer.session.timeout.ms"}
{f"max_poll_records = {poll_records}" if poll_records else "# max_poll_records: the daemon's default"}
fetch_max_bytes = {FETCH_MAX_BYTES}
max_partition_fetch_bytes = {MAX_PARTITION_FETCH_BYTES}

[daemon]
topics = ["{TOPIC}"]
workers = {workers}
state_dir = "{state_dir}"
metrics_addr = "127.0.0.1:{metrics_port}"
metrics_interval_ms = {round(metrics_interval_s * 1000)}
on_deserialize_error = "stop"
log_level = "INFO"

{filters}[deserializer]
value = "json"

[sink]
type = "null"
""")


def run_daemon(*, broker, produced: dict, mode: str, workers: int, run_dir: Path, args,
               profile_dir: Path | None = None) -> dict:
    from testkit import common as _common

    run_dir.mkdir(parents=True)
    expected = produced["expected"]
    total, kept = sum(expected), produced["kept"][mode]
    port = _common.free_port()
    config = run_dir / "kdaemon.toml"
    group = f"bench-daemon-{mode}-{workers}w-{uuid.uuid4().hex[:12]}"
    write_config(config, bootstrap=broker.bootstrap, group=group, mode=mode, workers=workers,
                 state_dir=run_dir / "state", metrics_port=port,
                 poll_records=args.daemon_poll_records, metrics_interval_s=args.metrics_interval,
                 profile=profile_dir is not None, group_protocol=args.group_protocol)
    env = child_env()
    if profile_dir is not None:
        env[PROFILE_ENV] = str(profile_dir)
    exe = Path(sys.executable).with_name("kdaemon")
    cmd = ([str(exe)] if exe.exists() else [sys.executable, "-m", "kdaemon.cli"]) + [
        "run", "-c", str(config), "--workers", str(workers)]
    log_path = run_dir / "kdaemon.log"
    samples: list[tuple[float, dict]] = []       # (t, {partition: processed})
    worker_cpu: list[tuple[float, float]] = []    # (t, CPU s of all workers)
    broker_cpu: list[tuple[float, float]] = []
    supervisor_cpu: list[tuple[float, float]] = []
    sampler_cpu: list[tuple[float, float]] = []   # this process: scraping /metrics, reading /proc
    hwm: dict[int, float] = {}
    cpu_by_pid: dict[int, float] = {}
    wait_by_pid: dict[int, float] = {}
    worker_wait: list[tuple[float, float]] = []   # (t, run-queue wait s of all workers)
    out = {"mode": mode, "workers": workers, "records": 0, "delivered": 0, "capped": False,
           "rss_metric_mb": 0.0, "group_joins": 0, "restarts": 0}
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        next_at = t0
        t_first = None
        while True:
            ta = time.perf_counter()
            text = scrape(port)
            t = (ta + time.perf_counter()) / 2 - t0
            for pid in _children(proc.pid):
                st = _proc_status(pid)
                if st:
                    hwm[pid] = max(hwm.get(pid, 0.0), st.get("VmHWM", 0.0))
                    cpu_by_pid[pid] = st["cpu"]
                    wait_by_pid[pid] = run_delay_s(pid)
            worker_cpu.append((t, sum(cpu_by_pid.values())))
            worker_wait.append((t, sum(wait_by_pid.values())))
            broker_cpu.append((t, broker.cpu_s()))
            supervisor_cpu.append((t, _proc_status(proc.pid).get("cpu", supervisor_cpu[-1][1] if supervisor_cpu else 0.0)))
            sampler_cpu.append((t, time.process_time()))
            if text is not None:
                parts: dict = {}
                delivered = 0
                restarts = 0   # summed over the {worker, reason} series
                for name, labels, value in parse_metrics(text):
                    if name in ("kdaemon_records_fetched_total", "kdaemon_records_filtered_total"):
                        p = int(labels["partition"])
                        parts[p] = parts.get(p, 0) + value
                    elif name == "kdaemon_records_delivered_total":
                        delivered += value
                    elif name == "kdaemon_worker_rss_bytes":
                        out["rss_metric_mb"] = max(out["rss_metric_mb"], value / 1048576)
                    elif name == "kdaemon_rebalances_total":
                        out["group_joins"] = max(out["group_joins"], int(value))
                    elif name == "kdaemon_worker_restarts_total":
                        restarts += int(value)
                out["restarts"] = max(out["restarts"], restarts)
                samples.append((t, parts))
                out["records"], out["delivered"] = int(sum(parts.values())), int(delivered)
                if out["records"] and t_first is None:
                    t_first = t
                if out["records"] >= total and out["delivered"] >= kept:
                    break
            if proc.poll() is not None:
                out["error"] = f"kdaemon exited with {proc.returncode} before the end; " + _tail(log_path)
                return out
            if t > args.max_seconds:
                out["capped"] = True
                break
            next_at += SAMPLE_S
            time.sleep(max(0.0, next_at - time.perf_counter()))
        out["seconds"] = t
        out["first_record_s"] = t_first
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                out.setdefault("error", f"the supervisor did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM")
        out["stop_seconds"] = time.perf_counter() - t0 - out.get("seconds", 0.0)
        out["exit_code"] = proc.returncode
    if proc.returncode != 0 and "error" not in out:
        out["error"] = f"the supervisor exited with {proc.returncode} after SIGTERM; " + _tail(log_path)
    last = samples[-1][1] if samples else {}
    counts = [int(last.get(p, 0)) for p in range(len(expected))]
    out["counts"] = counts
    if "error" not in out and not out["capped"]:
        if counts != expected or out["delivered"] != kept:
            out["error"] = (f"wrong counts: processed per partition {counts} (want {expected}), "
                            f"delivered {out['delivered']} (want {kept})")
    out["rss_peak_mb"] = max(hwm.values(), default=0.0)
    out["worker_pids"] = len(hwm)
    win = daemon_rate(samples, len(expected), total)
    out["window"] = win
    out["samples"] = [(round(t, 3), {p: int(v) for p, v in parts.items()}) for t, parts in samples]
    if win:
        out["records_per_s"] = win["records_per_s"]
        out["workers_cpu"] = cpu_over(worker_cpu, win["t_start"], win["t_end"])
        out["workers_cpu_wait"] = cpu_over(worker_wait, win["t_start"], win["t_end"])
        out["stalled_s"], out["longest_stall_s"] = stalls(samples, win["t_start"], win["t_end"],
                                                          max(0.5, 2 * args.metrics_interval + 0.01))
        out["broker_cpu"] = cpu_over(broker_cpu, win["t_start"], win["t_end"])
        out["supervisor_cpu"] = cpu_over(supervisor_cpu, win["t_start"], win["t_end"])
        out["sampler_cpu"] = cpu_over(sampler_cpu, win["t_start"], win["t_end"])
    else:
        out["records_per_s"] = None
    text = log_path.read_text(errors="replace")
    out["assignments_logged"] = text.count("has its assignment")
    out["group_protocols"] = sorted({m[1] for m in _PROTOCOL_LINE.finditer(text)})
    return out


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])[-2000:]
    except OSError:
        return ""


def profile_summary(profile_dir: Path, top: int) -> str:
    import io
    import pstats
    files = sorted(profile_dir.glob("worker-*.prof"))
    if not files:
        return "(no profile written)"
    out = io.StringIO()
    stats = pstats.Stats(*map(str, files), stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    return out.getvalue()
