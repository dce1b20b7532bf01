"""One blocking request/response over a plain socket, driven by kdaemon's own sans-IO connection.

Used to check that a broker is up and to ask it things the third-party clients hide (the exact
ApiVersions answer, say).  Not a client: one connection, one request, then close.
"""

from __future__ import annotations

import socket

from kdaemon.protocol.apis.api_versions import API_VERSIONS
from kdaemon.protocol.connection import KafkaConnection, Response
from kdaemon.protocol.schema import Api


def request(host: str, port: int, api: Api, version: int, body: dict, *,
            timeout: float = 5.0, client_id: str | None = "kdaemon-tests") -> Response:
    """Send one request and return the decoded response; raise OSError if the socket fails."""
    conn = KafkaConnection(client_id=client_id)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(conn.send(api, version, body))
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError(
                    f"{host}:{port} closed the connection before answering {api.name} v{version}")
            responses = conn.receive_data(data)
            if responses:
                return responses[0]


def api_versions(host: str, port: int, version: int = 3, *, timeout: float = 5.0) -> dict:
    """Return the decoded ApiVersions response body (v3+ sends client software name/version)."""
    body = {"client_software_name": "kdaemon-tests", "client_software_version": "0"}
    return request(host, port, API_VERSIONS, version, body, timeout=timeout).body

