"""Protobuf payloads: the writer's ``.proto`` schema from the registry, turned into descriptors at
run time, and each message decoded into a dict.

**Where the descriptors come from.**  A registry hands a PROTOBUF schema back in one of two
forms: the ``.proto`` source (what Java's serializer and most people register; Apicurio,
Karapace and Redpanda return what was registered), or a base64-encoded ``FileDescriptorProto``
(what confluent-kafka's Python serializer registers, and what Confluent's registry returns for
``?format=serialized``).  Base64 text is told apart strictly (``b64decode(validate=True)``
accepts no whitespace, ``;`` or ``{``, which every non-empty ``.proto`` file has) and parsed as
is.  Source is compiled by **protoc itself**, from grpcio-tools, run as ``python -m
grpc_tools.protoc`` with ``--descriptor_set_out``: the reference parser (every syntax, editions,
options, name resolution exactly as producers' code generators see it) instead of a
re-implementation such as proto-schema-parser, whose syntax tree we would have to resolve into
descriptors ourselves.  It runs in a child process, once per schema id: its error messages are
captured for the ``SchemaDecodeError`` instead of going to the worker's stderr, a compiler
crash cannot take the worker down, and importing ``grpc_tools.protoc`` (which installs import
hooks) is avoided.

**Imports.**  Each import of the file is one of the schema's references (fetched by subject and
version, depth first, compiled the same way and added to the pool under the reference's name,
as Confluent's deserializer does) or a well-known type the registry does not store
(``google/protobuf/*.proto``, and ``google/type/*.proto`` when googleapis-common-protos is
installed): those are the protobuf runtime's own descriptors.  Anything else is a
``SchemaDecodeError`` naming the import.  protoc is given all of them as ``--descriptor_set_in``.

**Caching.**  One ``DescriptorPool`` per schema id (two versions of one ``.proto`` file cannot
share a pool), built once, and one message class per (id, message indexes); a schema that
cannot be built is remembered for good (ids never change meaning).

**What comes out** (``message_to_dict``): a dict per message keyed by the ``.proto`` field names
(as ``MessageToDict(preserving_proto_field_name=True)``), every field without presence included
with its default (``always_print_fields_with_no_presence``), a field with presence (a message,
``optional``, a ``oneof`` member, proto2) only when set.  Unlike protobuf's JSON mapping, values
stay Python's own: **64-bit integers are ``int``, not strings** (the JSON mapping's strings exist
for JavaScript's doubles; Python's ints are exact and a sink writing JSON keeps them exact),
bytes are ``bytes`` (the jsonl sink writes ``{"base64": ...}``), enums are their value's name
(an unknown number stays an ``int``), maps are dicts, repeated fields lists, ``float`` fields
the shortest decimal that reads back to the same 32-bit float.  Well-known types as their JSON
mapping, since that is what people mean by them: ``Timestamp`` an RFC 3339 string, ``Duration``
``"1.5s"``, ``Struct``/``Value``/``ListValue`` plain JSON, the wrappers their value (int64 ones
as ``int``); ``Any``, ``FieldMask`` and ``Empty`` as plain messages.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import importlib.util
import re
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
    from google.protobuf.descriptor import Descriptor, FieldDescriptor
except ImportError:     # the factory reports it; importing the plugin must not fail
    descriptor_pb2 = None

from .built import BuiltPerId
from .client import RegisteredSchema, SchemaRegistryClient
from .errors import SchemaDecodeError
from .wire import message_indexes

# protoc takes ~0.1 s; a worker compiling blocks its loop, so this stays well inside the
# supervisor's [daemon] heartbeat_timeout_s (60 s by default).
PROTOC_TIMEOUT_S = 20.0
MAX_ERROR_LINES = 8                 # of protoc's messages, kept in a SchemaDecodeError
BUILTIN_PREFIXES = ("google/protobuf/", "google/type/")
_IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.MULTILINE)
_BUILTIN_NAME = re.compile(r"^google/(protobuf|type)/[a-z0-9_]+\.proto$")
# Well-known types whose JSON mapping is what a reader expects (see the module docstring).
_JSON_MAPPED = {"google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.Struct",
                "google.protobuf.Value", "google.protobuf.ListValue"}
_WRAPPERS = {f"google.protobuf.{n}Value" for n in
             ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")}


class ProtobufDecoder:
    """``decoder(schema_id, payload) -> dict``; raises ``SchemaRegistryError`` subclasses.

    ``payload`` is what follows the 5-byte header: message indexes, then the message."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        if descriptor_pb2 is None:
            raise ValueError("the Protobuf deserializer needs protobuf: pip install 'kdaemon[schema-registry]'")
        self.client = client
        # id -> (its own DescriptorPool, the file's FileDescriptorProto)
        self.file = BuiltPerId(client, "PROTOBUF", "Protobuf", self._build)
        self._classes: dict[tuple[int, tuple[int, ...]], type] = {}
        self._converters: dict[str, Callable] = {}   # "full name@pool id" -> message-to-dict function

    def __call__(self, schema_id: int, payload) -> dict:
        indexes, offset = message_indexes(payload)
        cls = self._classes.get((schema_id, indexes))
        if cls is None:
            cls = self.message_class(schema_id, indexes)
        message = cls()
        body = bytes(payload[offset:])
        try:
            message.ParseFromString(body)
        except Exception as exc:   # google.protobuf.message.DecodeError, RuntimeWarning-as-error, ...
            raise SchemaDecodeError(f"schema id {schema_id}: the payload ({len(body)} bytes) is not a valid "
                                    f"{cls.DESCRIPTOR.full_name} message: {type(exc).__name__}: {exc}") from None
        return self._converter(cls.DESCRIPTOR)(message)

    # -- descriptors -------------------------------------------------------------------------

    def message_class(self, schema_id: int, indexes: tuple[int, ...]) -> type:
        """The message class the indexes name in the schema ``schema_id``."""
        pool, file_proto = self.file(schema_id)
        names, container = [], file_proto.message_type
        for depth, index in enumerate(indexes):
            if index >= len(container):
                where = "the file's top-level messages" if depth == 0 else f"{'.'.join(names)}'s nested messages"
                raise SchemaDecodeError(f"schema id {schema_id}: message indexes {list(indexes)}: index {index} "
                                        f"is past {where} ({len(container)})")
            names.append(container[index].name)
            container = container[index].nested_type
        full_name = ".".join(([file_proto.package] if file_proto.package else []) + names)
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))
        self._classes[(schema_id, indexes)] = cls
        return cls

    def _build(self, registered: RegisteredSchema, what: str):
        """``(pool, FileDescriptorProto)`` of the writer's schema: its references first, then the
        file, in a pool of its own."""
        files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        self._resolve_references(registered, files, what, ())
        main = file_proto(registered.schema, f"{what.replace(' ', '-')}.proto", files, what, rename=False)
        pool = descriptor_pool.DescriptorPool()
        _add_to_pool(pool, main, files, set(), (), what)
        return pool, main

    def _resolve_references(self, registered: RegisteredSchema, files: dict, what: str, chain: tuple) -> None:
        """Fetch and build every reference of ``registered`` (depth first) into ``files``."""
        for ref in registered.references:
            if ref.name in files:
                continue
            if ref.name in chain:
                raise SchemaDecodeError(f"{what}: the references import each other in a cycle: "
                                        f"{' -> '.join(chain + (ref.name,))}")
            ref_what = f"{what}: reference {ref.name!r} (subject {ref.subject!r} version {ref.version})"
            referenced = self.client.schema_by_version(ref.subject, ref.version)
            if referenced.schema_type != "PROTOBUF":
                raise SchemaDecodeError(f"{ref_what} is a {referenced.schema_type} schema, not Protobuf")
            self._resolve_references(referenced, files, what, chain + (ref.name,))
            files[ref.name] = file_proto(referenced.schema, ref.name, files, ref_what)

    def _converter(self, descriptor) -> Callable:
        return _message_converter(descriptor, self._converters)


# -- schema text -> FileDescriptorProto --------------------------------------------------------

def file_proto(text: str, name: str, files: dict, what: str, *, rename: bool = True):
    """The ``FileDescriptorProto`` of one registry schema (base64 descriptor or ``.proto`` source),
    named ``name``: a reference goes by the import path others use for it (``rename``); the
    schema an id names keeps a descriptor's own name, ``name`` being for source, which has none."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = None
    if raw is not None:
        proto = descriptor_pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(raw)
        except Exception as exc:
            raise SchemaDecodeError(f"{what}: the schema is base64 but not a serialized FileDescriptorProto: "
                                    f"{type(exc).__name__}: {exc}") from None
        if rename or not proto.name:
            proto.name = name
        return proto
    return compile_proto(text, name, files, what)


def compile_proto(text: str, name: str, files: dict, what: str):
    """``.proto`` source -> ``FileDescriptorProto``, with protoc from grpcio-tools (see the module
    docstring for why protoc, and why in a child process)."""
    if importlib.util.find_spec("grpc_tools") is None:
        raise SchemaDecodeError(f"{what} is .proto source; compiling it needs grpcio-tools (protoc): "
                                "pip install 'kdaemon[schema-registry]'")
    deps = descriptor_pb2.FileDescriptorSet()
    given: set[str] = set()
    for dep in list(files.values()) + [builtin_file(n) for n in _builtin_imports(text, files)]:
        if dep is not None and dep.name not in given:
            given.add(dep.name)
            deps.file.append(dep)
    with tempfile.TemporaryDirectory(prefix="kdaemon-protoc-") as tmp:
        src = Path(tmp, "src")
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        Path(tmp, "deps.pb").write_bytes(deps.SerializeToString())
        out = Path(tmp, "out.pb")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "grpc_tools.protoc", f"--descriptor_set_in={tmp}/deps.pb",
                 f"--proto_path={src}", f"--descriptor_set_out={out}", name],
                capture_output=True, text=True, timeout=PROTOC_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SchemaDecodeError(f"{what}: protoc did not finish within {PROTOC_TIMEOUT_S:g} s") from None
        if proc.returncode != 0 or not out.is_file():
            lines = [ln.replace(f"{src}/", "") for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            shown = "; ".join(lines[:MAX_ERROR_LINES]) or f"exit code {proc.returncode}"
            raise SchemaDecodeError(f"{what}: not a valid .proto file: protoc: {shown}")
        result = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return next(f for f in result.file if f.name == name)


def _builtin_imports(text: str, files: dict) -> list[str]:
    """The well-known files ``text`` imports (and, through them, theirs), not given as references."""
    out: list[str] = []
    todo = [n for n in _IMPORT.findall(text) if n not in files]
    while todo:
        name = todo.pop()
        proto = builtin_file(name) if name not in out else None
        if proto is not None:
            out.append(name)
            todo.extend(d for d in proto.dependency if d not in out and d not in files)
    return out


_builtin_cache: dict[str, object] = {}


def builtin_file(name: str):
    """The protobuf runtime's own ``FileDescriptorProto`` for a well-known import
    (``google/protobuf/timestamp.proto`` -> ``google.protobuf.timestamp_pb2``), or None."""
    if name in _builtin_cache:
        return _builtin_cache[name]
    proto = None
    if _BUILTIN_NAME.match(name):
        try:
            module = importlib.import_module(name[:-len(".proto")].replace("/", ".") + "_pb2")
        except ImportError:
            module = None
        if module is not None and getattr(module, "DESCRIPTOR", None) is not None and module.DESCRIPTOR.name == name:
            proto = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
    _builtin_cache[name] = proto
    return proto


def _add_to_pool(pool, proto, files: dict, added: set, chain: tuple, what: str) -> None:
    """Add ``proto`` after its imports (references first, then the well-known files)."""
    for dep in proto.dependency:
        if dep in added:
            continue
        if dep in chain:
            raise SchemaDecodeError(f"{what}: imports form a cycle: {' -> '.join(chain + (dep,))}")
        found = files.get(dep) or builtin_file(dep)
        if found is None:
            hint = "" if dep.startswith(BUILTIN_PREFIXES) else " (add it as a reference when registering the schema)"
            raise SchemaDecodeError(f"{what}: {proto.name} imports {dep!r}, which is neither one of the schema's "
                                    f"references nor a well-known type this protobuf runtime has{hint}")
        _add_to_pool(pool, found, files, added, chain + (dep,), what)
    try:
        pool.Add(proto)
    except Exception as exc:    # TypeError, descriptor errors: the descriptor does not hold together
        raise SchemaDecodeError(f"{what}: {proto.name} does not build into descriptors: "
                                f"{type(exc).__name__}: {exc}") from None
    added.add(proto.name)


# -- message -> dict ------------------------------------------------------------------------------

def message_to_dict(message) -> dict:
    """One message as the module docstring says (no cache: for tests and one-offs)."""
    return _message_converter(message.DESCRIPTOR, {})(message)


def _shortest_float(value: float) -> float:
    """The shortest decimal that is the same 32-bit float (what protobuf's JSON printer does)."""
    if value != value or value in (float("inf"), float("-inf")):
        return value
    for digits in range(6, 10):
        rounded = float(f"{value:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", rounded))[0] == value:
            return rounded
    return value


def _identity(value):
    return value


def _scalar_converter(field) -> Callable:
    if field.type == FieldDescriptor.TYPE_FLOAT:
        return _shortest_float
    if field.type == FieldDescriptor.TYPE_ENUM:
        by_number = {v.number: v.name for v in field.enum_type.values}
        return lambda number: by_number.get(number, number)
    return _identity


def _message_converter(descriptor: Descriptor, cache: dict) -> Callable:
    """A function message -> dict for ``descriptor``, its plan built once (per pool)."""
    key = descriptor.full_name + "@" + str(id(descriptor.file.pool))
    if key in cache:
        return cache[key]
    if descriptor.full_name in _JSON_MAPPED:
        def convert(message):
            return json_format.MessageToDict(message)
        cache[key] = convert
        return convert
    if descriptor.full_name in _WRAPPERS:
        inner = _scalar_converter(descriptor.fields_by_name["value"])

        def convert(message):
            return inner(message.value)
        cache[key] = convert
        return convert

    plan: list[tuple[str, bool, Callable]] = []   # (name, has presence, value -> python)

    def convert(message):
        out = {}
        for name, presence, to_python in plan:
            if presence and not message.HasField(name):
                continue
            out[name] = to_python(getattr(message, name))
        return out

    cache[key] = convert            # before the fields: a message may contain itself
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_conv = _scalar_converter(field.message_type.fields_by_name["key"])
            value_field = field.message_type.fields_by_name["value"]
            value_conv = (_message_converter(value_field.message_type, cache) if value_field.message_type
                          else _scalar_converter(value_field))
            to_python = (lambda kc, vc: lambda m: {kc(k): vc(v) for k, v in m.items()})(key_conv, value_conv)
        else:
            one = (_message_converter(field.message_type, cache) if field.message_type
                   else _scalar_converter(field))
            to_python = (lambda c: lambda values: [c(v) for v in values])(one) if field.is_repeated else one
        plan.append((field.name, field.has_presence and not field.is_repeated, to_python))
    return convert
