"""The chaos run's cluster: three Apache Kafka nodes, and a cutting proxy in front of them that
only the daemon goes through.

Why a second listener: a client reaches a broker at the address the broker *advertises*, so a
proxy given only as the bootstrap would carry the first metadata request and nothing else.  Each
node therefore gets a listener ``PROXIED`` on a port of its own whose advertised address is the
proxy's forwarder for that port: a client bootstrapped through the proxy learns only proxy
addresses and every byte it exchanges crosses the proxy, while the producers, the admin calls
and the brokers among themselves keep using ``PLAINTEXT`` directly (a cut hits the daemon only).

``start_kafka`` writes one set of properties for every node, so the listener is added after it
returned: every node is killed, its ``server.properties`` gets the three listener keys again
(the last occurrence of a key wins in a Java properties file) and the nodes start once more.
That happens before any topic exists, so nothing is at stake.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kdaemon.embedded import free_port
from testkit.cluster_admin import find_coordinator, leaders, wait_full_isr
from testkit.apache_kafka import HOST, KafkaCluster, start_kafka
from testkit.produce import create_topic
from testkit.proxy import CuttingProxy

PROXIED = "PROXIED"
REPLICAS = 3
# The controller fences a killed broker after this (Kafka's default is 9 s): leaders move sooner.
BROKER_SESSION_MS = 6000


@dataclass
class ChaosCluster:
    """The cluster, the proxy, and where each kind of client connects."""

    kafka: KafkaCluster
    proxy: CuttingProxy
    proxied_ports: dict[int, int]   # node id -> its PROXIED listener port

    @property
    def bootstrap(self) -> str:
        """Direct (PLAINTEXT): producers, admin calls."""
        return self.kafka.bootstrap

    @property
    def proxied_bootstrap(self) -> str:
        """Through the proxy: the daemon."""
        return ",".join(self.proxy.bootstrap((HOST, port)) for port in self.proxied_ports.values())

    def create_topics(self, topics: list[str], partitions: int) -> None:
        for topic in topics:
            create_topic(self.bootstrap, topic, partitions, replication=REPLICAS,
                         config={"min.insync.replicas": "2"})
        self.wait_in_sync(topics)

    def wait_in_sync(self, topics: list[str], timeout: float = 120.0) -> None:
        for topic in topics:
            wait_full_isr(self.bootstrap, topic, REPLICAS, timeout)

    def leaders(self, topic: str) -> dict[int, int]:
        return leaders(self.bootstrap, topic)

    def coordinator(self, group: str) -> int:
        return find_coordinator(self.kafka, group)

    def revive_all(self) -> None:
        for node_id, node in self.kafka.nodes.items():
            if not node.alive:
                self.kafka.restart(node_id)

    def stop(self) -> None:
        self.proxy.close()
        self.kafka.stop()


def start_chaos_cluster(directory: Path) -> ChaosCluster:
    kafka = start_kafka(directory, nodes=3,
                        extra_properties={"broker.session.timeout.ms": str(BROKER_SESSION_MS),
                                          "broker.heartbeat.interval.ms": "1000"})
    try:
        ports = {node_id: free_port() for node_id in kafka.nodes}
        proxy = CuttingProxy([(HOST, port) for port in ports.values()])
        for node_id, node in kafka.nodes.items():
            node.kill()
            forwarder = proxy.addresses[(HOST, ports[node_id])]
            listeners = {**node.ports, PROXIED: ports[node_id]}
            advertised = [f"{name}://{HOST}:{port}" for name, port in node.ports.items() if name != "CONTROLLER"]
            advertised.append(f"{PROXIED}://{forwarder[0]}:{forwarder[1]}")
            protocols = [f"{name}:{'SSL' if name == 'SSL' else 'SASL_SSL' if name == 'SASL_SSL' else 'PLAINTEXT'}"
                         for name in listeners]
            with open(node.properties, "a") as f:
                f.write("# the chaos run's proxied listener (testkit/chaos/cluster.py)\n"
                        f"listeners={','.join(f'{n}://{HOST}:{p}' for n, p in listeners.items())}\n"
                        f"advertised.listeners={','.join(advertised)}\n"
                        f"listener.security.protocol.map={','.join(protocols)}\n")
        for node in kafka.nodes.values():
            node.start()
        for node_id in kafka.nodes:
            kafka.restart(node_id)   # already started: waits until it serves
    except BaseException:
        kafka.stop()
        raise
    return ChaosCluster(kafka, proxy, ports)
