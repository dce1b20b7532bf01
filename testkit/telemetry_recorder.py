"""A broker-side client telemetry receiver (KIP-714) for tests: testkit/java/TelemetryRecorder.java.

``start_recording_kafka(directory)`` compiles the recorder with ``javac`` against the broker's
own jars (once per source hash, into the cache next to them, as the Java peer), and starts one
Apache Kafka node with it on the class path and among its ``metric.reporters``: only then does a
broker offer GetTelemetrySubscriptions and PushTelemetry.  Every push it accepts is one JSON line
in ``<directory>/pushes.jsonl`` (``Push``, read with ``pushes()``).  A broker subscribes clients
only to what a client-metrics resource asks for: ``subscribe(cluster, name, prefixes,
interval_ms)`` creates one (IncrementalAlterConfigs on resource type CLIENT_METRICS, as
``kafka-configs --entity-type client-metrics`` does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kdaemon.protocol.apis import INCREMENTAL_ALTER_CONFIGS
from kdaemon.protocol.apis.incremental_alter_configs import OP_SET
from testkit.apache_kafka import HOST, KafkaCluster, cache_dir, compiled_jar, start_kafka
from testkit.shared import locked
from testkit.wire import request

SOURCE = Path(__file__).resolve().parent / "java" / "TelemetryRecorder.java"
CLASS = "TelemetryRecorder"
JAR = "telemetry-recorder.jar"
RESOURCE_CLIENT_METRICS = 16     # Kafka's ConfigResource.Type.CLIENT_METRICS


@dataclass(frozen=True)
class Push:
    """One push the broker accepted, as its ClientTelemetry exporter saw it."""

    client_instance_id: str
    terminating: bool
    content_type: str
    client_id: str
    push_interval_ms: int
    resource: dict[str, str] = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)
    error: str | None = None

    @property
    def names(self) -> set[str]:
        return {m["name"] for m in self.metrics}


def recorder_jar() -> Path:
    """The compiled recorder, compiled on first use."""
    with locked(cache_dir() / "telemetry-recorder.lock"):
        return compiled_jar(SOURCE, "telemetry-recorder", JAR)


def start_recording_kafka(directory: Path, **kw) -> KafkaCluster:
    """One Kafka node that records every client telemetry push in ``pushes_file(directory)``."""
    directory.mkdir(parents=True, exist_ok=True)
    extra = dict(kw.pop("extra_properties", {}))
    extra.update({"metric.reporters": CLASS, "telemetry.recorder.file": str(pushes_file(directory))})
    return start_kafka(directory, extra_properties=extra, extra_classpath=(str(recorder_jar()),), **kw)


def pushes_file(directory: Path) -> Path:
    return directory / "pushes.jsonl"


def pushes(directory: Path) -> list[Push]:
    """Every push recorded so far, in arrival order (a line being written is left for later)."""
    path = pushes_file(directory)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines(keepends=True):
        if line.endswith("\n") and line.strip():
            out.append(Push(**json.loads(line)))
    return out


def subscribe(cluster: KafkaCluster, name: str, prefixes: list[str], interval_ms: int,
              match: list[str] | None = None) -> None:
    """Create (or change) client-metrics subscription ``name``: the metrics whose names start
    with one of ``prefixes`` ("*" for all), pushed every ``interval_ms``, from the clients
    ``match`` selects (e.g. ``client_id=...``; all when None)."""
    configs = [("metrics", ",".join(prefixes)), ("interval.ms", str(interval_ms))]
    if match:
        configs.append(("match", ",".join(match)))
    body = {"resources": [{"resource_type": RESOURCE_CLIENT_METRICS, "resource_name": name, "configs": [
        {"name": k, "config_operation": OP_SET, "value": v} for k, v in configs]}], "validate_only": False}
    answer = request(HOST, cluster.port, INCREMENTAL_ALTER_CONFIGS, 1, body, timeout=30.0).body
    (result,) = answer["responses"]
    if result["error_code"]:
        raise RuntimeError(f"client-metrics subscription {name} refused: error {result['error_code']} "
                           f"{result['error_message']}")
