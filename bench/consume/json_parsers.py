"""JSON parsers on the values kdaemon deserializes: the standard library, msgspec and orjson.

Run from the repository root::

    python bench/consume/json_parsers.py [--repeats N] [--min-time S] [--json PATH]

What is timed, per value, from the record's ``bytes`` to a Python object:

* ``stdlib json.loads``: ``json.loads(data)``, what most Python consumers write.
* ``stdlib scan_once``: the json plugin before msgspec: ``str(data, "utf-8")`` then the C
  scanner (``JSONDecoder.scan_once``) and a length check.
* ``msgspec``: ``msgspec.json.Decoder().decode(data)``, straight from the bytes.
* ``orjson``: ``orjson.loads(data)``, straight from the bytes.
* ``plugin``: the bundled json plugin's deserializer as the worker calls it,
  ``deserialize(topic, headers, data)``, with the default settings.
* ``msgspec typed``: ``msgspec.json.Decoder(T).decode(data)`` for a ``msgspec.Struct`` ``T``
  made for the benchmark's value (what a Spark sink's ``value_schema`` could decode into), only
  for the bench value.  Compared with ``msgspec`` plus building the same row from the dict.

Then the same parsers over 20,000 distinct bench values with every result kept and the garbage
collector on, as a worker's batch is (fresh dicts, the collector running over them).

Last: the bench values into the Arrow columns of its schema, pyarrow's
JSON reader (what the Spark sink's uploader runs for a ``value_schema``) against msgspec's typed
decode into a ``Struct`` and columns built from those; only where pyarrow is installed.

Values: ``bench`` is the 200-byte value of the consuming benchmarks (testkit/workload.py, the
first record), the one bench/consume's json mode parses a million of; ``small`` is a 34-byte
event, ``nested`` an 800-byte document with nested objects and arrays, ``numbers`` a 245-byte
array of floats and integers, ``text`` a 517-byte document of non-ASCII strings with escapes.  Every
parser's result is checked equal to ``json.loads``'s before timing.

Timing: this process's CPU time (``time.process_time``: the machine is shared, and CPU time
leaves out the moments another process had the core), best of ``--repeats`` repeats, each
looping at least ``--min-time`` CPU-seconds, parsers interleaved; GC off while timing, as
``timeit``.  Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `bench`, kdaemon and the plugins from this tree
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(root), str(root / "plugins")]

from testkit.workload import iter_records  # noqa: E402


def values() -> dict[str, bytes]:
    bench = next(iter_records(1))[3]
    nested = {"order": {"id": "o-991823", "customer": {"id": 123456, "name": "Jane Doe",
                                                       "address": {"street": "1 Main St", "city": "Springfield",
                                                                   "zip": "12345", "country": "US"}},
                        "lines": [{"sku": f"SKU-{i:05d}", "qty": i + 1, "price": 9.99 + i, "tags": ["a", "b"]}
                                  for i in range(8)],
                        "paid": True, "coupon": None, "ts": "2026-12-02T12:00:00.000Z"}}
    numbers = [1.5, -2.25, 3e10, 0.1, 12345678, -7, 6.02214076e23, 1e-9] * 4
    text = {"title": "Grüße aus Köln – ein Überblick", "body": "東京で会いましょう。\n\"quoted\" \\ back\tslash",
            "tags": ["café", "naïve", "Ελληνικά", "русский"], "emoji": "\u00e9\u00e8\u00ea"}
    text["more"] = [text["title"], text["body"]] * 3
    return {"bench": bench,
            "small": b'{"id":42,"type":"click","ok":true}',
            "nested": json.dumps(nested).encode(),
            "numbers": json.dumps(numbers, separators=(",", ":")).encode(),
            "text": json.dumps(text, ensure_ascii=False).encode()}


def parsers() -> dict[str, object]:
    import kdaemon_json
    out = {"stdlib json.loads": json.loads}
    scan_once = json.JSONDecoder().scan_once

    def scan(data):
        text = str(data, "utf-8")
        obj, end = scan_once(text, 0)
        if end != len(text):
            raise ValueError("trailing data")
        return obj
    out["stdlib scan_once"] = scan
    try:
        import msgspec
        out["msgspec"] = msgspec.json.Decoder().decode
    except ImportError:
        pass
    try:
        import orjson
        out["orjson"] = orjson.loads
    except ImportError:
        pass
    plugin = kdaemon_json.json_deserializer({})
    out["plugin"] = lambda data: plugin("t", [], data)
    return out


def typed_parsers() -> dict[str, object]:
    """The bench value into a row: a typed msgspec decode against a dict decode and a lookup."""
    try:
        import msgspec
    except ImportError:
        return {}

    class Event(msgspec.Struct, array_like=False):
        id: int
        event: str
        user: str
        amount: float
        currency: str
        items: list[int]
        note: str

    typed = msgspec.json.Decoder(Event).decode
    untyped = msgspec.json.Decoder().decode
    names = tuple(Event.__struct_fields__)

    def dict_then_row(data):
        d = untyped(data)
        return tuple(d.get(n) for n in names)

    def typed_row(data):
        e = typed(data)
        return tuple(getattr(e, n) for n in names)
    return {"msgspec typed (Struct)": typed, "msgspec typed -> row": typed_row,
            "msgspec dict -> row": dict_then_row}


def batch_of_values(fns: dict, n: int = 20_000, repeats: int = 7) -> dict[str, float]:
    """CPU µs per value over n distinct bench values with every result kept and the garbage
    collector on, as a worker's batch is: what the parser costs in the daemon, where fresh
    dicts cannot reuse the memory of the last one and the collector runs over the young ones."""
    vals = [v for _, _, _, v, _ in iter_records(n)]
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):   # interleaved, as measure(): the first one would pay for the arenas
        for name, fn in fns.items():
            start = time.process_time()
            kept = [fn(v) for v in vals]
            best[name] = min(best[name], time.process_time() - start)
            del kept
    return {name: t / n * 1e6 for name, t in best.items()}


def arrow_columns(n: int = 20_000, repeats: int = 7) -> dict[str, float]:
    """CPU µs per value to turn n bench values into Arrow columns of a known schema, as the Spark
    sink's uploader does for ``value_schema`` (pyarrow's JSON reader over the values as lines),
    against msgspec decoding each into a ``Struct`` and the columns built from those.  Empty
    without pyarrow (the spark extra)."""
    try:
        import io

        import msgspec
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:
        return {}
    vals = [v for _, _, _, v, _ in iter_records(n)]
    schema = pa.schema([("id", pa.int64()), ("event", pa.string()), ("user", pa.string()),
                        ("amount", pa.float64()), ("currency", pa.string()), ("items", pa.list_(pa.int64())),
                        ("note", pa.string())])
    Event = msgspec.defstruct("Event", [(f.name, {pa.int64(): int, pa.float64(): float, pa.string(): str}
                                         .get(f.type, list[int])) for f in schema])
    one = msgspec.json.Decoder(Event).decode

    def reader():
        return pj.read_json(io.BytesIO(b"\n".join(vals)),
                            parse_options=pj.ParseOptions(explicit_schema=schema))

    def typed():
        events = [one(v) for v in vals]
        return pa.table({name: [getattr(e, name) for e in events] for name in schema.names}, schema=schema)
    if not typed().equals(reader()):
        raise RuntimeError("msgspec's Struct columns differ from pyarrow's JSON reader's")
    out = {}
    for name, fn in (("pyarrow JSON reader (the uploader)", reader), ("msgspec Struct -> columns", typed)):
        best = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            fn()
            best = min(best, time.process_time() - start)
        out[name] = best / n * 1e6
    return out


def _loop(fn, data, number: int) -> float:
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(number):
            fn(data)
        return time.process_time() - start
    finally:
        gc.enable()


def measure(fns: dict, data: bytes, repeats: int, min_time: float) -> dict[str, float]:
    numbers = {}
    for name, fn in fns.items():
        n = 1000
        while (t := _loop(fn, data, n)) < min_time:
            n = max(n * 2, int(n * min_time / max(t, 1e-9) * 1.1))
        numbers[name] = n
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], _loop(fn, data, numbers[name]) / numbers[name])
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    import os
    import platform
    versions = {}
    for mod in ("msgspec", "orjson"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = "not installed"
    print(f"Python {platform.python_version()}, {platform.processor() or platform.machine()}, "
          f"load {os.getloadavg()[0]:.2f}; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"best of {args.repeats} repeats, each >= {args.min_time} CPU-s; CPU µs per value")
    vals, fns = values(), parsers()
    results = {}
    for vname, data in vals.items():
        want = json.loads(data)
        for name, fn in fns.items():
            if fn(data) != want:
                raise RuntimeError(f"{name} parsed {vname} differently from json.loads")
        here = dict(fns)
        if vname == "bench":
            here.update(typed_parsers())
        results[vname] = {k: v * 1e6 for k, v in measure(here, data, args.repeats, args.min_time).items()}
    names = list(fns)
    print(f"{'value':<8} {'bytes':>5} " + " ".join(f"{n:>18}" for n in names))
    for vname, data in vals.items():
        print(f"{vname:<8} {len(data):>5} " + " ".join(f"{results[vname][n]:>18.3f}" for n in names))
    for n, us in results["bench"].items():
        if n not in names:
            print(f"bench: {n}: {us:.3f} µs")
    batch = batch_of_values(fns)
    print("20,000 distinct bench values, results kept, GC on: "
          + ", ".join(f"{n} {us:.3f}" for n, us in batch.items()) + " CPU µs per value")
    arrow = arrow_columns()
    for n, us in arrow.items():
        print(f"bench values into Arrow columns of their schema, {n}: {us:.3f} CPU µs per value")
    if args.json:
        report = {"versions": versions, "us_per_value": results, "batch": batch, "arrow": arrow,
                  "bytes": {k: len(v) for k, v in vals.items()}}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
