"""A capturing Kafka proxy: what one client asked a broker, field by field, and what it was told.

``KafkaCapture(upstreams)`` listens on 127.0.0.1, one port per upstream broker, and forwards
whole frames.  Every request frame is recorded as an ``Exchange`` (monotonic time, connection,
api key and version, correlation id, client id, the decoded body) and completed with its response
(matched by correlation id on that connection).  Bodies are decoded with kdaemon.protocol's own
codec (``messages.decode_request`` / ``messages.read_response``); an API kdaemon has no spec for
(Java's telemetry, say) is recorded with its header only.

The client must see only the proxy: a broker advertises its own address in Metadata and
FindCoordinator answers, and a client connects wherever those say.  The proxy rewrites the
host and port of every proxied broker in those two answers to its own listener for that broker
(the other fields untouched).  A rewrite re-encodes the answer, so before it the proxy checks
that decoding and re-encoding the original gives back the broker's bytes exactly; if not (a field
kdaemon's spec does not know), the frame is forwarded as is and the mismatch goes to ``errors``
— a test asserts ``errors`` is empty, so a capture that may have missed connections cannot pass.
An answer naming a broker the proxy does not front goes to ``errors`` too.

Threads, not asyncio, as testkit/proxy.py: the clients under test run their own loops.
That proxy counts bytes to cut connections and never parses a frame, so this one is separate.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from kdaemon.protocol.apis import API_BY_KEY, FIND_COORDINATOR, METADATA, api_by_key
from kdaemon.protocol.errors import DecodeError
from kdaemon.protocol.messages import decode_request, encode_response, read_response
from kdaemon.protocol.primitives import Reader
from testkit.proxy import ListeningProxy, close_socket

_SIZE = struct.Struct(">i")
_CHUNK = 64 * 1024
_REWRITTEN = (METADATA.key, FIND_COORDINATOR.key)


@dataclass
class Exchange:
    """One request a client sent through the proxy, and the answer it got (if any yet)."""

    conn: int                     # connection number, in order of accept
    sent: float                   # time.monotonic() when the proxy had the whole request
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    request: dict | None          # None: kdaemon has no spec for this API (or decoding failed)
    received: float | None = None
    response: dict | None = None
    error: str | None = None      # why a body could not be decoded
    rewritten: bool = False       # the answer's broker addresses were pointed at the proxy

    @property
    def api_name(self) -> str:
        api = API_BY_KEY.get(self.api_key)
        return api.name if api is not None else f"api{self.api_key}"


def decode_request_frame(frame: bytes) -> tuple[int, int, int, str | None, dict | None, str | None]:
    """(api key, version, correlation id, client id, body or None, decode error or None) of a
    request frame without its size prefix.  The body is decoded when kdaemon implements the API
    at that version; the header is read in any case (it has one layout for every API)."""
    r = Reader(frame)
    api_key, version, correlation_id = r.int16(), r.int16(), r.int32()
    client_id = r.string(compact=False, nullable=True)
    api = API_BY_KEY.get(api_key)
    if api is None:
        return api_key, version, correlation_id, client_id, None, None
    if not api.min_version <= version <= api.max_version:
        return (api_key, version, correlation_id, client_id, None,
                f"{api.name} v{version} is outside kdaemon's spec ({api.min_version}-{api.max_version})")
    try:
        _, body = decode_request(api_by_key, frame)
    except (DecodeError, ValueError) as exc:
        return api_key, version, correlation_id, client_id, None, f"{api.name} v{version} request: {exc}"
    return api_key, version, correlation_id, client_id, body, None


class KafkaCapture(ListeningProxy):
    """A recording, address-rewriting proxy in front of ``upstreams`` [(host, port), ...]."""

    def __init__(self, upstreams) -> None:
        self._exchanges: list[Exchange] = []
        self._pending: dict[tuple[int, int], Exchange] = {}
        self.errors: list[str] = []
        super().__init__(upstreams, "capture")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.addresses.values())

    def exchanges(self, *api_keys: int) -> list[Exchange]:
        """What was captured so far, in the order the requests arrived (all APIs, or these)."""
        with self._lock:
            return [e for e in self._exchanges if not api_keys or e.api_key in api_keys]

    # -- plumbing ---------------------------------------------------------------------------------

    def _unreachable(self, upstream: tuple[str, int], exc: OSError) -> None:
        self._error(f"cannot reach {upstream}: {exc}")

    def _carry(self, client: socket.socket, server: socket.socket, number: int) -> None:
        threading.Thread(target=self._pump, args=(client, server, number, self._on_request), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, number, self._on_response), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: int, on_frame) -> None:
        buf = bytearray()
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                buf += data
                while len(buf) >= 4:
                    size = _SIZE.unpack_from(buf, 0)[0]
                    if len(buf) < 4 + size:
                        break
                    frame = bytes(buf[4:4 + size])
                    del buf[:4 + size]
                    dst.sendall(on_frame(conn, frame))
        except OSError:
            pass
        except Exception as exc:   # a bug here must fail the test, not hang the client
            self._error(f"connection {conn}: {type(exc).__name__}: {exc}")
        with self._lock:
            self._socks -= {src, dst}
        close_socket(src)
        close_socket(dst)

    def _on_request(self, conn: int, frame: bytes) -> bytes:
        key, version, corr, client_id, body, error = decode_request_frame(frame)
        ex = Exchange(conn, time.monotonic(), key, version, corr, client_id, body, error=error)
        with self._lock:
            self._exchanges.append(ex)
            self._pending[(conn, corr)] = ex
        if error is not None and key in _REWRITTEN:
            self._error(f"connection {conn}: {error}: its answer cannot be rewritten")
        return _SIZE.pack(len(frame)) + frame

    def _on_response(self, conn: int, frame: bytes) -> bytes:
        corr = _SIZE.unpack_from(frame, 0)[0]
        with self._lock:
            ex = self._pending.pop((conn, corr), None)
        if ex is None:
            self._error(f"connection {conn}: an answer with correlation id {corr} to no request")
            return _SIZE.pack(len(frame)) + frame
        ex.received = time.monotonic()
        api = API_BY_KEY.get(ex.api_key)
        if api is None or ex.request is None:
            return _SIZE.pack(len(frame)) + frame
        try:
            ex.response, _ = read_response(api, ex.api_version, frame, strict=True)
        except DecodeError as exc:
            ex.error = f"{api.name} v{ex.api_version} response: {exc}"
            if ex.api_key in _REWRITTEN:
                self._error(f"connection {conn}: {ex.error}: not rewritten")
            return _SIZE.pack(len(frame)) + frame
        if ex.api_key not in _REWRITTEN:
            return _SIZE.pack(len(frame)) + frame
        original = _SIZE.pack(len(frame)) + frame
        if encode_response(api, ex.api_version, corr, ex.response) != original:
            self._error(f"connection {conn}: {api.name} v{ex.api_version} answer does not re-encode "
                        "to the broker's bytes: not rewritten")
            return original
        rewritten = self._rewrite(ex)
        ex.rewritten = True
        return encode_response(api, ex.api_version, corr, rewritten)

    def _rewrite(self, ex: Exchange) -> dict:
        """A copy of the answer with every proxied broker's address replaced by the proxy's."""
        body = dict(ex.response)

        def moved(entry: dict) -> dict:
            entry = dict(entry)
            where = self.addresses.get((entry["host"], entry["port"]))
            if where is None:
                self._error(f"{ex.api_name}: broker {entry['host']}:{entry['port']} is not proxied")
            else:
                entry["host"], entry["port"] = where
            return entry

        if ex.api_key == METADATA.key:
            body["brokers"] = [moved(b) for b in body["brokers"]]
        elif ex.api_version >= 4:
            body["coordinators"] = [moved(c) if c["error_code"] == 0 else c for c in body["coordinators"]]
        elif body["error_code"] == 0:
            body.update({k: v for k, v in moved(body).items() if k in ("host", "port")})
        return body

    def _error(self, text: str) -> None:
        with self._lock:
            self.errors.append(text)
