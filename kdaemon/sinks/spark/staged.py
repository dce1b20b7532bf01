"""The staged-batch file: how a worker hands a batch of records to the Spark uploader.

Why not Parquet: writing Parquet takes pyarrow, and importing pyarrow costs a worker 30 MB of
RSS, more than a third of the default 80 MB memory budget (issue #18; a jsonl worker starts at
30 MB, a Spark worker that imported pyarrow at 61 MB).  So the worker writes the columns in
Arrow's own memory layout with the standard library only (``array``, ``bytes.join``), and the
uploader, which has pyarrow anyway, wraps the buffers as Arrow arrays without copying them
(``read``) and writes the Parquet file Spark reads.  The worker's cost per record is about
what building the Arrow arrays cost it before.

A file (little-endian throughout)::

    b"KDSTG001"        magic, 8 bytes
    u32                length of the header
    header             JSON: {"topic", "partition", "rows", "headers", "buffers": [length, ...]}
    buffers            back to back, in ``BUFFERS`` order

``rows`` is the number of records, ``headers`` the number of record headers in all.  Offsets
into variable-length data are int64 (no 2 GiB limit per column); validity is one byte a value
(1: present), made a bitmap by the reader.

Only ``write`` runs in workers; nothing here imports pyarrow at module level.
"""

from __future__ import annotations

import json
import operator
import os
import struct
import sys
from array import array
from itertools import accumulate, chain, repeat

MAGIC = b"KDSTG001"
SUFFIX = ".staged"

# (name, element size in bytes or 0 for raw data, count: "rows", "rows+1", "headers",
# "headers+1" or "data")
BUFFERS = (
    ("offset", 8, "rows"), ("timestamp", 8, "rows"), ("timestamp_type", 1, "rows"),
    ("key_valid", 1, "rows"), ("key_offsets", 8, "rows+1"), ("key_data", 0, "data"),
    ("value_valid", 1, "rows"), ("value_offsets", 8, "rows+1"), ("value_data", 0, "data"),
    ("header_offsets", 4, "rows+1"),
    ("header_key_offsets", 8, "headers+1"), ("header_key_data", 0, "data"),
    ("header_value_valid", 1, "headers"), ("header_value_offsets", 8, "headers+1"),
    ("header_value_data", 0, "data"),
)

assert array("q").itemsize == 8 and array("i").itemsize == 4 and array("b").itemsize == 1


def as_bytes(v) -> bytes | None:
    """A key, value or header value as bytes: interceptors may hand over str, dict, ..."""
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    return json.dumps(v, separators=(",", ":")).encode("utf-8")


def _header_key(k) -> bytes:
    if isinstance(k, str):
        return k.encode("utf-8")
    if isinstance(k, (bytes, bytearray, memoryview)):
        return bytes(k)
    return str(k).encode("utf-8")


def _header_pair(item) -> tuple:
    """An interceptor's header as (key, value): a list, or a dict with "key" and "value"."""
    if isinstance(item, dict):
        return item.get("key"), item.get("value")
    k, v = item
    return k, v


def _little(a: array) -> array:
    if sys.byteorder != "little":
        a.byteswap()
    return a


def _offsets(lengths) -> array:
    return _little(array("q", accumulate(lengths, initial=0)))


def _binary(values, normalize=as_bytes) -> tuple[bytes, array, bytes]:
    """(validity bytes, int64 offsets, data) of a column of bytes-or-None.

    The usual columns go without a Python-level step per value: all bytes (one join), or
    bytes and None (None is filtered out and counts 0).  Anything else (a str from an
    interceptor, say) goes through ``normalize`` value by value."""
    n = len(values)
    if None in values:
        present = bytes(map(operator.is_not, values, repeat(None, n)))
        try:
            data = b"".join(filter(None, values))
            offsets = _offsets([0 if v is None else len(v) for v in values])
        except TypeError:
            data = None
        if data is not None and offsets[-1] == len(data):
            return present, offsets, data
    else:
        try:
            data = b"".join(values)
            offsets = _offsets(map(len, values))
        except TypeError:
            data = None
        if data is not None and offsets[-1] == len(data):
            return b"\x01" * n, offsets, data
    values = [normalize(v) for v in values]
    return (bytes(map(operator.is_not, values, repeat(None, n))),
            _offsets([0 if v is None else len(v) for v in values]), b"".join(filter(None, values)))


_first, _second = operator.itemgetter(0), operator.itemgetter(1)


def _header_columns(headers: list) -> tuple[list, array, bytes, list]:
    """The records' headers: (entries per record, key offsets, key data, values)."""
    counts = list(map(len, headers))
    flat = list(chain.from_iterable(headers))
    if not flat:
        return counts, _offsets(()), b"", []
    if set(map(type, flat)) != {tuple} or set(map(len, flat)) != {2}:
        flat = [_header_pair(item) for item in flat]
    keys, values = list(map(_first, flat)), list(map(_second, flat))
    if set(map(type, keys)) == {str}:
        joined = "".join(keys)
        if joined.isascii():   # one byte a character: the byte lengths are the str lengths
            return counts, _offsets(map(len, keys)), joined.encode("ascii"), values
    _, key_offsets, key_data = _binary([_header_key(k) for k in keys])
    return counts, key_offsets, key_data, values


def write(path: str, topic: str, partition: int, offsets: list[int], timestamps: list[int],
          timestamp_types: list[int], keys: list, values: list, headers: list) -> int:
    """Write one batch to ``path`` (through ``path``.tmp, so a reader never sees half a file);
    return its number of rows.  ``keys`` and ``values`` hold bytes or None; ``headers`` one
    sequence of (key, value) pairs per record."""
    n = len(offsets)
    if not (len(timestamps) == len(timestamp_types) == len(keys) == len(values) == len(headers) == n):
        raise ValueError("staged columns of different lengths")
    counts, hk_offsets, hk_data, header_values = _header_columns(headers)
    h = len(header_values)
    key_valid, key_offsets, key_data = _binary(keys)
    value_valid, value_offsets, value_data = _binary(values)
    hv_valid, hv_offsets, hv_data = _binary(header_values)
    buffers = [
        _little(array("q", offsets)), _little(array("q", timestamps)), array("b", timestamp_types),
        key_valid, key_offsets, key_data, value_valid, value_offsets, value_data,
        _little(array("i", accumulate(counts, initial=0))),
        hk_offsets, hk_data, hv_valid, hv_offsets, hv_data,
    ]
    raw = [memoryview(b).cast("B") for b in buffers]
    header = json.dumps({"topic": topic, "partition": partition, "rows": n, "headers": h,
                         "buffers": [len(b) for b in raw]}).encode()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(header)) + header)
        f.writelines(raw)
    os.replace(tmp, path)
    return n


class StagedFileError(ValueError):
    """A staged file that is not one, or is damaged: named with what is wrong."""


def read(path: str):
    """The batch at ``path`` as a ``pyarrow.Table`` of ``schema()``, its buffers mapped, not
    copied.  StagedFileError if the file is damaged; FileNotFoundError if it is gone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    source = pa.memory_map(path)
    data = source.read_buffer()
    if data.size < 12 or data[:8].to_pybytes() != MAGIC:
        raise StagedFileError(f"{path} is not a staged batch (no {MAGIC!r} at its start)")
    (hlen,) = struct.unpack("<I", data[8:12].to_pybytes())
    try:
        meta = json.loads(data[12:12 + hlen].to_pybytes())
        n, h, lengths = int(meta["rows"]), int(meta["headers"]), [int(x) for x in meta["buffers"]]
        topic, partition = str(meta["topic"]), int(meta["partition"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StagedFileError(f"{path}: a damaged header ({type(exc).__name__}: {exc})") from None
    if len(lengths) != len(BUFFERS) or 12 + hlen + sum(lengths) != data.size:
        raise StagedFileError(f"{path}: {data.size} bytes, where its header accounts for "
                              f"{12 + hlen + sum(lengths)} in {len(lengths)} buffers")
    counts = {"rows": n, "rows+1": n + 1, "headers": h, "headers+1": h + 1}
    bufs, at = {}, 12 + hlen
    for (name, size, count), length in zip(BUFFERS, lengths):
        if size and length != size * counts[count]:
            raise StagedFileError(f"{path}: buffer {name} has {length} bytes, not {size * counts[count]}")
        bufs[name] = data.slice(at, length)
        at += length

    def bitmap(name: str, count: int):
        flags = pa.Array.from_buffers(pa.uint8(), count, [None, bufs[name]])
        return pc.not_equal(flags, 0).buffers()[1]

    def binary(prefix: str, count: int, typ, valid: bool = True):
        arr = pa.Array.from_buffers(pa.large_binary(), count,
                                    [bitmap(prefix + "_valid", count) if valid else None,
                                     bufs[prefix + "_offsets"], bufs[prefix + "_data"]])
        return arr.cast(typ)

    try:
        entries = pa.StructArray.from_arrays(
            [binary("header_key", h, pa.string(), valid=False), binary("header_value", h, pa.binary())],
            fields=list(schema().field("headers").type.value_type))
        table = pa.table({
            "topic": pa.repeat(pa.scalar(topic, pa.string()), n),
            "partition": pa.repeat(pa.scalar(partition, pa.int32()), n),
            "offset": pa.Array.from_buffers(pa.int64(), n, [None, bufs["offset"]]),
            "timestamp": pa.Array.from_buffers(pa.int64(), n, [None, bufs["timestamp"]]),
            "timestamp_type": pa.Array.from_buffers(pa.int8(), n, [None, bufs["timestamp_type"]]),
            "key": binary("key", n, pa.binary()),
            "value": binary("value", n, pa.binary()),
            "headers": pa.ListArray.from_arrays(
                pa.Array.from_buffers(pa.int32(), n + 1, [None, bufs["header_offsets"]]), entries),
        }, schema=schema())
        table.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise StagedFileError(f"{path}: damaged columns ({type(exc).__name__}: {exc})") from None
    return table


def schema():
    """The staged batch's Arrow schema (what ``read`` gives and Spark reads)."""
    import pyarrow as pa
    return pa.schema([
        ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
        ("timestamp", pa.int64()), ("timestamp_type", pa.int8()), ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ])
