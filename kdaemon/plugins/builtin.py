"""kdaemon's built-in deserializers, registered like any plugin (name ``builtin``).

The built-in sinks live in ``kdaemon.sinks.builtin`` (registered as ``builtin-sinks``).
"""

from __future__ import annotations

from . import hookimpl


def _bytes(settings: dict):
    def deserialize(topic, headers, data):
        return data
    # The worker then skips the call per record (see Pipeline.deserialize).
    deserialize.returns_data_unchanged = True
    return deserialize


def _str(settings: dict):
    encoding = settings.get("encoding", "utf-8")
    errors = settings.get("errors", "strict")
    "".encode(encoding)  # unknown encodings fail at start-up, not per record

    def deserialize(topic, headers, data):
        return None if data is None else str(data, encoding, errors)
    return deserialize


@hookimpl
def kdaemon_deserializers():
    return {"bytes": _bytes, "str": _str}
