"""SASL mechanisms as pure state machines: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, 7677).

Each mechanism produces the bytes to send in SaslAuthenticate and consumes the broker's answers;
the connection layer does the I/O.  One object serves one exchange: a re-authentication (KIP-368,
see connection.py) starts a new one, so SCRAM gets a fresh nonce each time.  Credentials are held
in objects whose ``repr`` hides them and never appear in error messages.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets


class SaslError(Exception):
    """The SASL exchange failed; the message never contains credentials."""


class PlainMechanism:
    name = "PLAIN"

    def __init__(self, username: str, password: str) -> None:
        self._username = username
        self._password = password
        self.done = False

    def __repr__(self) -> str:
        return "PlainMechanism(username=<hidden>)"

    def first_message(self) -> bytes:
        return b"\0" + self._username.encode("utf-8") + b"\0" + self._password.encode("utf-8")

    def receive(self, data: bytes) -> bytes | None:
        self.done = True
        return None


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramMechanism:
    """SCRAM-SHA-256 / SCRAM-SHA-512 client (no channel binding, as Kafka uses it).

    The exchange, one step per state (a message in any other state is a SaslError):

        start       first_message()            -> client-first sent    -> sent-first
        sent-first  receive(server-first)      -> client-final sent    -> sent-final
        sent-final  receive(server-final)      -> signature verified   -> done
    """

    MIN_ITERATIONS = 4096
    # Kafka brokers accept 4096..16384; a larger count from a broker is a way to make us burn
    # CPU in PBKDF2 while holding the network lock.
    MAX_ITERATIONS = 16384

    def __init__(self, mechanism: str, username: str, password: str, *, nonce: str | None = None) -> None:
        if mechanism == "SCRAM-SHA-256":
            self._hash = hashlib.sha256
        elif mechanism == "SCRAM-SHA-512":
            self._hash = hashlib.sha512
        else:
            raise ValueError(f"not a SCRAM mechanism: {mechanism}")
        self.name = mechanism
        self._username = username
        self._password = password
        self._nonce = nonce or base64.b64encode(secrets.token_bytes(24)).decode("ascii")
        self._client_first_bare = ""
        self._server_signature = b""
        self._state = "start"
        self.done = False

    def __repr__(self) -> str:
        return f"ScramMechanism({self.name}, username=<hidden>)"

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash).digest()

    def first_message(self) -> bytes:
        self._client_first_bare = f"n={_saslname(self._username)},r={self._nonce}"
        self._state = "sent-first"
        return ("n,," + self._client_first_bare).encode("utf-8")

    def receive(self, data: bytes) -> bytes | None:
        """Feed a server message; return the next client message, or None when finished."""
        text = data.decode("utf-8", errors="replace")
        if self._state == "sent-first":
            return self._client_final(text)
        if self._state == "sent-final":
            self._verify_server_final(text)
            return None
        raise SaslError(f"unexpected SCRAM message in state {self._state}")

    def _client_final(self, server_first: str) -> bytes:
        attrs = _parse_attrs(server_first)
        if "e" in attrs:
            raise SaslError(f"server rejected the SCRAM exchange: {attrs['e']}")
        try:
            nonce, salt_b64, iterations = attrs["r"], attrs["s"], int(attrs["i"])
            salt = base64.b64decode(salt_b64, validate=True)
        except (KeyError, ValueError) as exc:
            raise SaslError(f"malformed SCRAM server-first message ({type(exc).__name__})") from None
        if not nonce.startswith(self._nonce) or len(nonce) <= len(self._nonce):
            raise SaslError("SCRAM server nonce does not extend the client nonce")
        if not self.MIN_ITERATIONS <= iterations <= self.MAX_ITERATIONS:
            raise SaslError(f"SCRAM iteration count {iterations} is outside "
                            f"{self.MIN_ITERATIONS}..{self.MAX_ITERATIONS}")
        # No SASLprep: Kafka's ScramFormatter salts the password's plain UTF-8 bytes, on the client
        # and when credentials are created, so normalising here breaks non-ASCII passwords.
        salted = hashlib.pbkdf2_hmac(self._hash().name, self._password.encode("utf-8"), salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = self._hash(client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode("utf-8")
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        server_key = self._hmac(salted, b"Server Key")
        self._server_signature = self._hmac(server_key, auth_message)
        self._state = "sent-final"
        return f"{without_proof},p={base64.b64encode(proof).decode('ascii')}".encode("utf-8")

    def _verify_server_final(self, server_final: str) -> None:
        attrs = _parse_attrs(server_final)
        if "e" in attrs:
            raise SaslError(f"server rejected the SCRAM proof: {attrs['e']}")
        try:
            verifier = base64.b64decode(attrs["v"], validate=True)
        except (KeyError, ValueError):
            raise SaslError("malformed SCRAM server-final message") from None
        if not hmac.compare_digest(verifier, self._server_signature):
            raise SaslError("SCRAM server signature does not verify: the server does not know the password")
        self._state = "done"
        self.done = True


def _parse_attrs(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        if len(part) >= 2 and part[1] == "=":
            out[part[0]] = part[2:]
    return out


def make_mechanism(name: str, username: str, password: str):
    if name == "PLAIN":
        return PlainMechanism(username, password)
    if name.startswith("SCRAM-"):
        return ScramMechanism(name, username, password)
    raise ValueError(f"unsupported SASL mechanism {name}")
