"""TLS and SASL in front of a real broker, for tests: throwaway certificates, a SCRAM server
written from RFC 5802, and ``SecureProxy``, which terminates TLS and/or SASL and forwards
everything else to a plaintext broker.

Why a proxy: the Tansu the tests ship (0.6.0) cannot do either on its own.
* TLS: its ``--cert`` and ``--key`` options share a clap group, which makes them mutually
  exclusive ("the argument '--cert' cannot be used with '--key'"); either one alone is accepted
  and ignored, and the listener stays plaintext.
* SASL: ``--authentication`` offers SCRAM-SHA-256/512 (PLAIN is not built in: the broker closes
  the connection on that handshake), but users can only be created with ``tansu user create``,
  which the authenticating broker refuses (NOT_AUTHENTICATED), and the only local storage engine
  compiled in is ``memory://``, so a user cannot be created by a second, open broker either.
  Failure paths (unknown user) work against Tansu itself; success needs this proxy.
librdkafka's mock cluster has neither: it offers no SaslHandshake/SaslAuthenticate and ignores
``security.protocol``.

So Tansu runs plaintext with its advertised listener set to the proxy's port, and every
connection a client makes (bootstrap and the broker from metadata) goes through the proxy, which
behaves like a Kafka listener: TLS handshake, then ApiVersions, SaslHandshake and SaslAuthenticate
(ApiVersions is forwarded to Tansu, the two SASL APIs are answered here), then plain forwarding.
A failed authentication gets Kafka's error response and the connection is closed, as a Kafka
broker does.

The certificates are made with the ``openssl`` command line tool (the venv has no
``cryptography``); tests skip if it is missing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import selectors
import shutil
import socket
import ssl
import struct
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from kdaemon.protocol.apis import SASL_AUTHENTICATE, SASL_HANDSHAKE, api_by_key
from kdaemon.protocol.errors import Errors
from kdaemon.protocol.messages import decode_request, encode_response

HOST = "127.0.0.1"
_SIZE = struct.Struct(">i")
_API_VERSIONS_KEY = 18


# --- certificates ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pki:
    """PEM files: ``ca`` signed ``server`` (for localhost and 127.0.0.1) and ``wrong_host``
    (for kafka.invalid only); ``other_ca`` is an unrelated CA that signed nothing we serve."""

    ca: Path
    server_cert: Path
    server_key: Path
    wrong_host_cert: Path
    wrong_host_key: Path
    other_ca: Path
    client_cert: Path   # signed by ``ca`` for TLS client authentication (mTLS)
    client_key: Path


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    if proc.returncode:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _make_ca(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key.name, "-out", cert.name, "-days", "2", "-subj", f"/CN=kdaemon test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    return cert, key


def _make_leaf(d: Path, name: str, ca: tuple[Path, Path], san: str, usage: str = "serverAuth") -> tuple[Path, Path]:
    cert, key, csr, ext = d / f"{name}.pem", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key.name, "-out", csr.name, "-subj", f"/CN={name}", cwd=d)
    ext.write_text(f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
                   f"keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
                   "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    _openssl("x509", "-req", "-in", csr.name, "-CA", ca[0].name, "-CAkey", ca[1].name,
             "-CAcreateserial", "-out", cert.name, "-days", "2", "-extfile", ext.name, cwd=d)
    return cert, key


def make_pki(directory: Path) -> Pki:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca = _make_ca(d, "ca")
    other = _make_ca(d, "other-ca")
    server = _make_leaf(d, "server", ca, "DNS:localhost,IP:127.0.0.1")
    wrong = _make_leaf(d, "wrong-host", ca, "DNS:kafka.invalid")
    client = _make_leaf(d, "client", ca, "DNS:kdaemon-client", usage="clientAuth")
    return Pki(ca[0], server[0], server[1], wrong[0], wrong[1], other[0], client[0], client[1])


def server_context(cert: Path, key: Path, *, client_ca: Path | None = None) -> ssl.SSLContext:
    """A listener's TLS context; with ``client_ca`` it requires a client certificate signed by it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(client_ca)
    return ctx


# --- SCRAM server (RFC 5802 section 3, as Kafka's ScramSaslServer) ------------------------------

_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}


@dataclass(frozen=True)
class ScramCredential:
    """What a server stores for a user: never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_password(cls, mechanism: str, password: str, *, salt: bytes | None = None,
                      iterations: int = 4096) -> "ScramCredential":
        h = _HASHES[mechanism]
        salt = secrets.token_bytes(16) if salt is None else salt
        # Kafka's ScramFormatter salts the password's plain UTF-8 bytes (no SASLprep).
        salted = hashlib.pbkdf2_hmac(h().name, password.encode("utf-8"), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", h).digest()
        return cls(salt, iterations, h(client_key).digest(), hmac.new(salted, b"Server Key", h).digest())


class ScramAuthError(Exception):
    pass


class ScramServer:
    """One server-side SCRAM exchange: ``step(client_message)`` returns the next server message;
    ``done`` is set after the server-final message.  Raises ScramAuthError on a bad exchange."""

    def __init__(self, mechanism: str, credentials: dict[str, ScramCredential], *,
                 server_nonce: str | None = None) -> None:
        self._hash = _HASHES[mechanism]
        self._credentials = credentials
        self._server_nonce = server_nonce or base64.b64encode(secrets.token_bytes(18)).decode()
        self._state = "first"
        self.username: str | None = None
        self.done = False

    def step(self, message: bytes) -> bytes:
        text = message.decode("utf-8")
        if self._state == "first":
            return self._server_first(text)
        if self._state == "final":
            return self._server_final(text)
        raise ScramAuthError("SCRAM exchange already finished")

    def _server_first(self, text: str) -> bytes:
        gs2_cbind, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if gs2_cbind not in ("n", "y") or authzid:
            raise ScramAuthError("unsupported GS2 header")
        attrs = _attrs(bare)
        if "n" not in attrs or "r" not in attrs:
            raise ScramAuthError("client-first message lacks n= or r=")
        self.username = attrs["n"].replace("=2C", ",").replace("=3D", "=")
        cred = self._credentials.get(self.username)
        if cred is None:
            raise ScramAuthError("unknown user")
        self._cred = cred
        self._gs2 = f"{gs2_cbind},{authzid},"
        self._nonce = attrs["r"] + self._server_nonce
        self._client_first_bare = bare
        self._server_first = (f"r={self._nonce},s={base64.b64encode(cred.salt).decode()},"
                              f"i={cred.iterations}")
        self._state = "final"
        return self._server_first.encode()

    def _server_final(self, text: str) -> bytes:
        without_proof, _, proof_attr = text.rpartition(",p=")
        attrs = _attrs(without_proof)
        if attrs.get("c") != base64.b64encode(self._gs2.encode()).decode():
            raise ScramAuthError("channel binding does not match the GS2 header")
        if attrs.get("r") != self._nonce:
            raise ScramAuthError("nonce mismatch")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.new(self._cred.stored_key, auth_message, self._hash).digest()
        proof = base64.b64decode(proof_attr)
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if len(proof) != len(signature) or \
                not hmac.compare_digest(self._hash(client_key).digest(), self._cred.stored_key):
            raise ScramAuthError("invalid proof")
        self._state = "done"
        self.done = True
        verifier = hmac.new(self._cred.server_key, auth_message, self._hash).digest()
        return b"v=" + base64.b64encode(verifier)


def _attrs(text: str) -> dict[str, str]:
    return {part[0]: part[2:] for part in text.split(",") if len(part) >= 2 and part[1] == "="}


# --- the proxy ---------------------------------------------------------------------------------

class SecureProxy:
    """A TLS and/or SASL listener on 127.0.0.1 in front of a plaintext broker.

    ``configure`` sets what new connections get (a server SSLContext or None; SASL users and the
    mechanisms enabled, or None for no SASL); connections already open keep what they had.
    Counters: ``connections`` accepted, ``tls_failures``, ``auth_successes``, ``auth_failures``.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server((HOST, 0))
        self.port: int = self._listener.getsockname()[1]
        self.upstream: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        self.configure()

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def configure(self, *, ssl_context: ssl.SSLContext | None = None, users: dict[str, str] | None = None,
                  mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")) -> None:
        with self._lock:
            self._ssl_context = ssl_context
            self._users = users
            self._mechanisms = mechanisms
            self._scram = {m: {u: ScramCredential.from_password(m, p) for u, p in (users or {}).items()}
                           for m in _HASHES}
            self.connections = self.tls_failures = self.auth_successes = self.auth_failures = 0
            self.failure_messages: list[str] = []

    def start(self, upstream: tuple[str, int]) -> "SecureProxy":
        self.upstream = upstream
        t = threading.Thread(target=self._accept_loop, name=f"secure-proxy-{self.port}", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def close(self) -> None:
        self._closing.set()
        # shutdown, not only close: on Linux closing a socket does not wake a thread blocked in
        # accept() or recv() on it.
        with self._lock:
            sockets = [self._listener, *self._open]
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> "SecureProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- per connection --

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                settings = (self._ssl_context, self._users, self._mechanisms, self._scram)
            t = threading.Thread(target=self._serve, args=(sock, settings), daemon=True)
            t.start()
            self._threads.append(t)

    def _track(self, s: socket.socket) -> socket.socket:
        with self._lock:
            self._open.add(s)
        return s

    def _serve(self, sock: socket.socket, settings) -> None:
        ssl_context, users, mechanisms, scram = settings
        client = self._track(sock)
        upstream = None
        try:
            client.settimeout(10)
            if ssl_context is not None:
                try:
                    client = self._track(ssl_context.wrap_socket(sock, server_side=True))
                except (ssl.SSLError, OSError):
                    with self._lock:
                        self.tls_failures += 1
                    return
            upstream = self._track(socket.create_connection(self.upstream, timeout=10))
            if users is not None and not self._authenticate(client, upstream, users, mechanisms, scram):
                return
            self._pump(client, upstream)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass

    def _authenticate(self, client, upstream, users, mechanisms, scram) -> bool:
        mechanism = None
        server = None
        while True:
            frame = _read_frame(client)
            if frame is None:
                return False
            api_key = struct.unpack_from(">h", frame, 0)[0]
            if api_key == _API_VERSIONS_KEY:
                upstream.sendall(_SIZE.pack(len(frame)) + frame)
                answer = _read_frame(upstream)
                if answer is None:
                    return False
                client.sendall(_SIZE.pack(len(answer)) + answer)
                continue
            if api_key == SASL_HANDSHAKE.key:
                header, body = decode_request(api_by_key, frame)
                mechanism = body["mechanism"]
                ok = mechanism in mechanisms
                client.sendall(encode_response(SASL_HANDSHAKE, header.api_version, header.correlation_id, {
                    "error_code": 0 if ok else Errors.UNSUPPORTED_SASL_MECHANISM,
                    "mechanisms": list(mechanisms)}))
                if not ok:
                    return self._failed(f"mechanism {mechanism} not enabled")
                continue
            if api_key == SASL_AUTHENTICATE.key and mechanism is not None:
                header, body = decode_request(api_by_key, frame)
                token = bytes(body["auth_bytes"])
                if mechanism == "PLAIN":
                    _, user, password = (token.decode("utf-8").split("\0") + ["", "", ""])[:3]
                    ok = user in users and hmac.compare_digest(users[user].encode(), password.encode())
                    reply, finished, error = b"", ok, None if ok else "Invalid username or password"
                else:
                    if server is None:
                        server = ScramServer(mechanism, scram[mechanism])
                    try:
                        reply, finished, error = server.step(token), server.done, None
                    except (ScramAuthError, ValueError) as exc:
                        reply, finished, error = b"", False, str(exc)
                if error is not None:
                    # Kafka's wording; it names the mechanism, never the user or the password.
                    message = ("Authentication failed during authentication due to invalid "
                               f"credentials with SASL mechanism {mechanism}")
                    client.sendall(encode_response(SASL_AUTHENTICATE, header.api_version, header.correlation_id, {
                        "error_code": Errors.SASL_AUTHENTICATION_FAILED, "error_message": message,
                        "auth_bytes": b"", "session_lifetime_ms": 0}))
                    return self._failed(error)
                client.sendall(encode_response(SASL_AUTHENTICATE, header.api_version, header.correlation_id, {
                    "error_code": 0, "error_message": None, "auth_bytes": reply, "session_lifetime_ms": 0}))
                if finished:
                    with self._lock:
                        self.auth_successes += 1
                    return True
                continue
            # Anything else before authentication: Kafka closes the connection.
            return self._failed(f"API key {api_key} before authentication")

    def _failed(self, why: str) -> bool:
        with self._lock:
            self.auth_failures += 1
            self.failure_messages.append(why)
        return False

    def _pump(self, client, upstream) -> None:
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, client)
        try:
            while not self._closing.is_set():
                ready = [key.fileobj for key, _ in sel.select(0.1)]
                if isinstance(client, ssl.SSLSocket) and client.pending() and client not in ready:
                    ready.append(client)
                for src in ready:
                    dst = upstream if src is client else client
                    data = src.recv(1 << 16)
                    if not data:
                        return
                    dst.sendall(data)
        finally:
            sel.close()


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exact(sock, 4)
    if head is None:
        return None
    return _read_exact(sock, _SIZE.unpack(head)[0])


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
