"""What the schema_registry tests share: a tiny registry over http.server, Avro bytes in the
Confluent wire format, the test .proto files (protos/) compiled by protoc into _pb2 modules,
and the worker's own deserialize stage under a chosen error policy."""

from __future__ import annotations

import importlib
import io
import json
import ssl
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
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
                    references: list[dict] | None = None, schema_type: str | None = None) -> None:
        from urllib.parse import quote
        body = {"subject": subject, "version": version, "id": schema_id,
                "schema": schema if isinstance(schema, str) else json.dumps(schema)}
        if schema_type:
            body["schemaType"] = schema_type
        if references:
            body["references"] = references
        self.routes[f"/subjects/{quote(subject, safe='')}/versions/{version}"] = (200, body)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


PROTOS = Path(__file__).with_name("protos")
PROTO_FILES = ("kdaemon_tests/common.proto", "kdaemon_tests/shop.proto")


def proto_source(name: str) -> str:
    """The text of a test .proto file (``kdaemon_tests/shop.proto``)."""
    return (PROTOS / name).read_text()


def compile_protos(out_dir: Path) -> dict[str, object]:
    """protoc (grpcio-tools) generates the _pb2 modules of protos/ into ``out_dir``, imported:
    ``{"common": common_pb2, "shop": shop_pb2}``.  Once per session: the modules register
    their files in protobuf's default pool, where a file name may exist once."""
    proc = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={PROTOS}",
                           f"--python_out={out_dir}", *PROTO_FILES], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    sys.path.insert(0, str(out_dir))
    return {name: importlib.import_module(f"kdaemon_tests.{name}_pb2") for name in ("common", "shop")}


def full_order(pb2):
    shop, common = pb2["shop"], pb2["common"]
    order = shop.Order(id=2**62 + 1, big=2**64 - 1, delta=-2**40, checksum=2**63 + 5, price=12.25, ratio=0.1,
                       paid=True, blob=b"\x00\xff", note="héllo", tags=["a", "b"], counts={"x": 2**50, "y": -1},
                       level=common.HIGH, phone="+47 1", coupon="", samples=[1, -2**63])
    order.total.currency, order.total.units, order.total.nanos = "EUR", 7, -5
    line = order.lines.add(sku="s-1", qty=3)
    line.note.text = "fragile"
    order.lines.add(sku="s-2")
    order.by_code[47].currency = "NOK"
    order.at.FromJsonString("2026-11-28T10:00:01.250Z")
    order.took.FromJsonString("1.5s")
    order.maybe.value = -2**60
    order.extra.update({"k": [1, "two", None], "b": True})
    return order


FULL_ORDER = {
    "id": 2**62 + 1, "big": 2**64 - 1, "delta": -2**40, "checksum": 2**63 + 5, "price": 12.25, "ratio": 0.1,
    "paid": True, "blob": b"\x00\xff", "note": "héllo",
    "total": {"currency": "EUR", "units": 7, "nanos": -5},
    "tags": ["a", "b"],
    "lines": [{"sku": "s-1", "qty": 3, "note": {"text": "fragile"}}, {"sku": "s-2", "qty": 0}],
    "counts": {"x": 2**50, "y": -1},
    "by_code": {47: {"currency": "NOK", "units": 0, "nanos": 0}},
    "level": "HIGH", "phone": "+47 1", "coupon": "",
    "at": "2026-11-28T10:00:01.250Z", "took": "1.500s", "maybe": -2**60,
    "extra": {"k": [1.0, "two", None], "b": True},
    "samples": [1, -2**63],
}
EMPTY_ORDER = {"id": 0, "big": 0, "delta": 0, "checksum": 0, "price": 0.0, "ratio": 0.0, "paid": False, "blob": b"",
               "note": "", "tags": [], "lines": [], "counts": {}, "by_code": {}, "level": "LEVEL_UNSPECIFIED",
               "samples": []}


def protobuf_wire(schema_id: int, indexes: list[int], message) -> bytes:
    """Confluent's Protobuf framing written by hand (the serializer's layout), for registries
    that are not asked to register anything: header, zigzag varint indexes, the message."""
    def zigzag(n: int) -> bytes:
        n = (n << 1) ^ (n >> 31)
        out = bytearray()
        while True:
            byte, n = n & 0x7F, n >> 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)
    head = b"\x00" if indexes == [0] else zigzag(len(indexes)) + b"".join(zigzag(i) for i in indexes)
    return wire(schema_id, head + message.SerializeToString())


def deserialize_stage(policy: str, settings: dict, *, key: str = "bytes",
                      value: str = "schema_registry_avro") -> Pipeline:
    """The worker's Pipeline (its deserialize stage) with this plugin as value deserializer."""
    manager = PluginManager(enabled=[])
    manager.register(kdaemon_schema_registry, "schema_registry")
    manager.register(builtin_sinks, "builtin-sinks")
    config = parse({"plugins": [], "kafka": {"bootstrap_servers": "x:1", "group_id": "g"},
                    "daemon": {"topics": ["t"], "on_deserialize_error": policy},
                    "deserializer": {"key": key, "value": value, "settings": settings},
                    "sink": {"type": "null"}, "dlq": {"type": "null"}})
    return Pipeline(config, build_pipeline_parts(config, manager))


def consumer_records(values: list[bytes | None], key: bytes | None = None) -> list[ConsumerRecord]:
    return [ConsumerRecord("t", 0, i, 0, 0, key, v, [], None) for i, v in enumerate(values)]
