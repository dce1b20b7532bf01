"""The fuzz targets: one function per decoding surface, and the oracle they share.

A target is built by ``build(name)`` *after* atheris has started instrumenting imports, so
every kdaemon import happens inside the builders (``run.py`` wraps the call).  Each returns a
``Target``: the function libFuzzer calls with one input, and the exception types that input is
allowed to raise.  Everything else is a finding.

Input layouts (a leading byte or two steer the decoder so one corpus covers every mode; the
seeds in ``corpus/<target>/`` are written in these layouts by ``make_corpus.py``):

* records_*: ``mode`` byte + a record set as a Fetch response carries it.  ``mode`` bit 0: CRC
  checks on; bits 1-2: header filter (none, native-capable rules, rules with a regex that only
  Python evaluates, a plain callable); bit 3: read_committed with the first batch's producer
  aborted; bits 4-5: fetch offset 0, 1, 3 or 2**62.
* responses: ``api_key`` byte, ``version`` byte, then the response frame after its size prefix
  (correlation id first).  An (api, version) pair the client never sends is folded onto one it
  does, so every mutation decodes something.  Keys 250/251 are the consumer-protocol
  subscription / assignment bytes that JoinGroup / SyncGroup responses carry.
* sasl: ``mode`` byte (bit 0: SHA-512, bit 1: also drive PLAIN), server-first, a NUL byte,
  server-final.  The client nonce is ``SCRAM_NONCE``, the one ``make_corpus.py`` pinned while
  capturing, so a seed's real server-final verifies.
* config: TOML text as a file ``kdaemon.config.load`` reads.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

SCRAM_NONCE_BYTES = bytes(range(24))
SCRAM_NONCE = base64.b64encode(SCRAM_NONCE_BYTES).decode("ascii")
SCRAM_USER = "fuzz"
SCRAM_PASSWORD = "fuzz-password"
CONSUMER_PROTOCOL_KEYS = {250: "subscription", 251: "assignment"}
MAX_UNCOMPRESSED = 1 << 20   # the reader's limit for a batch; small so a zip bomb costs little
FETCH_OFFSETS = (0, 1, 3, 1 << 62)
SPEEDUPS_ENV = "KDAEMON_FUZZ_SPEEDUPS"
"""Path of an alternative build of ``_speedups`` (the sanitized one) for the records_c target."""
SCRATCH_ENV = "KDAEMON_FUZZ_SCRATCH"


class Mismatch(AssertionError):
    """The C and the Python record loops disagree on one input: a finding, whatever the types."""


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    allowed: tuple[type[BaseException], ...]


def build(name: str) -> Target:
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise SystemExit(f"unknown fuzz target {name!r} (known: {', '.join(BUILDERS)})") from None
    return builder()


# -- record sets -------------------------------------------------------------------------------

def _header_filters():
    from kdaemon.protocol.header_match import HeaderRule, HeaderRules
    many = tuple(f"v{i}" for i in range(20))   # more than 16 values: a frozenset natively
    native = HeaderRules([
        HeaderRule("drop", "exists", keep=False),
        HeaderRule("h", "equals", ("v",), keep=False),
        HeaderRule("k", "prefix", ("ke",), keep=True),
        HeaderRule("s", "in", many, keep=False),
        HeaderRule("m", "missing", keep=False),
    ], default=True)
    regex = HeaderRules([HeaderRule("h", "regex", ("^v[0-9]",), keep=False)], default=True)
    return (None, native, regex, lambda headers: len(headers) % 2 == 0)


def _first_producer_id(data: bytes) -> int:
    return int.from_bytes(data[43:51], "big", signed=True) if len(data) >= 51 else 0


def _read(records_module, data: bytes, mode: int, header_filter, *, c_loop) -> tuple:
    """Decode a record set with one loop; the outcome as comparable data."""
    records_module._decode_v2_records = c_loop if c_loop is not None else _python_loop()
    records_module.ACCELERATED = c_loop is not None
    aborted = [(_first_producer_id(data), 0)] if mode & 0x08 else None
    reader = records_module.RecordSetReader(
        memoryview(data), topic="t", partition=0, fetch_offset=FETCH_OFFSETS[(mode >> 4) & 3],
        header_filter=header_filter, check_crcs=bool(mode & 1), aborted_transactions=aborted,
        max_uncompressed_batch_bytes=MAX_UNCOMPRESSED)
    from kdaemon.protocol.errors import ProtocolError
    try:
        records = reader.read_all()
    except ProtocolError as exc:
        return ("error", type(exc).__name__, reader.next_offset, reader.filtered)
    for r in records:
        if type(r.key) not in (bytes, type(None)) or type(r.value) not in (bytes, type(None)):
            raise Mismatch(f"record key/value of type {type(r.key).__name__}/{type(r.value).__name__}")
    return ("ok", [tuple(r) for r in records], reader.next_offset, reader.truncated,
            reader.filtered, reader.control, reader.aborted)


def _python_loop():
    from kdaemon.protocol import record_loop
    return record_loop.python_loop


def _c_loop():
    """The C loop: the sanitized build named by KDAEMON_FUZZ_SPEEDUPS, else the installed one."""
    from kdaemon.protocol import record_loop
    path = os.environ.get(SPEEDUPS_ENV)
    if path:
        spec = importlib.util.spec_from_file_location("kdaemon.protocol._speedups", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.configure(record_loop.ConsumerRecord)
        return module.decode_v2_records
    if record_loop.accelerated_loop is None:
        raise SystemExit("the C record loop is not built (or KDAEMON_PURE_PYTHON is set)")
    return record_loop.accelerated_loop


def _records_python() -> Target:
    from kdaemon.protocol import records
    from kdaemon.protocol.errors import ProtocolError
    filters = _header_filters()

    def run(data: bytes) -> None:
        if not data:
            return
        mode, body = data[0], data[1:]
        _read(records, body, mode, filters[(mode >> 1) & 3], c_loop=None)
    return Target("records_python", run, (ProtocolError,))


def _records_c() -> Target:
    from kdaemon.protocol import records
    from kdaemon.protocol.errors import ProtocolError
    filters = _header_filters()
    c_loop = _c_loop()

    def run(data: bytes) -> None:
        if not data:
            return
        mode, body = data[0], data[1:]
        header_filter = filters[(mode >> 1) & 3]
        got = _read(records, body, mode, header_filter, c_loop=c_loop)
        want = _read(records, body, mode, header_filter, c_loop=None)
        if got != want:
            raise Mismatch(f"C loop gave {_short(got)}, Python loop gave {_short(want)}")
    return Target("records_c", run, (ProtocolError,))


def _short(outcome: tuple) -> str:
    if outcome[0] == "error":
        return f"{outcome[1]} (next_offset={outcome[2]}, filtered={outcome[3]})"
    return f"{len(outcome[1])} records, next_offset={outcome[2]}, counts={outcome[3:]}"


# -- API responses -----------------------------------------------------------------------------

def _responses() -> Target:
    from kdaemon.protocol import messages
    from kdaemon.protocol.apis import ALL_APIS, consumer_protocol
    from kdaemon.protocol.errors import BrokerError, ProtocolError
    pairs = [(api, v) for api in ALL_APIS for v in range(api.min_version, api.max_version + 1)]
    by_pair = {(api.key, v): (api, v) for api, v in pairs}
    decode_extra = {250: consumer_protocol.decode_subscription, 251: consumer_protocol.decode_assignment}

    def run(data: bytes) -> None:
        if len(data) < 2:
            return
        key, version, frame = data[0], data[1], memoryview(data[2:])
        if key in decode_extra:
            decode_extra[key](frame)
            return
        api, version = by_pair.get((key, version)) or pairs[(key * 256 + version) % len(pairs)]
        body, trailing = messages.read_response(api, version, frame, strict=False)
        if not isinstance(body, dict) or not 0 <= trailing <= len(frame):
            raise AssertionError(f"{api.name} v{version}: body {type(body).__name__}, trailing {trailing}")
        if trailing == 0:
            messages.read_response(api, version, frame, strict=True)
    return Target("responses", run, (ProtocolError, BrokerError))


# -- SASL --------------------------------------------------------------------------------------

def _sasl() -> Target:
    from kdaemon.client.sasl import PlainMechanism, SaslError, ScramMechanism

    def run(data: bytes) -> None:
        if not data:
            return
        mode, rest = data[0], data[1:]
        if mode & 2:
            plain = PlainMechanism(SCRAM_USER, SCRAM_PASSWORD)
            plain.first_message()
            if plain.receive(rest) is not None or not plain.done:
                raise AssertionError("PLAIN did not finish on the broker's answer")
        server_first, sep, server_final = rest.partition(b"\0")
        mechanism = "SCRAM-SHA-512" if mode & 1 else "SCRAM-SHA-256"
        scram = ScramMechanism(mechanism, SCRAM_USER, SCRAM_PASSWORD, nonce=SCRAM_NONCE)
        scram.first_message()
        client_final = scram.receive(server_first)
        if not isinstance(client_final, bytes) or scram.done:
            raise AssertionError("server-first did not lead to a client-final message")
        if not sep:
            return
        if scram.receive(server_final) is not None or not scram.done:
            raise AssertionError("server-final accepted but the exchange is not done")
        try:
            scram.receive(server_final)
        except SaslError:
            return
        raise AssertionError("a message after the exchange finished was accepted")
    return Target("sasl", run, (SaslError,))


# -- configuration -----------------------------------------------------------------------------

def _config() -> Target:
    from kdaemon.config import ConfigError, load
    fd, path = tempfile.mkstemp(prefix="kdaemon-fuzz-", suffix=".toml", dir=_scratch_dir())
    os.close(fd)
    environ = {"KDAEMON_FUZZ_SECRET": "s3cret"}

    def run(data: bytes) -> None:
        with open(path, "wb") as fh:
            fh.write(data)
        load(path, environ=environ)
    return Target("config", run, (ConfigError,))


def _scratch_dir() -> str | None:
    """The runner's scratch directory (it removes it afterwards), else the system's."""
    return os.environ.get(SCRATCH_ENV) or None


BUILDERS: dict[str, Callable[[], Target]] = {
    "records_python": _records_python,
    "records_c": _records_c,
    "responses": _responses,
    "sasl": _sasl,
    "config": _config,
}
NAMES = tuple(BUILDERS)
