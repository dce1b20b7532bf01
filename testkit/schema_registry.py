"""A real Schema Registry for tests: Apicurio Registry, started from its Maven Central archive.

``registry_dist()`` resolves a pinned release (``maven/apicurio-registry.pom.xml``: the Quarkus
distribution, ``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``, 142 MB) with
``mvn dependency:copy-dependencies`` into the cache ``testkit/apache_kafka.py`` uses
(``$KDAEMON_CACHE`` or ``~/.cache/kdaemon``, then ``apicurio-registry-<version>``) and unpacks it
there once; a stamp holding the pom's hash makes later calls free.  ``start_registry(dir)``
runs ``java -jar apicurio-registry-app-<version>-runner.jar`` with in-memory storage on a free
port below the ephemeral range (``testkit/ports.py``) and returns once Confluent's API
answers at ``.ccompat_url`` (``http://127.0.0.1:PORT/apis/ccompat/v7``: what confluent-kafka's
``SchemaRegistryClient`` and our deserializer are given).  It takes about 20 s on two cores.

The process is stopped by pid (SIGTERM, then SIGKILL), ``pause()``/``resume()`` freeze and thaw
it (SIGSTOP/SIGCONT: a registry that accepts connections and never answers), and ``log_tail()``
gives what a failing test prints.  A start that cannot work (no ``java``, no ``mvn``, Maven
Central unreachable) raises ``RegistryUnavailable`` at once with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from testkit.apache_kafka import cache_dir as kafka_cache_dir
from testkit.apache_kafka import java_binary as kafka_java_binary, maven_copy_dependencies, pom_digest
from testkit.ports import listen_port
from testkit.shared import locked

HOST = "127.0.0.1"
APICURIO_VERSION = "2.6.13.Final"
POM = Path(__file__).with_name("maven") / "apicurio-registry.pom.xml"
ARCHIVE = f"apicurio-registry-app-{APICURIO_VERSION}-all.tar.gz"
RUNNER = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
START_TIMEOUT = 120.0
START_ATTEMPTS = 3          # starts that lost their port to another process before binding it


class RegistryUnavailable(RuntimeError):
    """A registry cannot be started here; the message says what is missing."""


class RegistryStartError(RuntimeError):
    """The registry process did not come up; the message carries its log tail."""


def cache_dir() -> Path:
    return kafka_cache_dir().parent / f"apicurio-registry-{APICURIO_VERSION}"


def java_binary() -> str:
    return kafka_java_binary("Apicurio Registry", RegistryUnavailable)


def registry_dist() -> Path:
    """The unpacked distribution (the runner jar and lib/), resolving it on first use."""
    dist = cache_dir() / "dist"
    stamp = cache_dir() / "resolved.sha256"
    digest = pom_digest(POM)

    def resolved() -> bool:
        return stamp.exists() and stamp.read_text().strip() == digest and (dist / RUNNER).is_file()

    if resolved():
        return dist
    with locked(cache_dir().with_name(cache_dir().name + ".lock")):   # one resolution per machine at a time
        if not resolved():
            _resolve(dist, stamp, digest)
    return dist


def _resolve(dist: Path, stamp: Path, digest: str) -> None:
    """Resolve the distribution from Maven Central and unpack it into ``dist`` (under the lock)."""
    download = cache_dir() / "download.partial"
    maven_copy_dependencies(POM, download, "Apicurio Registry", APICURIO_VERSION, RegistryUnavailable)
    if not (download / ARCHIVE).is_file():
        raise RegistryUnavailable(f"Maven resolved {POM} but {ARCHIVE} is not in {download}: "
                                  f"{sorted(p.name for p in download.iterdir())}")
    tmp = dist.with_name("dist.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(download / ARCHIVE) as archive:
        archive.extractall(tmp, filter="data")
    # The archive has the runner jar and lib/ at its top, or under one directory.
    top = tmp if (tmp / RUNNER).is_file() else next(p.parent for p in tmp.rglob(RUNNER))
    shutil.rmtree(dist, ignore_errors=True)
    top.rename(dist)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(download, ignore_errors=True)   # 142 MB: the unpacked copy is what runs
    stamp.write_text(digest + "\n")


@dataclass
class SchemaRegistryServer:
    """A running Apicurio Registry (in-memory storage: empty at every start)."""

    directory: Path
    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def ccompat_url(self) -> str:
        """The base URL of Confluent's REST API, for confluent-kafka and our deserializer."""
        return f"{self.url}/apis/ccompat/v7"

    @property
    def log_path(self) -> Path:
        return self.directory / "registry.log"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.alive:
            return
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [java_binary(), "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Djava.awt.headless=true", f"-Dquarkus.http.port={self.port}",
                 f"-Dquarkus.http.host={HOST}", "-jar", str(registry_dist() / RUNNER)],
                cwd=self.directory, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel but never answered."""
        if self.alive:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive:
            self.process.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 20.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)   # a paused JVM cannot act on SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.ccompat_url}/subjects", timeout=2.0) as response:
                return response.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])


def start_registry(directory: str | os.PathLike, timeout: float = START_TIMEOUT) -> SchemaRegistryServer:
    """Start Apicurio Registry and return once ``/apis/ccompat/v7/subjects`` answers."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    registry_dist()   # resolve first: fail fast with the reason when Java or Maven is missing
    for attempt in range(1, START_ATTEMPTS + 1):
        server = SchemaRegistryServer(directory, listen_port())
        server.start()
        try:
            _wait_serving(server, timeout)
            return server
        except BaseException as exc:
            lost_port = "Port already bound" in server.log_tail(200) or "Address already in use" in server.log_tail(200)
            server.stop()
            if isinstance(exc, RegistryStartError) and lost_port and attempt < START_ATTEMPTS:
                continue
            raise
    raise AssertionError("unreachable")


def _wait_serving(server: SchemaRegistryServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not server.answers():
        if not server.alive:
            raise RegistryStartError(f"Apicurio Registry exited while starting:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            raise RegistryStartError(f"Apicurio Registry did not answer within {timeout:.0f} s:\n"
                                     f"{server.log_tail()}")
        time.sleep(0.5)
