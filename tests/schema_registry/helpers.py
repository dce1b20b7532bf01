"""What the schema_registry tests share: a tiny registry over http.server, Avro bytes in the
Confluent wire format, and the worker's own deserialize stage under a chosen error policy."""

from __future__ import annotations

import io
import json
import ssl
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kdaemon_schema_registry
from kdaemon.client.types import ConsumerRecord
from kdaemon.config import parse
from kdaemon.plugins.manager import PluginManager
from kdaemon.sinks import builtin as builtin_sinks
from kdaemon.worker.build import build_pipeline_parts
from kdaemon.worker.pipeline import Pipeline


def wire(schema_id: int, payload: bytes) -> bytes:
    return struct.pack(">BI", 0, schema_id) + payload


def avro_bytes(schema_id: int, schema: dict, value, named: dict | None = None) -> bytes:
    import fastavro
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema, named_schemas={} if named is None else named), value)
    return wire(schema_id, out.getvalue())


class FakeRegistry:
    """Answers GET with ``routes[path] = (status, json-able body)``; records every request's
    path and Authorization header.  ``delay`` seconds before each answer (timeouts)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, tuple[int, object]] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.delay = 0.0
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                registry.requests.append((self.path, self.headers.get("Authorization")))
                if registry.delay:
                    time.sleep(registry.delay)
                status, body = registry.routes.get(
                    self.path, (404, {"error_code": 40403, "message": f"Schema not found: {self.path}"}))
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:     # the client gave up (timeout tests)
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.port = self.server.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def add_schema(self, schema_id: int, schema, *, schema_type: str | None = None,
                   references: list[dict] | None = None) -> None:
        body: dict = {"schema": schema if isinstance(schema, str) else json.dumps(schema)}
        if schema_type:
            body["schemaType"] = schema_type
        if references:
            body["references"] = references
        self.routes[f"/schemas/ids/{schema_id}"] = (200, body)

    def add_version(self, subject: str, version: int, schema, schema_id: int = 0,
                    references: list[dict] | None = None) -> None:
        from urllib.parse import quote
        body = {"subject": subject, "version": version, "id": schema_id,
                "schema": schema if isinstance(schema, str) else json.dumps(schema)}
        if references:
            body["references"] = references
        self.routes[f"/subjects/{quote(subject, safe='')}/versions/{version}"] = (200, body)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def deserialize_stage(policy: str, settings: dict, *, key: str = "bytes") -> Pipeline:
    """The worker's Pipeline (its deserialize stage) with this plugin as value deserializer."""
    manager = PluginManager(enabled=[])
    manager.register(kdaemon_schema_registry, "schema_registry")
    manager.register(builtin_sinks, "builtin-sinks")
    config = parse({"plugins": [], "kafka": {"bootstrap_servers": "x:1", "group_id": "g"},
                    "daemon": {"topics": ["t"], "on_deserialize_error": policy},
                    "deserializer": {"key": key, "value": "schema_registry_avro", "settings": settings},
                    "sink": {"type": "null"}, "dlq": {"type": "null"}})
    return Pipeline(config, build_pipeline_parts(config, manager))


def consumer_records(values: list[bytes | None], key: bytes | None = None) -> list[ConsumerRecord]:
    return [ConsumerRecord("t", 0, i, 0, 0, key, v, [], None) for i, v in enumerate(values)]
