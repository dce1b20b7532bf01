"""The three ways testkit/stall/run.py takes the sink away, each a real failure of a real sink.

* ``jsonl-unwritable``: the jsonl sink's directory has mode 0555, so creating a file in it fails
  (EACCES) and the sink's ``probe()`` fails the same way; the fix is ``chmod 0755``.  Root
  ignores file modes (CAP_DAC_OVERRIDE), and the run happens as root.  Running the daemon as
  ``nobody`` is not possible here: the venv's interpreter is a link into /root/.pyenv, and
  /root is 0700.  So the daemon runs as root *without* CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and
  CAP_FOWNER (``setpriv --bounding-set``; every process it forks inherits the smaller bounding
  set), under which the kernel applies the directory's mode to it like to anyone else.  Before
  the daemon starts, a process under the same prefix must fail to create a file there
  (``prepare`` checks it), and the run waits for the workers' own "sink unavailable" line.
* ``spark-master-down``: the Spark sink with ``master = "spark://127.0.0.1:<port>"`` where
  nothing listens; the uploader waits for it without its socket, the workers' flushes find no
  uploader.  The fix starts a Spark standalone master on that port and one Spark worker
  (``StandaloneSpark``).  If that cannot be started, the fix falls back to rewriting the
  master to ``local[2]`` and SIGHUP, and says so (``recovered_by``).
* ``spark-uploader-killed``: the Spark sink on ``local[2]``; once the uploader is up it is
  SIGKILLed (with its JVM), and again each time the supervisor starts it, for the whole stall
  (``UploaderKiller``); the fix is to stop killing, and the supervisor's own restart brings it
  back (after whatever its restart backoff had grown to: part of the recovery time).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from testkit.stall.procs import UPLOADER_MODULE
from testkit.daemon import Daemon, free_port, wait_for

HOST = "127.0.0.1"
FAULTS = ("jsonl-unwritable", "spark-master-down", "spark-uploader-killed")
# The capabilities that let root write where a file's mode says no.
DROP_CAPS = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]
KILL_POLL_S = 0.1
# A worker finds the sink down when it flushes.  The Spark sink flushes at max_records (100,000
# by default; buffers past its memory share wait on disk until then): 20,000 makes the workers
# try, and pause, while records still wait in Kafka, as the runs before early staging did.
SPARK_BATCH = {"max_records": 20_000}


class SinkFault:
    """What a scenario changes: the ``[sink]`` table, how the daemon runs, how the sink is broken
    and how it is fixed.  ``details`` ends up in the figures."""

    name = ""
    sink = ""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.details: dict = {}

    def sink_settings(self, out: Path) -> dict:
        raise NotImplementedError

    def prepare(self, out: Path) -> None:
        """Before the daemon starts."""

    def make_daemon(self, root: Path, config: dict, env: dict) -> Daemon:
        return Daemon(root, config, env=env)

    def after_ready(self, daemon: Daemon, sampler) -> None:
        """Once every worker has its assignment, before any record is produced."""

    def heal(self, daemon: Daemon) -> None:
        """Bring the sink back; return once it can take records."""
        raise NotImplementedError

    def close(self) -> None:
        """Teardown (also after a failure)."""


# -- jsonl on a directory nobody may write ---------------------------------------------------------

class JsonlUnwritable(SinkFault):
    name, sink = "jsonl-unwritable", "jsonl"

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.out: Path | None = None
        self.prefix = DROP_CAPS if os.geteuid() == 0 else []

    def sink_settings(self, out: Path) -> dict:
        return {"type": "jsonl", "path": str(out)}

    def prepare(self, out: Path) -> None:
        if self.prefix and shutil.which(self.prefix[0]) is None:
            raise RuntimeError("running as root, the jsonl-unwritable scenario needs `setpriv` (util-linux) "
                               "to drop CAP_DAC_OVERRIDE: root writes into a 0555 directory otherwise")
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        os.chmod(out, 0o555)
        probe = out / ".stall-preflight"
        proc = subprocess.run(self.prefix + [sys.executable, "-c",
                                             "import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644))",
                                             str(probe)], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            probe.unlink(missing_ok=True)
            raise RuntimeError(f"{out} (mode 0555) is still writable for a process run as the daemon is "
                               f"({' '.join(self.prefix) or 'no prefix'}): the scenario would not stall the sink")
        refusal = (proc.stderr.strip().splitlines() or ["?"])[-1]
        self.details.update(run_as=(f"uid {os.geteuid()} without CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, "
                                    f"CAP_FOWNER ({' '.join(self.prefix)})") if self.prefix else f"uid {os.geteuid()}",
                            preflight_refusal=refusal, directory_mode="0555")

    def make_daemon(self, root: Path, config: dict, env: dict) -> Daemon:
        return Daemon(root, config, env=env, prefix=self.prefix)

    def heal(self, daemon: Daemon) -> None:
        os.chmod(self.out, 0o755)

    def close(self) -> None:
        if self.out is not None and self.out.is_dir():
            os.chmod(self.out, 0o755)


# -- Spark: the standalone master is down ------------------------------------------------------------

def spark_class() -> Path:
    import pyspark
    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


class StandaloneSpark:
    """A Spark standalone master on ``port`` and one Spark worker (1 core, 1 GB), both started
    with pyspark's own ``spark-class``, logs under ``directory``; killed by process group."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port
        self.procs: list[subprocess.Popen] = []
        directory.mkdir(parents=True, exist_ok=True)

    def _env(self) -> dict:
        env = dict(os.environ)
        env.update(SPARK_LOCAL_IP=HOST, SPARK_HOME=str(spark_class().parent.parent),
                   SPARK_NO_DAEMONIZE="1")
        return env

    def _start(self, name: str, args: list[str]) -> Path:
        log = self.directory / f"{name}.log"
        with open(log, "ab") as f:
            self.procs.append(subprocess.Popen([str(spark_class()), *args], stdin=subprocess.DEVNULL,
                                               stdout=f, stderr=subprocess.STDOUT, env=self._env(),
                                               start_new_session=True))
        return log

    def start(self, timeout: float = 180.0) -> dict:
        """Master, then worker; returns how long each took to be usable."""
        t0 = time.monotonic()
        master_log = self._start("spark-master", ["org.apache.spark.deploy.master.Master", "--host", HOST,
                                                  "--port", str(self.port), "--webui-port", "0"])
        wait_for(lambda: port_open(self.port) or self._dead("master", master_log), timeout,
                 f"the Spark master to listen on {self.port}", lambda: _tail(master_log), interval=0.2)
        master_s = time.monotonic() - t0
        worker_log = self._start("spark-worker", ["org.apache.spark.deploy.worker.Worker", f"spark://{HOST}:{self.port}",
                                                  "--cores", "1", "--memory", "1g", "--webui-port", "0",
                                                  "--work-dir", str(self.directory / "work")])
        wait_for(lambda: "Successfully registered with master" in _read(worker_log)
                 or self._dead("worker", worker_log), timeout,
                 "the Spark worker to register with the master", lambda: _tail(worker_log), interval=0.2)
        return {"master_listening_s": round(master_s, 1), "worker_registered_s": round(time.monotonic() - t0, 1)}

    def _dead(self, what: str, log: Path) -> bool:
        if self.procs and self.procs[-1].poll() is not None:
            raise RuntimeError(f"the Spark {what} exited with {self.procs[-1].returncode}:\n{_tail(log)}")
        return False

    def stop(self) -> None:
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _tail(path: Path, lines: int = 30) -> str:
    return f"--- {path} ---\n" + "\n".join(_read(path).splitlines()[-lines:])


class SparkMasterDown(SinkFault):
    name, sink = "spark-master-down", "spark"

    def __init__(self, work: Path, fallback_only: bool = False) -> None:
        super().__init__(work)
        self.port = free_port()
        self.master = f"spark://{HOST}:{self.port}"
        self.fallback_only = fallback_only
        self.cluster: StandaloneSpark | None = None

    def sink_settings(self, out: Path) -> dict:
        return {"type": "spark", "master": self.master, "path": str(out), **SPARK_BATCH}

    def after_ready(self, daemon: Daemon, sampler) -> None:
        # The uploader has found nobody at the master and waits for it without its socket.
        daemon.wait_log(rf"the Spark master {self.master} is not reachable", 180)
        self.details["uploader_waits_for_master"] = True

    def heal(self, daemon: Daemon) -> None:
        why = "--master-return reload"
        if not self.fallback_only:
            self.cluster = StandaloneSpark(self.work / "spark-standalone", self.port)
            try:
                self.details.update(self.cluster.start())
                self.details["recovered_by"] = f"the standalone master returning on {self.master} (1 worker, 1 core, 1 GB)"
                return
            except (AssertionError, RuntimeError, OSError) as exc:
                why = f"standalone Spark did not start: {str(exc).splitlines()[0]}"
                self.cluster.stop()
        # Fallback: what tests/sinks/spark/test_spark_sink_failures.py does.
        config = dict(daemon.config)
        config["sink"] = dict(config["sink"], master="local[2]")
        daemon.write_config(config)
        daemon.signal(signal.SIGHUP)
        self.details["recovered_by"] = f"reload, not the master returning: [sink] master = local[2] + SIGHUP ({why})"

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


# -- Spark: the uploader is killed for the whole stall ---------------------------------------------

def uploader_family(daemon_pid: int) -> list[psutil.Process]:
    """The supervisor's live uploader child and its descendants (its JVM), or []."""
    try:
        children = psutil.Process(daemon_pid).children()
    except psutil.NoSuchProcess:
        return []
    for p in children:
        try:
            if UPLOADER_MODULE in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                return [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return []


class UploaderKiller(threading.Thread):
    """SIGKILLs the uploader (and its JVM) whenever one runs, every ``KILL_POLL_S``, until
    halted.  Each victim is sampled first, so its CPU counts (``ProcessSampler.note``)."""

    def __init__(self, daemon: Daemon, sampler) -> None:
        super().__init__(name="uploader-killer", daemon=True)
        self.daemon_ = daemon
        self.sampler = sampler
        self.halt = threading.Event()
        self.kills = 0
        self.lifetimes: list[float] = []
        self.error: BaseException | None = None
        # (pid, start time) of each uploader killed: on a loaded machine a SIGKILLed process can
        # still look alive (not yet a zombie) at the next poll; it is killed again but counted once,
        # so ``kills`` stays the number of uploaders the supervisor had to restart.
        self._killed: set[tuple[int, float]] = set()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                family = uploader_family(self.daemon_.pid)
                if family:
                    self._kill(family)
                self.halt.wait(KILL_POLL_S)
        except BaseException as exc:
            self.error = exc

    def _kill(self, family: list[psutil.Process]) -> None:
        try:
            started = family[0].create_time()
        except psutil.NoSuchProcess:
            return
        again = (family[0].pid, started) in self._killed
        if not again:
            for p in family:
                self.sampler.note(p, "uploader")
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if not again:
            self._killed.add((family[0].pid, started))
            self.lifetimes.append(time.time() - started)
            self.kills += 1


class UploaderKilled(SinkFault):
    name, sink = "spark-uploader-killed", "spark"

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.killer: UploaderKiller | None = None

    def sink_settings(self, out: Path) -> dict:
        return {"type": "spark", "master": "local[2]", "path": str(out), **SPARK_BATCH}

    def after_ready(self, daemon: Daemon, sampler) -> None:
        daemon.wait_log(r"uploader listening on", 240)   # it is up: now it goes
        self.killer = UploaderKiller(daemon, sampler)
        self.killer.start()
        wait_for(lambda: self.killer.kills >= 1 or self.killer.error, 30, "the first uploader kill")

    def check(self) -> None:
        if self.killer is not None and self.killer.error is not None:
            raise RuntimeError(f"the uploader killer failed: {self.killer.error!r}") from self.killer.error

    def heal(self, daemon: Daemon) -> None:
        self.check()
        self.killer.halt.set()
        self.killer.join(10)
        life = self.killer.lifetimes
        self.details.update(uploader_kills=self.killer.kills,
                            killed_uploader_lifetime_s_max=round(max(life), 2) if life else None,
                            killed_uploader_lifetime_s_median=round(sorted(life)[len(life) // 2], 2) if life else None)

    def close(self) -> None:
        if self.killer is not None:
            self.killer.halt.set()


def make_fault(name: str, work: Path, *, master_return: str = "standalone") -> SinkFault:
    if name == "jsonl-unwritable":
        return JsonlUnwritable(work)
    if name == "spark-master-down":
        return SparkMasterDown(work, fallback_only=master_return == "reload")
    if name == "spark-uploader-killed":
        return UploaderKilled(work)
    raise ValueError(f"--sink-fault {name!r}: expected one of {', '.join(FAULTS)}")
