"""Kafka's own JSON message definitions, and a field-by-field comparison of our specs with them.

Two copies of the definitions are read, never any code beside them:

* ``kafka_release_json(name)``: the ``common/message/*.json`` files packed inside the
  kafka-clients jar of the Kafka release the tests run against (``testkit/apache_kafka.py``),
  resolved from Maven Central like the broker itself, so a test using it needs what a ``kafka``
  test needs, but no running broker.  This is the release our specs claim to match.
* ``kafka_python_json_dir()``: the copy kafka-python 3 ships (older; a benchmark dependency),
  or None when it is not installed.

``compare_struct`` checks names and order, versions, nullable versions, tags, types, nesting and
defaults, the way Kafka's generator reads them.
"""

from __future__ import annotations

import importlib.util
import json
import re
import uuid
import zipfile
from pathlib import Path

from kdaemon.protocol.schema import NEVER, Array, Primitive, Struct, Versions


def kafka_python_json_dir() -> Path | None:
    spec = importlib.util.find_spec("kafka")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "protocol" / "schemas" / "resources"
    return path if path.is_dir() else None


def kafka_release_json(name: str) -> dict:
    """``name`` (e.g. ``"ShareFetchRequest"``) from the test broker's kafka-clients jar."""
    from testkit.apache_kafka import KAFKA_VERSION, kafka_clients_jar
    with zipfile.ZipFile(kafka_clients_jar()) as jar:
        try:
            text = jar.read(f"common/message/{name}.json").decode()
        except KeyError:
            raise AssertionError(f"kafka-clients {KAFKA_VERSION} has no {name}.json") from None
    return parse_kafka_json(text)


def load_kafka_json(path: Path) -> dict:
    return parse_kafka_json(path.read_text())


def parse_kafka_json(text: str) -> dict:
    """Kafka's JSON files carry // comments; drop them (outside strings) before parsing."""
    out = []
    for line in text.splitlines():
        in_string = False
        cut = len(line)
        for i, ch in enumerate(line):
            if ch == '"' and (i == 0 or line[i - 1] != "\\"):
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                cut = i
                break
        out.append(line[:cut])
    return json.loads("\n".join(out))


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


# What Kafka's generated code starts a field without a "default" at.
JSON_ZERO = {"int8": 0, "int16": 0, "uint16": 0, "int32": 0, "uint32": 0, "int64": 0,
             "float64": 0.0, "bool": False, "string": "", "bytes": b"", "uuid": uuid.UUID(int=0),
             "records": None}


def json_default(kind: str, text):
    if text == "null":
        return None
    if kind == "bool":
        return str(text).lower() == "true"
    if kind in ("string",):
        return text
    return int(str(text), 0)


def compare_struct(ours: Struct, json_fields: list, common: dict, where: str, lowest: int = 0) -> None:
    """``lowest``: the oldest version the JSON still defines.  A newer release drops the fields
    of versions it no longer accepts (KIP-896: OffsetCommit v1's commit timestamp), which we may
    still speak to older brokers: our fields that end below ``lowest`` are passed over."""
    fields = [f for f in ours.fields if f.versions.hi is None or f.versions.hi >= lowest]
    assert [f.name for f in fields] == [snake(j["name"]) for j in json_fields], where
    for f, j in zip(fields, json_fields):
        here = f"{where}.{f.name}"
        assert f.versions == Versions.parse(j["versions"]), here
        assert f.nullable == Versions.parse(j.get("nullableVersions", "none")), here
        if "taggedVersions" in j:
            assert f.tag == j["tag"] and f.versions == Versions.parse(j["taggedVersions"]), here
        else:
            assert f.tag is None, here
        jtype = j["type"]
        is_array = jtype.startswith("[]")
        inner = jtype[2:] if is_array else jtype
        sub_fields = j.get("fields") or (common[inner]["fields"] if inner in common else None)
        t = f.type
        if is_array:
            assert isinstance(t, Array), here
            t = t.of
        if sub_fields is not None:
            assert isinstance(t, Struct), here
            compare_struct(t, sub_fields, common, here, lowest)
            if is_array:
                assert f.default_value() in ([], None), here
            elif j.get("default") == "null":
                assert f.default_value() is None, here
            else:   # a struct that is always there starts as its fields' defaults
                assert f.nullable == NEVER and f.default_value() == t.default(), here
            continue
        assert isinstance(t, Primitive) and t.kind == inner, here
        if is_array:
            expected = None if j.get("default") == "null" else []
            assert f.default_value() == expected or (f.nullable.lo is not None and f.default_value() is None), here
        elif "default" in j:
            assert f.default_value() == json_default(inner, j["default"]), here
        else:
            # No default in the JSON: Kafka's generated code uses the type's zero value; our DSL
            # uses None for a nullable field unless told otherwise.  Either is accepted here.
            assert f.default_value() == JSON_ZERO[inner] or (
                f.nullable.lo is not None and f.default_value() is None), here


def assert_matches_release(api, side: str, *, below_baseline: bool = False) -> None:
    """``api``'s ``side`` ("request" or "response") field by field against the definition in the
    Kafka release the tests run (its kafka-clients jar): key, versions, flexible versions, every
    field's versions, nullability, tags and defaults.  ``below_baseline``: we may also speak
    versions the release no longer defines (KIP-896 removed some), never one above it."""
    spec = kafka_release_json(f"{api.name}{side.capitalize()}")
    assert (spec["apiKey"], spec["type"]) == (api.key, side)
    valid = Versions.parse(spec["validVersions"])
    if below_baseline:
        assert api.max_version == valid.hi and api.min_version <= valid.lo
    else:
        assert (api.min_version, api.max_version) == (valid.lo, valid.hi)
    assert api.flexible == Versions.parse(spec["flexibleVersions"])
    assert not spec.get("latestVersionUnstable", False)
    common = {c["name"]: c for c in spec.get("commonStructs", [])}
    # Below the baseline the release has dropped the old versions' fields; otherwise it keeps
    # every field it lists, a field of a version it no longer accepts included (ShareFetch v0's).
    compare_struct(getattr(api, side), spec["fields"], common, f"{api.name}.{side}",
                   lowest=valid.lo if below_baseline else 0)
