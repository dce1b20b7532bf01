"""Ports for the servers tests start (Kafka, Spark): free, and below the ephemeral range.

A port from ``bind(0)`` comes from the kernel's ephemeral range, which every outgoing connection
of the test run also draws from: in the seconds a JVM takes to bind it, a client's socket can
take it (CI lost a three-node Kafka start that way).  Ports below the range are only taken by
listeners; ones this process chose before are not handed out again.
"""

from __future__ import annotations

import random
import socket

HOST = "127.0.0.1"
LISTEN_PORTS = (20000, 32768)   # below Linux's default ephemeral range (32768-60999)
_chosen: set[int] = set()


class NoFreePort(RuntimeError):
    pass


def listen_port() -> int:
    for _ in range(1000):
        port = random.randrange(*LISTEN_PORTS)
        if port in _chosen:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        _chosen.add(port)
        return port
    raise NoFreePort(f"no free port in {LISTEN_PORTS[0]}-{LISTEN_PORTS[1] - 1}")
