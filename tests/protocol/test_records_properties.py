"""Property tests: record round trips, corrupt input, primitives on random bytes, decompression bombs.

(a) Random record lists survive build_batch -> RecordSetReader for every codec, and the pure-Python
    and C record loops return identical records and counts.
(b) Mutated valid record sets and random bytes, read with check_crcs=False so the parser itself is
    exercised, raise only CorruptRecordError, never hang, and when both loops succeed they agree.
(c) Reader methods on random bytes raise only DecodeError; varint/varlong encodings round-trip.
(d) Small compressed payloads that expand past max_uncompressed_batch_bytes raise
    CorruptRecordError without the expansion being allocated.
"""

from __future__ import annotations

import contextlib
import signal
import struct
import tracemalloc
import zlib

import lz4.frame
import pytest
import zstandard
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdaemon.protocol import compression, record_loop, records
from kdaemon.protocol.builder import (
    RecordSpec,
    build_batch,
    build_control_batch,
    build_legacy_message,
    build_legacy_wrapper,
)
from kdaemon.protocol.errors import CorruptRecordError, DecodeError
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from kdaemon.protocol.primitives import (
    Reader,
    Writer,
    decode_uvarint,
    decode_varint,
    decode_varlong,
    encode_uvarint,
    encode_varint,
    encode_varlong,
)
from kdaemon.protocol.records import CREATE_TIME, LOG_APPEND_TIME, ConsumerRecord, RecordSetReader

TOPIC, PARTITION = "t", 7
IMPLS = ["python", "c"] if records.ACCELERATED else ["python"]
FAST = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@contextlib.contextmanager
def using(impl: str):
    """Route RecordSetReader through one loop (and native rules only for the C one)."""
    saved = records._decode_v2_records, records.ACCELERATED
    if impl == "python":
        records._decode_v2_records, records.ACCELERATED = record_loop.python_loop, False
    else:
        records._decode_v2_records, records.ACCELERATED = record_loop.accelerated_loop, True
    try:
        yield
    finally:
        records._decode_v2_records, records.ACCELERATED = saved


class Hang(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Fail instead of hanging: SIGALRM interrupts a runaway Python loop."""
    def on_alarm(signum, frame):
        raise Hang(f"decoding took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def decode(data, impl, *, fetch_offset=0, header_filter=None, **options):
    with using(impl):
        reader = RecordSetReader(data, topic=TOPIC, partition=PARTITION, fetch_offset=fetch_offset,
                                 header_filter=header_filter, **options)
        recs = reader.read_all()
    return recs, (reader.next_offset, reader.filtered, reader.control, reader.aborted, reader.truncated,
                  reader.batches)


# -- (a) round trips --------------------------------------------------------------------------------

CODECS = [("none", 0, False), ("gzip", 1, False), ("snappy", 2, False), ("snappy-xerial", 2, True),
          ("lz4", 3, False), ("zstd", 4, False), ("zstd-no-size", 4, False)]


def build(specs, base_offset, kw) -> bytes:
    """build_batch, plus zstd frames without a content size (as zstd-jni and librdkafka write)."""
    kw = dict(kw)
    if not kw.pop("zstd_no_size", False):
        return build_batch(specs, base_offset=base_offset, **kw)
    plain = build_batch(specs, base_offset=base_offset, **dict(kw, codec=0))
    body = zstandard.ZstdCompressor(write_content_size=False).compress(plain[61:])
    header = bytearray(plain[:61])
    struct.pack_into(">i", header, 8, 49 + len(body))
    struct.pack_into(">h", header, 21, struct.unpack_from(">h", header, 21)[0] | compression.ZSTD)
    struct.pack_into(">I", header, 17, crc32c(bytes(header[21:]) + body))
    return bytes(header) + body

header_keys = st.one_of(st.sampled_from(["type", "tenant", "ключ", "", "h1"]), st.text(max_size=6))
header_values = st.one_of(st.none(), st.binary(max_size=20), st.sampled_from([b"order", b"acme", b""]))
blobs = st.one_of(
    st.none(),
    st.binary(max_size=80),
    # Long runs are cheap to generate and need two- and three-byte length varints.
    st.builds(lambda n, b: bytes([b]) * n, st.integers(60, 20_000), st.integers(0, 255)),
)
record_specs = st.builds(
    RecordSpec,
    key=blobs,
    value=blobs,
    headers=st.lists(st.tuples(header_keys, header_values), max_size=40),
    timestamp_delta=st.one_of(st.integers(-100, 100), st.integers(-(2**45), 2**45)),
)


@st.composite
def record_batches(draw):
    """(specs with explicit offset deltas, build_batch keyword arguments)."""
    specs = draw(st.lists(record_specs, max_size=12))
    delta = 0
    for spec in specs:
        spec.offset_delta = delta
        delta += draw(st.one_of(st.just(1), st.integers(1, 3), st.integers(1, 100_000)))
    name, codec, xerial = draw(st.sampled_from(CODECS))
    kwargs = dict(codec=codec, xerial_snappy=xerial, zstd_no_size=name == "zstd-no-size",
                  base_timestamp=draw(st.integers(0, 2**41)),
                  leader_epoch=draw(st.sampled_from([-1, 0, 3, 2**31 - 1])))
    if draw(st.booleans()):
        kwargs["log_append_time"] = draw(st.integers(0, 2**42))
    trailing_gap = draw(st.sampled_from([0, 0, 5]))
    if specs and trailing_gap:
        kwargs["last_offset_delta"] = specs[-1].offset_delta + trailing_gap
    return specs, kwargs


rules_strategy = st.one_of(
    st.none(),
    st.builds(
        HeaderRules,
        st.lists(st.one_of(
            st.builds(HeaderRule, header_keys, st.sampled_from(["exists", "missing"]), st.just(()), st.booleans()),
            st.builds(HeaderRule, header_keys, st.just("equals"), st.tuples(header_values.filter(bool)),
                      st.booleans()),
            st.builds(HeaderRule, header_keys, st.just("in"),
                      st.lists(st.binary(max_size=6), min_size=1, max_size=30).map(tuple), st.booleans()),
            st.builds(HeaderRule, header_keys, st.just("prefix"), st.tuples(st.binary(max_size=3)), st.booleans()),
        ), max_size=4),
        st.booleans()),
)


def expected_records(batches, fetch_offset, rules):
    out, filtered, next_offset = [], 0, fetch_offset
    for base_offset, specs, kw in batches:
        last = base_offset + kw.get("last_offset_delta", max([s.offset_delta for s in specs], default=0))
        next_offset = max(next_offset, last + 1)
        if last < fetch_offset:
            continue
        epoch = kw["leader_epoch"]
        for s in specs:
            offset = base_offset + s.offset_delta
            if offset < fetch_offset:
                continue
            if rules is not None and not rules(s.headers):
                filtered += 1
                continue
            log_append = kw.get("log_append_time")
            out.append(ConsumerRecord(
                TOPIC, PARTITION, offset,
                log_append if log_append is not None else kw["base_timestamp"] + s.timestamp_delta,
                LOG_APPEND_TIME if log_append is not None else CREATE_TIME,
                s.key, s.value, [tuple(h) for h in s.headers], None if epoch < 0 else epoch))
    return out, filtered, next_offset


@settings(max_examples=300, **FAST)
@given(st.lists(record_batches(), min_size=1, max_size=3), st.integers(0, 2**40), rules_strategy, st.data())
def test_round_trip_every_codec_both_loops(batch_list, base_offset, rules, data):
    batches, blob, offset = [], b"", base_offset
    for specs, kw in batch_list:
        blob += build(specs, offset, kw)
        batches.append((offset, specs, kw))
        last = kw.get("last_offset_delta", max([s.offset_delta for s in specs], default=0))
        offset += last + 1
    fetch_offset = data.draw(st.integers(base_offset - 1, offset + 1), label="fetch_offset")
    want, want_filtered, want_next = expected_records(batches, fetch_offset, rules)
    results = []
    for impl in IMPLS:
        recs, (next_offset, filtered, control, aborted, truncated, n_batches) = decode(
            blob, impl, fetch_offset=fetch_offset, header_filter=rules)
        assert recs == want
        assert (next_offset, filtered, truncated, n_batches) == (want_next, want_filtered, False, len(batches))
        results.append(recs)
    assert all(r == results[0] for r in results)


@settings(max_examples=150, **FAST)
@given(st.lists(st.tuples(st.sampled_from(["data", "txn", "commit", "abort"]), st.integers(1, 3),
                          st.integers(1, 3)), min_size=1, max_size=8),
       st.data())
def test_read_committed_model(events, data):
    """A model of read_committed: a transactional batch is hidden iff its producer's open
    transaction is in the aborted list; markers close transactions."""
    blob, offset = b"", 0
    open_txn: dict[int, int] = {}           # pid -> first offset of its open transaction
    txn_batches: list[tuple[int, int, list[int]]] = []  # (pid, first offset, offsets)
    outcome: dict[int, str] = {}            # first offset -> "commit" | "abort"
    plain: list[int] = []
    for kind, pid, n in events:
        if kind == "data":
            blob += build_batch([RecordSpec(value=b"p")] * n, base_offset=offset)
            plain += range(offset, offset + n)
            offset += n
        elif kind == "txn":
            first = open_txn.setdefault(pid, offset)
            blob += build_batch([RecordSpec(value=b"t")] * n, base_offset=offset, producer_id=pid,
                                transactional=True, codec=data.draw(st.sampled_from([0, 1, 4])))
            txn_batches.append((pid, first, list(range(offset, offset + n))))
            offset += n
        else:
            if pid in open_txn:
                outcome[open_txn.pop(pid)] = kind
            blob += build_control_batch(base_offset=offset, producer_id=pid, commit=kind == "commit")
            offset += 1
    aborted = [(pid, first) for pid, first, _ in txn_batches if outcome.get(first) == "abort"]
    aborted = sorted(set(aborted), key=lambda a: a[1])
    hidden = {o for pid, first, offs in txn_batches if (pid, first) in aborted for o in offs}
    want = sorted(set(plain) | {o for _, _, offs in txn_batches for o in offs} - hidden)
    for impl in IMPLS:
        recs, (next_offset, _, control, n_aborted, _, _) = decode(blob, impl, aborted_transactions=aborted)
        assert [r.offset for r in recs] == want
        assert n_aborted == len(hidden)
        assert control == sum(1 for kind, _, _ in events if kind in ("commit", "abort"))
        assert next_offset == offset


# -- (b) corrupt input ------------------------------------------------------------------------------

def _corpus() -> list[bytes]:
    many = [(f"h{i}", bytes([i])) for i in range(40)]
    specs = [RecordSpec(key=b"k1", value=b"v" * 70, headers=[("type", b"order"), ("ключ", None)]),
             RecordSpec(key=None, value=b"", headers=many, timestamp_delta=-9000, offset_delta=3),
             RecordSpec(key=b"", value=None, timestamp_delta=2**40, offset_delta=9000)]
    sets = [build_batch(specs, base_offset=100, codec=c) for c in range(5)]
    sets.append(build_batch(specs, base_offset=5, codec=2, xerial_snappy=True, log_append_time=77))
    sets.append(build_batch(specs[:1], base_offset=0) + build_batch(specs, base_offset=1, leader_epoch=-1)
                + build_control_batch(base_offset=9002, producer_id=4, commit=False))
    sets.append(build_batch(specs, base_offset=0, producer_id=4, transactional=True)
                + build_control_batch(base_offset=9001, producer_id=4, commit=True))
    sets.append(build_legacy_message(0, b"k", b"v", magic=0) + build_legacy_message(1, None, b"v", magic=1))
    sets.append(build_legacy_wrapper(10, [(b"a", b"1"), (None, b"2"), (b"c", None)], magic=1, codec=1))
    sets.append(build_legacy_wrapper(10, [(b"a", b"1"), (b"b", b"2")], magic=0, codec=2))
    sets.append(build_legacy_wrapper(3, [(b"a", b"1")] * 3, magic=1, codec=3, log_append_time=True))
    sets.append(build_batch([RecordSpec(key=b"x", value=b"y" * 300)] * 6, codec=0))
    return sets


CORPUS = _corpus()
INTERESTING_INT32 = [-(2**31), -2, -1, 0, 1, 5, 48, 49, 60, 127, 128, 2**31 - 1, 0x0FFFFFFF]
FIELD_OFFSETS = [8, 12, 17, 21, 23, 57, 61, 62, 63, 64]  # length, epoch, crc, attributes, deltas, count, records

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2**20), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 2**20)),
    st.tuples(st.just("insert"), st.integers(0, 2**20), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 2**20), st.integers(1, 16)),
    st.tuples(st.just("byte"), st.integers(0, 2**20), st.integers(0, 255)),
    st.tuples(st.just("int32"), st.one_of(st.sampled_from(FIELD_OFFSETS), st.integers(0, 2**20)),
              st.one_of(st.sampled_from(INTERESTING_INT32), st.integers(-(2**31), 2**31 - 1))),
    st.tuples(st.just("varint"), st.integers(0, 2**20),
              st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-1, -2, 0, 63, 64, 8191, 8192]))),
)


def mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for m in mutations:
        if not buf:
            break
        i = m[1] % len(buf)
        if m[0] == "flip":
            buf[i] ^= 1 << m[2]
        elif m[0] == "truncate":
            del buf[i:]
        elif m[0] == "insert":
            buf[i:i] = m[2]
        elif m[0] == "delete":
            del buf[i:i + m[2]]
        elif m[0] == "byte":
            buf[i] = m[2]
        elif m[0] == "int32":
            if i + 4 <= len(buf):
                struct.pack_into(">i", buf, i, m[2])
        elif m[0] == "varint":
            v = encode_varint(m[2])
            buf[i:i + len(v)] = v
    return bytes(buf)


FILTERS = [None, lambda headers: len(headers) % 2 == 0,
           HeaderRules([HeaderRule("type", "equals", ("order",), keep=False), HeaderRule("h39", "exists")],
                       default=True),
           HeaderRules([HeaderRule("ключ", "missing", keep=False), HeaderRule("h1", "regex", (b"\x01",))])]


def only_corrupt_record_errors(data: bytes, fetch_offset: int, flt, aborted, max_bytes):
    """Decode with every loop; return each outcome.  Any exception but CorruptRecordError fails."""
    outcomes = []
    for impl in IMPLS:
        try:
            with time_limit(10):
                outcomes.append(("ok",) + decode(data, impl, fetch_offset=fetch_offset, header_filter=flt,
                                                 check_crcs=False, aborted_transactions=aborted,
                                                 max_uncompressed_batch_bytes=max_bytes))
        except CorruptRecordError as exc:
            assert exc.topic == TOPIC and exc.partition == PARTITION
            outcomes.append(("corrupt",))
    return outcomes


def assert_agree_when_both_succeed(outcomes):
    ok = [o for o in outcomes if o[0] == "ok"]
    assert all(o == ok[0] for o in ok)


decode_options = st.tuples(
    st.sampled_from([0, 0, 1, 102, 9001]),                   # fetch offset
    st.sampled_from(range(len(FILTERS))),
    st.sampled_from([None, [(4, 0)], [(4, 9000), (5, 0)]]),  # aborted transactions
    st.sampled_from([compression.DEFAULT_MAX_UNCOMPRESSED, 64, 4096]),
)


@settings(max_examples=1500, **FAST)
@given(st.sampled_from(range(len(CORPUS))), st.lists(mutation, min_size=1, max_size=4), decode_options)
def test_mutated_record_sets_raise_only_corrupt_record_error(index, mutations, options):
    fetch_offset, flt, aborted, max_bytes = options
    data = mutate(CORPUS[index], mutations)
    outcomes = only_corrupt_record_errors(data, fetch_offset, FILTERS[flt], aborted, max_bytes)
    assert_agree_when_both_succeed(outcomes)


@settings(max_examples=600, **FAST)
@given(st.binary(max_size=600), decode_options)
def test_random_bytes_raise_only_corrupt_record_error(data, options):
    fetch_offset, flt, aborted, max_bytes = options
    assert_agree_when_both_succeed(only_corrupt_record_errors(data, fetch_offset, FILTERS[flt], aborted, max_bytes))


@st.composite
def plausible_batches(draw):
    """A v2 header that passes the framing checks, over a random or half-valid record payload."""
    if draw(st.booleans()):
        payload = draw(st.binary(max_size=300))
    else:
        # Valid records with random bytes spliced in: deeper into the loop than pure noise.
        valid = build_batch([RecordSpec(key=b"k", value=b"v", headers=[("type", b"order")])] * 3)[61:]
        payload = mutate(valid, draw(st.lists(mutation, min_size=1, max_size=3)))
    count = draw(st.one_of(st.integers(0, 6), st.sampled_from([-1, 2**31 - 1])))
    attributes = draw(st.one_of(st.just(0), st.sampled_from([0x08, 0x10, 0x20, 0x30]), st.integers(0, 0x7F)))
    header = records._BATCH_HEADER.pack(
        draw(st.sampled_from([0, 50, 2**62])), 49 + len(payload), draw(st.sampled_from([-1, 0])), 2, 0,
        attributes, draw(st.sampled_from([0, 2, 5, 2**31 - 1])), 1000, 2000, 4, 0, -1, count)
    return header + payload


@settings(max_examples=1500, **FAST)
@given(plausible_batches(), decode_options)
def test_random_records_behind_valid_headers_raise_only_corrupt_record_error(data, options):
    fetch_offset, flt, aborted, max_bytes = options
    assert_agree_when_both_succeed(only_corrupt_record_errors(data, fetch_offset, FILTERS[flt], aborted, max_bytes))


@pytest.mark.skipif(not records.ACCELERATED, reason="C record loop not built or disabled")
@settings(max_examples=1000, **FAST)
@given(st.binary(max_size=200), st.integers(0, 8), st.sampled_from(range(len(FILTERS))),
       st.sampled_from([0, 2]))
def test_loops_on_random_payloads(payload, count, flt, min_offset):
    """The loops themselves: only the exceptions _read_v2 converts; same results when both succeed."""
    py_filter = c_filter = FILTERS[flt]
    if isinstance(py_filter, HeaderRules) and py_filter.native_rules is not None:
        c_filter = py_filter.native_rules
    outcomes = []
    for fn, f in ((record_loop.python_loop, py_filter), (record_loop.accelerated_loop, c_filter)):
        out: list = []
        try:
            with time_limit(10):
                pos, filtered = fn(payload, 0, count, 1, 1000, None, CREATE_TIME, 0, TOPIC, PARTITION,
                                   min_offset, f, out)
            outcomes.append(("ok", out, pos, filtered))
        except (ValueError, IndexError, DecodeError):  # UnicodeDecodeError is a ValueError
            outcomes.append(("error",))
    assert_agree_when_both_succeed(outcomes)


# -- (c) primitives -----------------------------------------------------------------------------------

READER_CALLS = st.one_of(
    st.sampled_from([("int8",), ("boolean",), ("int16",), ("uint16",), ("int32",), ("uint32",), ("int64",),
                     ("float64",), ("uuid",), ("uvarint",), ("varint",), ("varlong",)]),
    st.tuples(st.sampled_from(["string", "bytes_", "array_length"]), st.booleans(), st.booleans()),
    st.tuples(st.sampled_from(["raw", "skip"]), st.integers(-3, 40)),
)


@settings(max_examples=600, **FAST)
@given(st.binary(max_size=64), st.lists(READER_CALLS, min_size=1, max_size=12), st.booleans(),
       st.integers(0, 8))
def test_reader_on_random_bytes_raises_only_decode_error(data, calls, as_view, cut):
    buf = memoryview(data) if as_view else data
    end = max(0, len(data) - cut)
    r = Reader(buf, 0, end)
    for name, *args in calls:
        before = r.pos
        try:
            getattr(r, name)(*args)
        except DecodeError:
            continue
        assert before <= r.pos <= end


@settings(max_examples=300, **FAST)
@given(st.binary(max_size=16), st.integers(0, 4))
def test_varint_decoders_on_random_bytes(data, pos):
    for fn in (decode_varint, decode_varlong, decode_uvarint):
        try:
            value, new_pos = fn(data, pos)
        except DecodeError:
            continue
        assert pos < new_pos <= len(data)


BOUNDARY32 = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, -8192, -8193, 2**20, 2**31 - 1, -(2**31)]
BOUNDARY64 = BOUNDARY32 + [2**31, -(2**31) - 1, 2**35, 2**62, 2**63 - 1, -(2**63)]


@settings(max_examples=300, **FAST)
@given(st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from(BOUNDARY32)),
       st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from(BOUNDARY64)),
       st.integers(0, 2**64 - 1), st.binary(max_size=3))
def test_varint_round_trips(v32, v64, u, prefix):
    for value, encode, decode_fn, longest in ((v32, encode_varint, decode_varint, 5),
                                              (v64, encode_varlong, decode_varlong, 10),
                                              (u, encode_uvarint, decode_uvarint, 10)):
        encoded = encode(value)
        assert 1 <= len(encoded) <= longest
        assert decode_fn(prefix + encoded + b"\x80", len(prefix)) == (value, len(prefix) + len(encoded))
    # Zigzag keeps small magnitudes short whatever the sign.
    assert len(encode_varint(v32)) == len(encode_varint(-v32 - 1))


@settings(max_examples=200, **FAST)
@given(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=40), st.booleans())
def test_reader_varints_through_writer_framing(value, tail, compact):
    w = Writer()
    w.varint(value)
    w.varlong(value * 3)
    w.bytes_(tail, compact, nullable=False)
    r = Reader(w.getvalue())
    assert (r.varint(), r.varlong(), bytes(r.bytes_(compact, False))) == (value, value * 3, tail)
    assert r.remaining == 0


# -- (d) decompression bombs ---------------------------------------------------------------------------

def zstd_rle_frame(size: int, declare_size: bool) -> bytes:
    """A zstd frame of ``size`` zero bytes made of RLE blocks: 4 bytes per 128 KiB of output."""
    block = 128 * 1024
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    if declare_size:
        out += bytes([0xC0, 7 << 3]) + struct.pack("<Q", size)  # 8-byte content size, window 128 KiB
    else:
        out += bytes([0x00, 7 << 3])
    remaining = size
    while remaining:
        n = min(block, remaining)
        remaining -= n
        out += (int(remaining == 0) | (1 << 1) | (n << 3)).to_bytes(3, "little") + b"\x00"
    return bytes(out)


def bomb(codec_name: str, size: int) -> tuple[int, bytes]:
    if codec_name == "zstd":
        return compression.ZSTD, zstd_rle_frame(size, declare_size=True)
    if codec_name == "zstd-no-size":
        return compression.ZSTD, zstd_rle_frame(size, declare_size=False)
    if codec_name == "gzip":
        c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        chunk = b"\x00" * (1 << 20)
        parts = [c.compress(chunk) for _ in range(size >> 20)]
        return compression.GZIP, b"".join(parts) + c.compress(b"\x00" * (size & ((1 << 20) - 1))) + c.flush()
    if codec_name == "lz4":
        return compression.LZ4, lz4.frame.compress(b"\x00" * size, store_size=False)
    if codec_name == "lz4-size":
        return compression.LZ4, lz4.frame.compress(b"\x00" * size)
    if codec_name == "snappy":
        return compression.SNAPPY, compression.compress(compression.SNAPPY, b"\x00" * size)
    return compression.SNAPPY, compression.compress(compression.SNAPPY, b"\x00" * size, xerial=True)


BOMB_CODECS = ["zstd", "zstd-no-size", "gzip", "lz4", "lz4-size", "snappy", "snappy-xerial"]


def test_zstd_rle_frame_is_a_real_frame():
    frame = zstd_rle_frame(300_000, declare_size=False)
    assert len(frame) < 30
    assert zstandard.ZstdDecompressor().decompressobj().decompress(frame) == b"\x00" * 300_000
    assert zstandard.frame_content_size(zstd_rle_frame(300_000, declare_size=True)) == 300_000


@settings(max_examples=100, **FAST)
@given(st.sampled_from(BOMB_CODECS), st.integers(16, 64 * 1024), st.integers(1, 2 * 1024 * 1024))
def test_payload_beyond_the_limit_is_corrupt(codec_name, limit, excess):
    codec, data = bomb(codec_name, limit + excess)
    with pytest.raises(CorruptRecordError, match="max_uncompressed_batch_bytes"):
        compression.decompress(codec, data, limit)
    codec, data = bomb(codec_name, limit)
    assert compression.decompress(codec, data, limit) == b"\x00" * limit


@settings(max_examples=20, **FAST)
@given(st.sampled_from(BOMB_CODECS), st.integers(100, 10_000), st.sampled_from(IMPLS))
def test_bomb_inside_a_batch_names_the_batch(codec_name, limit, impl):
    codec, body = bomb(codec_name, limit * 50)
    plain = build_batch([RecordSpec(value=b"x")], base_offset=42)
    header = bytearray(plain[:61])
    struct.pack_into(">i", header, 8, 49 + len(body))
    struct.pack_into(">h", header, 21, codec)
    struct.pack_into(">I", header, 17, crc32c(bytes(header[21:]) + body))
    with pytest.raises(CorruptRecordError) as info:
        decode(bytes(header) + body, impl, max_uncompressed_batch_bytes=limit)
    assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, PARTITION, 42)


@pytest.mark.parametrize("codec_name, size", [("zstd", 1 << 32), ("zstd-no-size", 1 << 30),
                                              ("gzip", 64 << 20), ("lz4", 64 << 20), ("snappy", 64 << 20)])
def test_bombs_are_not_allocated(codec_name, size):
    """Peak traced memory stays far below the expansion (1 MiB limit)."""
    codec, data = bomb(codec_name, size)
    assert len(data) < size // 20  # snappy manages ~21:1 on zeros, the others far more
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError):
            compression.decompress(codec, data, 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # zstd without a declared size is decompressed in 2 KiB input slices, each of which may
    # expand to ~64 MiB of run-length blocks before the limit is noticed (see _unzstd).
    budget = (160 << 20) if codec_name == "zstd-no-size" else (8 << 20) + 4 * len(data)
    assert peak < budget, f"peak {peak} bytes for a {size}-byte bomb"


def test_legacy_wrapper_bomb():
    inner = build_legacy_message(0, None, b"\x00" * 200_000, magic=1)
    data = build_legacy_message(0, None, compression.compress(compression.GZIP, inner), magic=1,
                                codec=compression.GZIP)
    for impl in IMPLS:
        with pytest.raises(CorruptRecordError, match="max_uncompressed_batch_bytes"):
            decode(data, impl, max_uncompressed_batch_bytes=100_000)
