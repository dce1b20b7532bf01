"""Apache Kafka for tests and benchmarks: the reference broker, started from Maven Central jars.

``kafka_classpath()`` resolves a pinned release (``maven/pom.xml``) with
``mvn dependency:copy-dependencies`` into a cache outside the repository
(``$KDAEMON_CACHE`` or ``~/.cache/kdaemon``, then ``kafka-<version>/lib``); a stamp holding the
pom's hash makes later calls free.  ``start_kafka()`` formats KRaft storage with Kafka's storage
tool and starts ``java ... kafka.Kafka``, in two shapes:

* ``start_kafka(dir)``: one combined broker+controller node, PLAINTEXT only, small heap — the
  default test broker.
* ``start_kafka(dir, nodes=3, secure=True)``: three combined nodes (a three-voter quorum, so one
  node can be killed with the cluster still serving), each with ``broker.rack`` r1/r2/r3 and
  Kafka's rack-aware replica selector, and listeners PLAINTEXT, SSL (client certificate
  required), SASL_SSL (PLAIN and SCRAM-SHA-256/512 users, ``connections.max.reauth.ms`` short).

Every port is free when chosen, and chosen below the kernel's ephemeral range, where no client
connection's local port can take it between the choice and the broker's bind (a start that loses
the race anyway is retried on fresh ports); data lives in the given directory, processes are killed by pid,
and ``log_tail()`` gives what a failing test prints.  A start that cannot work (no ``java``, no
``mvn``, Maven Central unreachable) raises ``KafkaUnavailable`` at once with the reason.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kdaemon.embedded import api_versions_body
from testkit.ports import listen_port
from testkit.shared import locked, pid_alive

HOST = "127.0.0.1"
KAFKA_VERSION = "4.4.0"
POM = Path(__file__).with_name("maven") / "pom.xml"
CLUSTER_ID = "kdaemonTestCluster0001"   # 22 characters of base64: what the storage tool wants
START_TIMEOUT = 90.0
START_ATTEMPTS = 3          # starts that lost a port to another process before binding it

# Users of the SASL_SSL listener (PLAIN from the JAAS config, SCRAM from the storage format).
SASL_USERS = {"alice": "alice-secret", "bob": "bob-secret"}
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
REAUTH_MS = 10_000
RACKS = ("r1", "r2", "r3")


class KafkaUnavailable(RuntimeError):
    """Apache Kafka cannot be started here; the message says what is missing."""


class KafkaStartError(RuntimeError):
    """A broker process did not come up; the message carries its log tail."""


def cache_dir() -> Path:
    root = Path(os.environ.get("KDAEMON_CACHE") or Path.home() / ".cache" / "kdaemon")
    return root / f"kafka-{KAFKA_VERSION}"


def pom_digest(pom: Path = POM) -> str:
    """What a cache resolved from ``pom`` is keyed by: a changed pom resolves again."""
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def java_binary(needed_by: str = "Apache Kafka", error: type[Exception] = KafkaUnavailable) -> str:
    """``java`` on PATH, or ``error`` saying that ``needed_by`` needs it and how to get it."""
    java = shutil.which("java")
    if java is None:
        raise error(f"{needed_by} needs `java` (17+) on PATH: "
                    "apt-get install openjdk-17-jre-headless (make test does)")
    return java


def maven_copy_dependencies(pom: Path, out: Path, name: str, version: str, error: type[Exception]) -> None:
    """``mvn dependency:copy-dependencies`` of ``pom`` into ``out`` (emptied first), for the
    servers the tests resolve from Maven Central (Apache Kafka, Apicurio Registry); ``error``
    says why ``name`` could not be resolved (no mvn, no java, Maven's last lines)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(f"resolving {name} needs Maven (`mvn`) on PATH: apt-get install maven (make test does)")
    java_binary(name, error)
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
                           f"-DoutputDirectory={out}"], capture_output=True, text=True, timeout=900)
    if proc.returncode:
        lines = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise error(f"Maven could not resolve {name} {version} from {pom} (is Maven Central reachable?):\n"
                    + "\n".join(lines))


def kafka_jars() -> list[Path]:
    """The resolved jars (broker, kafka-clients, logging, Jackson), resolving them on first use."""
    lib = cache_dir() / "lib"
    stamp = cache_dir() / "resolved.sha256"
    digest = pom_digest()

    def resolved() -> bool:
        return stamp.exists() and stamp.read_text().strip() == digest

    if not resolved():
        # One resolution at a time, across the test run's worker processes: a second one
        # would empty lib/ under the first's feet.
        with locked(cache_dir().with_name(cache_dir().name + ".lock")):
            if not resolved():
                tmp = lib.with_name("lib.partial")
                maven_copy_dependencies(POM, tmp, "Apache Kafka", KAFKA_VERSION, KafkaUnavailable)
                shutil.rmtree(lib, ignore_errors=True)
                tmp.rename(lib)
                stamp.write_text(digest + "\n")
    return sorted(lib.glob("*.jar"))


def kafka_jvm_flags() -> list[str]:
    """What every JVM on ``kafka_classpath()`` is launched with beyond its own options: the
    class-data archive of that class path once the run has made it (testkit/jvm_archive.py)."""
    from testkit import jvm_archive
    return jvm_archive.flags("kafka", kafka_classpath())


def kafka_classpath() -> str:
    return os.pathsep.join(str(p) for p in kafka_jars())


def compiled_jar(source: Path, kind: str, jar: str, error: type[Exception] = RuntimeError) -> Path:
    """``source`` compiled with ``javac`` against Kafka's jars into ``<cache>/<kind>/<digest>/<jar>``
    (the digest is the source's), once per machine: the caller holds a lock around it.  A jar, not
    a class directory: the JDK maps a class-data archive only for a class path of jars
    (testkit/jvm_archive.py).  ``error``: raised, with javac's output, when it fails."""
    import zipfile
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = cache_dir() / kind / digest
    if (out / jar).exists():
        return out / jar
    javac = shutil.which("javac")
    if javac is None:
        raise KafkaUnavailable(f"{source.stem} needs `javac` (a JDK 17): apt-get install openjdk-17-jdk-headless")
    tmp = out.with_name(digest + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.run([javac, "-nowarn", "-d", str(tmp), "-cp", kafka_classpath(), str(source)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise error(f"javac {source.name} failed:\n{proc.stdout}{proc.stderr}")
    with zipfile.ZipFile(tmp / jar, "w") as archive:
        for cls in sorted(tmp.glob("*.class")):
            archive.write(cls, cls.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out / jar


def kafka_clients_jar() -> Path:
    for jar in kafka_jars():
        if jar.name == f"kafka-clients-{KAFKA_VERSION}.jar":
            return jar
    raise KafkaUnavailable(f"kafka-clients-{KAFKA_VERSION}.jar missing from {cache_dir() / 'lib'}")


_LOG4J2 = """\
<Configuration status="warn">
  <Appenders><Console name="out" target="SYSTEM_OUT">
    <PatternLayout pattern="[%d{HH:mm:ss,SSS}] %p %m (%c{1})%n"/></Console></Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="out"/></Root>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="org.apache.kafka.clients" level="WARN"/>
    <Logger name="kafka.log.LogCleaner" level="WARN"/>
    <Logger name="org.apache.kafka.storage.internals.log" level="WARN"/>
  </Loggers>
</Configuration>
"""


@dataclass
class Tls:
    """PEM files for the SSL listeners: a CA, the brokers' certificate and a client's."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    server_pem: Path   # key + certificate in one file: Kafka's PEM keystore


@dataclass
class KafkaNode:
    """One combined broker+controller process."""

    node_id: int
    directory: Path
    ports: dict[str, int]          # listener name -> port
    rack: str | None
    heap: str
    # Serial GC by default: fewest threads on a small test machine; benchmarks pass Kafka's own
    # G1 settings (KAFKA_JVM_PERFORMANCE_OPTS) instead.
    java_opts: tuple[str, ...] = ("-XX:+UseSerialGC",)
    # Jars after Kafka's own on the node's class path (a plugin: a metric reporter ...); after,
    # so the class-data archive of Kafka's class path still maps.
    extra_classpath: tuple[str, ...] = ()
    process: subprocess.Popen | None = field(default=None, repr=False)
    # A node another process of the test run started (testkit/shared.py): known by pid only,
    # and not this process's to kill.
    shared_pid: int | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def properties(self) -> Path:
        return self.directory / "server.properties"

    @property
    def port(self) -> int:
        return self.ports["PLAINTEXT"]

    @property
    def alive(self) -> bool:
        if self.shared_pid is not None:
            return pid_alive(self.shared_pid)
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.alive:
            return
        java = java_binary()
        log4j = self.directory / "log4j2.xml"
        log4j.write_text(_LOG4J2)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [java, f"-Xmx{self.heap}", f"-Xms{self.heap}",
                 f"-Dlog4j2.configurationFile={log4j}", "-Djava.awt.headless=true",
                 *self.java_opts, *kafka_jvm_flags(), "-cp", os.pathsep.join((kafka_classpath(), *self.extra_classpath)),
                 "kafka.Kafka", str(self.properties)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown, as a crash."""
        self._signal(signal.SIGKILL, 10.0)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: a controlled shutdown (leadership moves first); SIGKILL after ``timeout``."""
        self._signal(signal.SIGTERM, timeout)

    def _signal(self, sig: int, timeout: float) -> None:
        if self.shared_pid is not None:
            raise RuntimeError(f"Kafka node {self.node_id} is shared by the whole test run: a test that "
                               "stops or kills nodes starts a cluster of its own (start_or_fail)")
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class KafkaCluster:
    """A running Apache Kafka: ``bootstrap`` (PLAINTEXT), per-listener bootstraps, nodes by id."""

    directory: Path
    nodes: dict[int, KafkaNode]
    tls: Tls | None = None
    api_versions: dict = field(default_factory=dict, repr=False)

    host = HOST

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_for("PLAINTEXT")

    @property
    def port(self) -> int:
        return next(iter(self.nodes.values())).port

    def bootstrap_for(self, listener: str) -> str:
        return ",".join(f"{HOST}:{n.ports[listener]}" for n in self.nodes.values())

    @property
    def offered(self) -> dict[int, tuple[int, int]]:
        from kdaemon.protocol.versions import broker_ranges
        return broker_ranges(self.api_versions)

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id]

    def node_by_port(self, port: int) -> KafkaNode:
        for n in self.nodes.values():
            if port in n.ports.values():
                return n
        raise KeyError(port)

    def restart(self, node_id: int, *, timeout: float = START_TIMEOUT) -> None:
        """Start a stopped or killed node again and wait until it serves."""
        node = self.nodes[node_id]
        node.start()
        _wait_serving(self, [node], timeout)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(f"--- node {n.node_id} ({n.log_path}) ---\n{n.log_tail(lines)}"
                         for n in self.nodes.values())

    def stop(self) -> None:
        for n in self.nodes.values():
            n.kill()

    def describe(self) -> dict:
        """What ``attach`` needs to reach this cluster from another process (testkit/shared.py)."""
        return {"bootstrap": self.bootstrap, "directory": str(self.directory),
                "pids": [n.process.pid for n in self.nodes.values()],
                "nodes": [{"node_id": n.node_id, "directory": str(n.directory), "ports": n.ports,
                           "rack": n.rack, "heap": n.heap, "pid": n.process.pid} for n in self.nodes.values()],
                "tls": None if self.tls is None else {k: str(v) for k, v in vars(self.tls).items()},
                "api_versions": self.api_versions}

    @classmethod
    def attach(cls, record: dict) -> "KafkaCluster":
        """A handle on a cluster another process started and ``describe``d: the same addresses,
        files and logs; its nodes cannot be stopped from here."""
        nodes = {n["node_id"]: KafkaNode(n["node_id"], Path(n["directory"]), n["ports"], n["rack"], n["heap"],
                                         shared_pid=n["pid"]) for n in record["nodes"]}
        tls = None if record["tls"] is None else Tls(**{k: Path(v) for k, v in record["tls"].items()})
        return cls(Path(record["directory"]), nodes, tls, record["api_versions"])

    def __enter__(self) -> "KafkaCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _listener_ports(secure: bool) -> dict[str, int]:
    names = ["PLAINTEXT", "CONTROLLER"] + (["SSL", "SASL_SSL"] if secure else [])
    return {name: listen_port() for name in names}


def _lost_a_port(directory: Path, nodes: int) -> bool:
    """A node's whole log (the error carries only its tail) says a listener could not bind."""
    for i in range(1, nodes + 1):
        log = directory / f"node{i}" / "server.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        if "BindException" in text or "Address already in use" in text:
            return True
    return False


def _properties(node: KafkaNode, cluster_nodes: list[KafkaNode], tls: Tls | None,
                extra: dict[str, str]) -> str:
    n = len(cluster_nodes)
    voters = ",".join(f"{c.node_id}@{HOST}:{c.ports['CONTROLLER']}" for c in cluster_nodes)
    listeners = ",".join(f"{name}://{HOST}:{port}" for name, port in node.ports.items())
    advertised = ",".join(f"{name}://{HOST}:{port}" for name, port in node.ports.items()
                          if name != "CONTROLLER")
    protocols = {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "PLAINTEXT", "SSL": "SSL", "SASL_SSL": "SASL_SSL"}
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": voters,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listeners": listeners,
        "advertised.listeners": advertised,
        "listener.security.protocol.map": ",".join(f"{k}:{protocols[k]}" for k in node.ports),
        "log.dirs": str(node.directory / "data"),
        "num.partitions": "1",
        "default.replication.factor": str(n),
        "offsets.topic.replication.factor": str(n),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": str(n),
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        # Share groups (KIP-932, on by default in 4.4) keep their state in __share_group_state.
        # Its default of 3 replicas cannot be created on one node (INVALID_REPLICATION_FACTOR,
        # and a ShareFetch then never answers); 4 partitions rather than 50, as above.
        "share.coordinator.state.topic.replication.factor": str(n),
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "4",
        # Share-group tests hold a record past its acquisition lock (share.record.lock.duration.ms,
        # a group config no lower than this bound, 15 s by default) and wait for assignments,
        # which come with heartbeats (every 5 s by default): both made short, as for consumer groups.
        "group.share.min.record.lock.duration.ms": "1000",
        "group.share.min.heartbeat.interval.ms": "500",
        "group.share.heartbeat.interval.ms": "1000",
        "group.initial.rebalance.delay.ms": "0",
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        # Kafka 4's default, named: the online-migration tests must not depend on a default.
        "group.consumer.migration.policy": "bidirectional",
        "group.min.session.timeout.ms": "1000",
        "log.segment.bytes": str(64 << 20),
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.flush.interval.messages": str(2**62),
        "auto.create.topics.enable": "false",
    }
    if node.rack is not None:
        props["broker.rack"] = node.rack
        props["replica.selector.class"] = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
    if tls is not None:
        jaas_plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                      + " ".join(f'user_{u}="{p}"' for u, p in SASL_USERS.items()) + ";")
        props.update({
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tls.server_pem),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls.ca),
            "ssl.endpoint.identification.algorithm": "",
            "listener.name.ssl.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": ",".join(("PLAIN",) + SCRAM_MECHANISMS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas_plain,
            **{f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config":
               "org.apache.kafka.common.security.scram.ScramLoginModule required;"
               for m in SCRAM_MECHANISMS},
            "connections.max.reauth.ms": str(REAUTH_MS),
        })
    props.update(extra)
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _make_tls(directory: Path) -> Tls:
    from testkit.secure import make_pki, openssl_available
    if not openssl_available():
        raise KafkaUnavailable("the secure Kafka cluster needs the `openssl` command for its certificates")
    pki = make_pki(directory)
    server_pem = directory / "server-keystore.pem"
    server_pem.write_text(pki.server_key.read_text() + pki.server_cert.read_text())
    return Tls(pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key, server_pem)


def _format(node: KafkaNode, tls: Tls | None) -> None:
    args = [java_binary(), *kafka_jvm_flags(), "-cp", kafka_classpath(), "kafka.tools.StorageTool", "format",
            "-t", CLUSTER_ID, "-c", str(node.properties), "--ignore-formatted"]
    if tls is not None:
        for mech in SCRAM_MECHANISMS:
            for user, password in SASL_USERS.items():
                args += ["--add-scram", f"{mech}=[name={user},password={password}]"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise KafkaStartError(f"kafka-storage format failed for node {node.node_id}:\n"
                              f"{(proc.stdout + proc.stderr).strip()}")


def start_or_fail(tmp_path_factory, name: str, **kw) -> "KafkaCluster":
    """``start_kafka`` in a fresh temporary directory called ``name``, for a fixture: a machine
    that cannot start Apache Kafka fails the test loudly (never a skip: the suite promises the
    reference broker)."""
    try:
        return start_kafka(tmp_path_factory.mktemp(name), **kw)
    except KafkaUnavailable as exc:
        import pytest   # only fixtures call this; the benchmarks import this module without pytest
        pytest.fail(f"Apache Kafka cannot start here: {exc}", pytrace=False)


def start_kafka(directory: str | os.PathLike, *, nodes: int = 1, secure: bool = False,
                racks: bool | None = None, heap: str | None = None,
                java_opts: tuple[str, ...] | None = None,
                extra_properties: dict[str, str] | None = None,
                extra_classpath: tuple[str, ...] = (),
                timeout: float = START_TIMEOUT) -> KafkaCluster:
    """Format and start ``nodes`` combined Kafka nodes and return once every one serves.

    ``racks`` (default: on for more than one node) gives node i ``broker.rack`` = r<i> and the
    rack-aware replica selector.  ``secure`` adds the SSL and SASL_SSL listeners.
    ``extra_properties`` go into every node's server.properties as given; ``java_opts`` replace
    the JVM options after the heap (default: the serial collector); ``extra_classpath`` (jars)
    follows Kafka's own on every node's class path.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    kafka_jars()   # resolve first: fail fast with the reason when Java or Maven is missing
    racks = nodes > 1 if racks is None else racks
    heap = heap or ("512m" if nodes == 1 else "384m")
    tls = _make_tls(directory / "tls") if secure else None
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return _start_once(directory, nodes, tls, racks, heap, java_opts,
                               extra_properties or {}, timeout, extra_classpath)
        except KafkaStartError:
            if attempt == START_ATTEMPTS or not _lost_a_port(directory, nodes):
                raise
            for i in range(1, nodes + 1):   # storage is formatted afresh for the new ports
                shutil.rmtree(directory / f"node{i}", ignore_errors=True)
    raise AssertionError("unreachable")


def _start_once(directory: Path, nodes: int, tls: Tls | None, racks: bool, heap: str,
                java_opts: tuple[str, ...] | None, extra_properties: dict[str, str],
                timeout: float, extra_classpath: tuple[str, ...] = ()) -> KafkaCluster:
    members = [KafkaNode(i, directory / f"node{i}", _listener_ports(tls is not None),
                         RACKS[(i - 1) % len(RACKS)] if racks else None, heap,
                         *(() if java_opts is None else (tuple(java_opts),)),
                         extra_classpath=tuple(extra_classpath))
               for i in range(1, nodes + 1)]
    cluster = KafkaCluster(directory, {m.node_id: m for m in members}, tls)
    try:
        for m in members:
            m.directory.mkdir(parents=True, exist_ok=True)
            m.properties.write_text(_properties(m, members, tls, extra_properties))
            _format(m, tls)
        for m in members:
            m.start()
        _wait_serving(cluster, members, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_serving(cluster: KafkaCluster, members: list[KafkaNode], timeout: float) -> None:
    """Until each node answers ApiVersions on PLAINTEXT and its metadata lists every live node."""
    deadline = time.monotonic() + timeout
    pending = list(members)
    while pending:
        node = pending[0]
        if not node.alive:
            raise KafkaStartError(f"Kafka node {node.node_id} exited while starting:\n{node.log_tail()}")
        body = api_versions_body(HOST, node.port, timeout=2.0)
        if body is not None and body["error_code"] == 0 and _registered(node, cluster):
            cluster.api_versions = body
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise KafkaStartError(f"Kafka node {node.node_id} did not serve within {timeout:.0f} s:\n"
                                  f"{node.log_tail()}")
        time.sleep(0.2)


def _registered(node: KafkaNode, cluster: KafkaCluster) -> bool:
    """The node's own metadata lists every node that is alive (so a client sees the whole cluster)."""
    from testkit.wire import request
    from kdaemon.protocol.apis import METADATA
    try:
        body = request(HOST, node.port, METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                                       "include_topic_authorized_operations": False},
                       timeout=2.0).body
    except OSError:
        return False
    seen = {b["node_id"] for b in body["brokers"]}
    return {n.node_id for n in cluster.nodes.values() if n.alive} <= seen


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0
