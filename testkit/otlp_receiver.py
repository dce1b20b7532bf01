"""A real OTLP/HTTP receiver for tests: spans as an OpenTelemetry Collector would get them.

``OtlpReceiver`` serves ``POST /v1/traces`` on 127.0.0.1 (a thread of the test process),
decodes each ``ExportTraceServiceRequest`` (protobuf, gzip or not) with ``opentelemetry-proto``
and keeps its spans flattened into ``ReceivedSpan`` objects (ids as hex, attributes as plain
Python values, links, status, the resource's attributes).  It answers as the OTLP/HTTP
specification says: 200 with an empty ``ExportTraceServiceResponse``; 400 for a body that does
not decode (kept in ``errors``, so a test can say why).  Other paths (``/v1/metrics``,
``/v1/logs``) are answered 200 and their bodies kept raw in ``other``, for a test that decodes
them itself.

    with OtlpReceiver() as otlp:
        ... export to otlp.endpoint (the base URL, "http://127.0.0.1:PORT") ...
        spans = otlp.wait_for(lambda spans: [s for s in spans if s.name == "process t"], 30, "the spans")

``OtlpGrpcReceiver`` is the same over OTLP/gRPC (the ``TraceService`` of opentelemetry-proto's
generated stubs, plaintext), its ``endpoint`` "http://127.0.0.1:PORT" (the scheme tells the gRPC
exporter plaintext; without one it speaks TLS).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOST = "127.0.0.1"


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str          # "" for a root span
    name: str
    kind: str                    # "CONSUMER", "PRODUCER", "CLIENT", ... (SpanKind without its prefix)
    attributes: dict[str, Any]
    status: str                  # "UNSET", "OK" or "ERROR"
    status_message: str
    links: tuple[tuple[str, str], ...]   # (trace_id, span_id) of each link
    start_ns: int
    end_ns: int
    scope: str
    schema_url: str
    resource: dict[str, Any] = field(default_factory=dict)


def _value(v) -> Any:
    """An OTLP ``AnyValue`` as a Python value."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


def decode_traces(body: bytes) -> list[ReceivedSpan]:
    """Every span of one ``ExportTraceServiceRequest``, from its bytes."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return spans_of(request)


def spans_of(request) -> list[ReceivedSpan]:
    """Every span of a decoded ``ExportTraceServiceRequest``."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    out = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_span_id=s.parent_span_id.hex(),
                    name=s.name, kind=Span.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_"),
                    attributes={kv.key: _value(kv.value) for kv in s.attributes},
                    status=Status.StatusCode.Name(s.status.code).removeprefix("STATUS_CODE_"),
                    status_message=s.status.message,
                    links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    scope=ss.scope.name, schema_url=ss.schema_url or rs.schema_url, resource=resource))
    return out


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on a free port; ``spans`` grows as requests arrive."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.errors: list[str] = []
        self.other: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:   # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                path = self.path.split("?")[0]
                if path != "/v1/traces":
                    with receiver._lock:
                        receiver.other.setdefault(path, []).append(body)
                    self._answer(200, b"")
                    return
                try:
                    spans = decode_traces(body)
                except Exception as exc:   # kept for the test to show; the exporter sees a 400
                    with receiver._lock:
                        receiver.errors.append(f"{type(exc).__name__}: {exc}")
                    self._answer(400, b"")
                    return
                receiver._add(spans)
                self._answer(200, b"")   # an empty ExportTraceServiceResponse is zero bytes

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:   # quiet: the test's output is the spans
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://{HOST}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self.spans.extend(spans)
            self.requests += 1

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, select: Callable[[list[ReceivedSpan]], Any], timeout: float, what: str):
        """``select(spans)``'s first truthy answer as spans arrive; AssertionError naming ``what``
        and what did arrive after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            found = select(self.snapshot())
            if found:
                return found
            if time.monotonic() > deadline:
                names = sorted({s.name for s in self.snapshot()})
                raise AssertionError(f"timed out after {timeout} s waiting for {what}: {len(self.spans)} span(s) "
                                     f"received ({', '.join(names) or 'none'}), decoding errors: {self.errors}")
            time.sleep(0.05)


class OtlpGrpcReceiver(OtlpReceiver):
    """``OtlpReceiver`` over OTLP/gRPC: ``TraceService.Export`` on a free port, plaintext."""

    def __init__(self) -> None:   # noqa: super().__init__ not called: no HTTP server here
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.spans, self.requests, self.errors, self.other = [], 0, [], {}
        self._lock = threading.Lock()
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):   # noqa: N802 (the service's name)
                receiver._add(spans_of(request))
                return trace_service_pb2.ExportTraceServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._grpc)
        self.port = self._grpc.add_insecure_port(f"{HOST}:0")
        self.endpoint = f"http://{HOST}:{self.port}"

    def __enter__(self) -> OtlpGrpcReceiver:
        self._grpc.start()
        return self

    def __exit__(self, *exc) -> None:
        self._grpc.stop(grace=None)

