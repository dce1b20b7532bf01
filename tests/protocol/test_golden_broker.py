"""Golden tests: kdaemon's protocol layer on bytes written by real software.

confluent-kafka (librdkafka) produces, a real Tansu broker stores and serves, and kdaemon fetches
the raw record sets with its own ApiVersions / Metadata / Fetch codec over a plain socket
(``testkit/ourfetch.py``) and decodes them with ``RecordSetReader``, once with the C record
loop and once with the pure-Python one.  The reference for every field is what confluent-kafka's
consumer returns for the same offsets, and, where the test chose the value, what was produced.

What Tansu does that shapes these tests (see ``testkit/tansu.py``):

* Its high watermark is not to be trusted as the log end, so every fetch loop stops on the
  offsets the delivery reports gave, never on the watermark.
* Its Fetch never lists aborted transactions, so the read_committed tests derive the list from
  the raw batches (parsed by ``rawfetch``, not by kdaemon), as a Kafka broker's transaction index
  would, and hand it to the reader themselves.  For the same reason confluent-kafka's own
  read_committed view of Tansu includes aborted records; the reference there is its
  read_uncommitted view restricted to committed offsets.
* It answers whole batches only, at least one per fetch and about ``max_bytes`` worth, so a small
  ``max_bytes`` makes the fetch loop take many rounds.
"""

from __future__ import annotations

import random
import struct
import uuid
from dataclasses import dataclass, fields

import pytest

from kdaemon.protocol import messages, record_loop, records
from kdaemon.protocol.apis.api_versions import API_VERSIONS
from kdaemon.protocol.apis.fetch import FETCH
from kdaemon.protocol.apis.metadata import METADATA
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from kdaemon.protocol.records import ConsumerRecord, RecordSetReader
from kdaemon.protocol.versions import broker_ranges, choose_version
from testkit.ourfetch import (READ_COMMITTED, SOFTWARE, BrokerConnection, FetchRound,
                                    PartitionLeader, api_version_ranges, fetch_request,
                                    fetch_until, find_leader, metadata_request)
from testkit.produce import (CODECS, TIMEOUT, ConsumedRecord, Record, Writer, consume_all,
                                   create_topic, produce, write_all)
from testkit.rawfetch import RawBatch, fetch_raw, split_batches

pytestmark = pytest.mark.broker

TIMESTAMP_TYPE_NAMES = {records.NO_TIMESTAMP_TYPE: "not_available", records.CREATE_TIME: "create_time",
                        records.LOG_APPEND_TIME: "log_append_time"}
SMALL_FETCH = 16 << 10   # several rounds per log even compressed; the 1 MiB record alone in one
LARGE_FETCH = 64 << 20


def unique(prefix: str) -> str:
    return f"golden-{prefix}-{uuid.uuid4().hex[:10]}"


# --- what gets produced ----------------------------------------------------------------------

def varied_records(rng: random.Random) -> list[Record]:
    """The awkward cases, produced with linger so they share one multi-record batch."""
    return [
        Record(b"k1", b"v1", (("h1", b"x"), ("h-null", None), ("h-empty", b"")), 1_700_000_000_123),
        Record(None, b"null key"),
        Record(b"null value", None),
        Record(None, None),
        Record(None, None, (("only", b"headers"),)),
        Record(b"", b""),
        Record(b"dup", b"repeated header keys, in order",
               (("dup", b"1"), ("dup", b"2"), ("dup", None), ("dup", b""))),
        Record(b"unicode", "värde".encode(),
               (("ключ", "значение".encode()), ("é", b"\xc3\xa9"), ("日本語", b"\x00\xff"),
                ("🔑", None), ("", b"empty header key"))),
        # Timestamps far before and after the batch's base: multi-byte negative and positive deltas.
        Record(b"ts-epoch", b"", (), 1),
        Record(b"ts-2100", b"", (), 4_102_444_800_000),
        Record(b"ts-back", b"", (), 1_700_000_000_000),
        Record(b"k" * 100, b"a key length in two varint bytes"),
        Record(b"K" * 10_000, b"a key length in three varint bytes"),
        Record(b"big-header", b"", (("big", bytes(range(256)) * 300),)),
        # More headers than the C loop keeps inline (32), and a two-byte header count.
        Record(b"many-headers", b"", tuple((f"h{i}", str(i).encode()) for i in range(70))),
        Record(None, rng.randbytes(5000)),
    ]


def small_records(n: int) -> list[Record]:
    """Many small records in many batches; their headers are what the filter tests select on."""
    kinds = [
        (("kind", b"keep"),),
        (("kind", b"nope"),),
        (("kind", b"keep"), ("drop", None)),        # "drop" exists: dropped whatever else
        (("kind", b"also"), ("kind", b"nope")),     # the last "kind" counts: dropped
        (("kind", b"nope"), ("kind", b"also")),     # ... kept
        (("kind", None), ("ключ", "значение".encode())),
        (("kind", b"KEEP"), ("ключ", b"other")),
    ]
    out = []
    for i in range(n):
        headers = kinds[i % len(kinds)]
        if i % 5 == 0:
            headers += (("dup", b"a"), ("dup", b"b"))
        if i % 11 == 0:
            headers += (("empty", b""),)
        elif i % 13 == 0:
            headers += (("empty", None),)           # a null value is not an empty one
        out.append(Record(f"key-{i}".encode() if i % 3 else None, b"v" * (i % 97), headers))
    return out


def wide_records(n: int) -> list[Record]:
    """One batch of more than 8192 records: offset and timestamp deltas in three varint bytes."""
    return [Record(None, i.to_bytes(2, "big"), (), 1_650_000_000_000 + i) for i in range(n)]


# The log ends in records both filters drop, so "next_offset passes the end" is tested on
# filtered records.
TAIL = [Record(b"tail", b"t", (("kind", b"nope"),)) for _ in range(5)]

PHASES = (  # name, records, producer settings
    # One batch, sent by the final flush (100 ms closed it early on a loaded machine; see "wide").
    ("varied", varied_records, {"linger.ms": 10_000}),
    ("small", lambda rng: small_records(3000), {"linger.ms": 5, "batch.num.messages": 100}),
    ("big", lambda rng: [Record(b"big", rng.randbytes(1024) * 1024, (("kind", b"keep"),))], {}),
    # The final flush sends the batch: a linger longer than producing 9000 records takes even on
    # a loaded machine (500 ms once closed it at 6701).
    ("wide", lambda rng: wide_records(9000), {"linger.ms": 10_000, "batch.num.messages": 10_000}),
    ("tail", lambda rng: TAIL, {"linger.ms": 100}),
)


@dataclass
class GoldenLog:
    topic: str
    codec: str
    produced: dict[int, Record]        # by offset, from the delivery reports
    consumed: list[ConsumedRecord]     # confluent-kafka's read, in offset order
    phases: dict[str, list[int]]       # offsets of each phase

    @property
    def last_offset(self) -> int:
        return self.consumed[-1].offset


def produce_phases(bootstrap: str, topic: str, codec: str, phases, seed: str) -> tuple[dict, dict]:
    rng = random.Random(seed)
    produced, offsets = {}, {}
    for name, make, conf in phases:
        batch = make(rng)
        delivered = produce(bootstrap, topic, batch, compression=codec, partition=0, **conf)
        offsets[name] = [d.offset for d in delivered]
        produced.update(zip(offsets[name], batch))
    return produced, offsets


@pytest.fixture(scope="module", params=CODECS)
def golden(request, broker) -> GoldenLog:
    codec = request.param
    topic = unique(codec)
    create_topic(broker.bootstrap, topic)
    produced, offsets = produce_phases(broker.bootstrap, topic, codec, PHASES, codec)
    all_offsets = sorted(produced)
    assert all_offsets == list(range(len(produced))), "one producer at a time: offsets are dense"
    consumed = consume_all(broker.bootstrap, topic, 0, 0, all_offsets[-1] + 1,
                           isolation_level="read_uncommitted")
    assert [c.offset for c in consumed] == all_offsets
    return GoldenLog(topic, codec, produced, consumed, offsets)


# --- kdaemon's side: connection, versions, decoders --------------------------------------------

@dataclass
class Kafka:
    conn: BrokerConnection
    ranges: dict[int, tuple[int, int]]
    host: str
    port: int

    def version(self, api) -> int:
        return choose_version(api, self.ranges)

    def leader(self, topic: str) -> PartitionLeader:
        leader = find_leader(self.conn, self.version(METADATA), topic)
        # One broker: the leader Metadata names must be the broker we are connected to.
        assert (leader.host, leader.port) == (self.host, self.port)
        return leader

    def fetch_all(self, leader: PartitionLeader, last_offset: int, reader_for, **kw) -> list[FetchRound]:
        return fetch_until(self.conn, self.version(FETCH), leader, last_offset=last_offset,
                           reader_for=reader_for, **kw)


@pytest.fixture(scope="module")
def ranges(broker) -> dict[int, tuple[int, int]]:
    with BrokerConnection(broker.host, broker.port) as conn:
        return api_version_ranges(conn)


@pytest.fixture
def kafka(broker, ranges) -> Kafka:
    with BrokerConnection(broker.host, broker.port) as conn:
        yield Kafka(conn, ranges, broker.host, broker.port)


@pytest.fixture(params=["c-loop", "pure-python"])
def decoder(request, monkeypatch) -> str:
    """Run the test with the C record loop, then with the pure-Python one."""
    if request.param == "c-loop":
        if not records.ACCELERATED:
            pytest.skip("the C record loop is not built (or KDAEMON_PURE_PYTHON is set)")
        assert records._decode_v2_records is not record_loop.python_loop
    else:
        monkeypatch.setattr(records, "_decode_v2_records", record_loop.python_loop)
        # Without this the reader would still hand HeaderRules to the loop as native data.
        monkeypatch.setattr(records, "ACCELERATED", False)
    return request.param


def plain_reader(topic: str, **options):
    def reader_for(fetch_offset: int, data) -> RecordSetReader:
        return RecordSetReader(data, topic=topic, partition=0, fetch_offset=fetch_offset, **options)
    return reader_for


def decoded(rounds: list[FetchRound]) -> list[ConsumerRecord]:
    return [r for rnd in rounds for r in rnd.decoded]


def raw_batches(rounds: list[FetchRound]) -> list[RawBatch]:
    return [b for rnd in rounds for b in split_batches(rnd.records)]


# --- comparisons -------------------------------------------------------------------------------

def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value)} bytes)"


def as_consumed(r: ConsumerRecord) -> ConsumedRecord:
    return ConsumedRecord(r.offset, TIMESTAMP_TYPE_NAMES[r.timestamp_type], r.timestamp, r.key,
                          r.value, list(r.headers))


def assert_same_records(ours: list[ConsumerRecord], reference: list[ConsumedRecord], topic: str) -> None:
    """Every field of every record, in order; the first difference is reported alone."""
    got = [r.offset for r in ours]
    want = [r.offset for r in reference]
    if got != want:
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        pytest.fail(f"offsets differ: {len(got)} decoded, {len(want)} expected; missing "
                    f"{missing[:10]}, unexpected {extra[:10]}, in order: {got == sorted(got)}")
    for mine, ref in zip(ours, reference):
        assert (mine.topic, mine.partition) == (topic, 0)
        for name in ("key", "value"):
            v = getattr(mine, name)
            assert v is None or type(v) is bytes, f"offset {mine.offset}: {name} is {type(v)}"
        for k, v in mine.headers:
            assert type(k) is str and (v is None or type(v) is bytes), (mine.offset, k, type(v))
        ours_as_confluent = as_consumed(mine)
        if ours_as_confluent != ref:
            diffs = [f"  {f.name}: ours {_short(getattr(ours_as_confluent, f.name))}, "
                     f"confluent {_short(getattr(ref, f.name))}"
                     for f in fields(ConsumedRecord)
                     if getattr(ours_as_confluent, f.name) != getattr(ref, f.name)]
            pytest.fail(f"offset {ref.offset} differs:\n" + "\n".join(diffs))


def assert_matches_produced(ours: list[ConsumerRecord], produced: dict[int, Record]) -> None:
    """Independent of confluent's consumer: what we decoded is what was produced."""
    for r in ours:
        p = produced[r.offset]
        assert (r.key, r.value, tuple(r.headers)) == (p.key, p.value, p.headers), r.offset
        if p.timestamp is not None:
            assert (r.timestamp, r.timestamp_type) == (p.timestamp, records.CREATE_TIME), r.offset


def leader_epochs(batches: list[RawBatch]) -> dict[int, int | None]:
    """Offset -> the partition leader epoch in its batch header (bytes 12-15), read by struct."""
    out = {}
    for b in batches:
        epoch = struct.unpack_from(">i", b.data, 12)[0]
        for offset in range(b.base_offset, b.base_offset + b.last_offset_delta + 1):
            out[offset] = None if epoch < 0 else epoch
    return out


# --- 1. every field, every codec, both decoders ------------------------------------------------

def test_fetched_records_match_confluent(kafka, golden, decoder):
    leader = kafka.leader(golden.topic)
    rounds = kafka.fetch_all(leader, golden.last_offset, plain_reader(golden.topic),
                             max_bytes=SMALL_FETCH)
    ours = decoded(rounds)

    assert_same_records(ours, golden.consumed, golden.topic)
    assert_matches_produced(ours, golden.produced)
    epochs = leader_epochs(raw_batches(rounds))
    assert [r.leader_epoch for r in ours] == [epochs[r.offset] for r in ours]
    assert rounds[-1].reader.next_offset == golden.last_offset + 1
    assert all(rnd.reader.filtered == rnd.reader.aborted == rnd.reader.control == 0 for rnd in rounds)

    # The bytes really were what the test is about: several fetches, many batches, the codec
    # on the big record's batch, and one batch wide enough for three-byte offset deltas.
    batches = raw_batches(rounds)
    assert len(rounds) > 2 and len(batches) > 30
    big = golden.phases["big"][0]
    big_batch = next(b for b in batches if b.base_offset <= big <= b.base_offset + b.last_offset_delta)
    assert big_batch.codec == golden.codec
    assert {b.codec for b in batches} <= {golden.codec, "none"}
    assert max(b.record_count for b in batches) > 8192
    varied = golden.phases["varied"]
    assert any(b.base_offset == varied[0] and b.record_count == len(varied) for b in batches), \
        "the varied records were meant to share one batch (linger.ms)"


# --- 2. header filters --------------------------------------------------------------------------

class CountingRules(HeaderRules):
    """HeaderRules that count how often Python evaluates them (the C loop should not at all)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.calls = 0

    def __call__(self, headers) -> bool:
        self.calls += 1
        return super().__call__(headers)


RULES = [
    HeaderRule("drop", "exists", keep=False),
    HeaderRule("empty", "equals", ("",)),
    HeaderRule("kind", "in", ("keep", "also")),
    HeaderRule("ключ", "prefix", ("знач",)),
]


def rules_by_hand(headers) -> bool:
    """RULES, written out: the last occurrence of a key counts; a null value matches no value."""
    last = dict(headers)
    if "drop" in last:
        return False
    if last.get("empty") == b"":
        return True
    if last.get("kind") in (b"keep", b"also"):
        return True
    value = last.get("ключ")
    return value is not None and value.startswith("знач".encode())


def repeated_or_empty(headers) -> bool:
    """A plain callable filter: a header key that repeats, or an empty header value."""
    keys = [k for k, _ in headers]
    return len(keys) != len(set(keys)) or any(v == b"" for _, v in headers)


@pytest.mark.parametrize("kind", ["header-rules", "callable"])
def test_header_filter_keeps_exactly_the_matching_records(kafka, golden, decoder, kind):
    if kind == "header-rules":
        header_filter, predicate = CountingRules(RULES, default=False), rules_by_hand
        assert header_filter.native_rules is not None
    else:
        header_filter, predicate = repeated_or_empty, repeated_or_empty
    expected = [c for c in golden.consumed if predicate(c.headers)]
    # The data makes the filter matter, and the log ends in records it drops.
    assert 0 < len(expected) < len(golden.consumed) - len(golden.phases["wide"])
    assert not any(predicate(c.headers) for c in golden.consumed if c.offset in golden.phases["tail"])
    if kind == "header-rules":
        assert [HeaderRules(RULES, default=False)(c.headers) for c in golden.consumed] == \
            [rules_by_hand(c.headers) for c in golden.consumed]

    leader = kafka.leader(golden.topic)
    rounds = kafka.fetch_all(leader, golden.last_offset,
                             plain_reader(golden.topic, header_filter=header_filter),
                             max_bytes=SMALL_FETCH)

    assert_same_records(decoded(rounds), expected, golden.topic)
    assert sum(rnd.reader.filtered for rnd in rounds) == len(golden.consumed) - len(expected)
    assert rounds[-1].reader.next_offset == golden.last_offset + 1
    assert not rounds[-1].decoded or rounds[-1].decoded[-1].offset < golden.phases["tail"][0]
    if kind == "header-rules":
        # Natively evaluated in C: no record reaches Python to be judged.
        assert header_filter.calls == (0 if decoder == "c-loop" else len(golden.consumed))


@pytest.mark.parametrize("kind", ["header-rules", "callable"])
def test_a_reader_told_of_what_it_filters_hands_over_exactly_the_dropped_records(kafka, golden, decoder, kind):
    """``on_filtered`` (a plugin asked to see the filtered records): what the reader returns and
    counts is the same, and every record the filter drops is handed over whole, in offset order."""
    header_filter, predicate = ((HeaderRules(RULES, default=False), rules_by_hand) if kind == "header-rules"
                                else (repeated_or_empty, repeated_or_empty))
    dropped: list[ConsumerRecord] = []
    leader = kafka.leader(golden.topic)
    rounds = kafka.fetch_all(leader, golden.last_offset,
                             plain_reader(golden.topic, header_filter=header_filter, on_filtered=dropped.extend),
                             max_bytes=SMALL_FETCH)

    assert_same_records(decoded(rounds), [c for c in golden.consumed if predicate(c.headers)], golden.topic)
    assert_same_records(dropped, [c for c in golden.consumed if not predicate(c.headers)], golden.topic)
    assert sum(rnd.reader.filtered for rnd in rounds) == len(dropped) > 0
    assert rounds[-1].reader.next_offset == golden.last_offset + 1


@pytest.mark.parametrize("kind", ["no-filter", "header-rules"])
def test_fetch_from_inside_a_batch(kafka, golden, decoder, kind):
    """A position inside a batch (after a commit or a seek): the broker sends the whole batch and
    the records before the position are neither returned nor counted as filtered."""
    header_filter = HeaderRules(RULES, default=False) if kind == "header-rules" else None
    start = golden.phases["small"][0] + 50
    leader = kafka.leader(golden.topic)
    rounds = kafka.fetch_all(leader, golden.last_offset,
                             plain_reader(golden.topic, header_filter=header_filter),
                             start=start, max_bytes=SMALL_FETCH)

    first = split_batches(rounds[0].records)[0]
    assert first.base_offset < start <= first.base_offset + first.last_offset_delta
    after = [c for c in golden.consumed if c.offset >= start]
    expected = after if header_filter is None else [c for c in after if rules_by_hand(c.headers)]
    assert_same_records(decoded(rounds), expected, golden.topic)
    assert sum(rnd.reader.filtered for rnd in rounds) == len(after) - len(expected)
    assert rounds[-1].reader.next_offset == golden.last_offset + 1


# --- 3. read_committed on real transactional bytes ----------------------------------------------

@dataclass
class TxnLog:
    topic: str
    data_offsets: list[int]             # every data record, committed or aborted or plain
    committed: list[int]                # what read_committed must return
    aborted: list[int]                  # what it must hide
    markers: list[int]                  # control records
    index: list[tuple[int, int, int]]   # (producer_id, first_offset, abort marker offset)
    consumed: list[ConsumedRecord]      # confluent-kafka, read_uncommitted

    @property
    def end(self) -> int:
        return max(self.markers)


def txn_rows(tag: str, n: int) -> list[Record]:
    return [Record(f"{tag}-{i}".encode(), f"v{i}".encode() * (i % 7),
                   (("txn", tag.encode()), ("i", str(i).encode()))) for i in range(n)]


def send_flushed(writer: Writer, rows: list[Record]) -> list[int]:
    """Produce inside the writer's open transaction and flush; the offsets written."""
    return sorted(d.offset for d in write_all(writer, rows, partition=0))


def _transactional(bootstrap: str, topic: str, codec: str, name: str) -> Writer:
    writer = Writer(bootstrap, topic, codec, **{
        "transactional.id": unique(name), "batch.num.messages": 100, "linger.ms": 5})
    writer.producer.init_transactions(TIMEOUT)
    return writer


def aborted_index(batches: list[RawBatch]) -> list[tuple[int, int, int]]:
    """(producer_id, first_offset, marker_offset) of each aborted transaction, from batch headers.

    What a Kafka broker's transaction index holds: a producer's transaction starts at its first
    transactional data batch and ends at its next control batch.
    """
    open_txn: dict[int, int] = {}
    out = []
    for b in batches:
        if b.is_control:
            first = open_txn.pop(b.producer_id, None)
            if b.control_type == "abort" and first is not None:
                out.append((b.producer_id, first, b.base_offset))
        elif b.is_transactional:
            open_txn.setdefault(b.producer_id, b.base_offset)
    return out


def aborted_for_fetch(index, fetch_offset: int, data) -> list[tuple[int, int]]:
    """The aborted list a Kafka broker puts in a Fetch response: transactions overlapping it."""
    batches = split_batches(data)
    if not batches:
        return []
    upper = max(b.base_offset + b.last_offset_delta for b in batches)
    return [(pid, first) for pid, first, marker in index if marker >= fetch_offset and first <= upper]


@pytest.fixture(scope="module", params=["none", "zstd"])
def txn_log(request, broker) -> TxnLog:
    """Two transactional producers and a plain one, interleaved; the log ends in an ABORT."""
    codec, bootstrap = request.param, broker.bootstrap
    topic = unique(f"txn-{codec}")
    create_topic(bootstrap, topic)
    a, b = _transactional(bootstrap, topic, codec, "a"), _transactional(bootstrap, topic, codec, "b")

    def plain(tag: str) -> list[int]:
        return [d.offset for d in produce(bootstrap, topic, txn_rows(tag, 1), codec, 0)]

    plain_0 = plain("plain-0")
    a.producer.begin_transaction()
    a_commit_1 = send_flushed(a, txn_rows("a-commit-1", 5))
    a.producer.commit_transaction(TIMEOUT)
    a.producer.begin_transaction()
    a_abort_1 = send_flushed(a, txn_rows("a-abort-1", 250))   # on the log before the abort
    plain_inside = plain("plain-inside")                      # inside A's open transaction
    b.producer.begin_transaction()
    b_commit = send_flushed(b, txn_rows("b-commit", 3))       # another producer, inside too
    b.producer.commit_transaction(TIMEOUT)
    a_abort_1 += send_flushed(a, txn_rows("a-abort-1-late", 2))
    a.producer.abort_transaction(TIMEOUT)
    a.producer.begin_transaction()
    a_commit_2 = send_flushed(a, txn_rows("a-commit-2", 3))
    a.producer.commit_transaction(TIMEOUT)
    a.producer.begin_transaction()
    a_abort_2 = send_flushed(a, txn_rows("a-abort-2", 1))
    a.producer.abort_transaction(TIMEOUT)                     # the log ends in this marker
    committed = plain_0 + a_commit_1 + plain_inside + b_commit + a_commit_2
    aborted = a_abort_1 + a_abort_2

    # The reference view of the log, read with the hand-written Fetch v4 until it runs dry.
    batches, offset = [], 0
    while True:
        got = fetch_raw(broker.host, broker.port, topic, offset=offset, max_wait_ms=50).batches()
        if not got:
            break
        batches += got
        offset = got[-1].base_offset + got[-1].last_offset_delta + 1
    markers = [b.base_offset for b in batches if b.is_control]
    index = aborted_index(batches)

    # The index names A's two aborted transactions and where their first records are, by the
    # delivery reports; B's commit inside A's first one is not in it.
    producer_of = {o: b.producer_id for b in batches
                   for o in range(b.base_offset, b.base_offset + b.last_offset_delta + 1)}
    pid_a, pid_b = producer_of[a_abort_1[0]], producer_of[b_commit[0]]
    assert pid_a != pid_b and producer_of[plain_inside[0]] < 0
    assert a_abort_1[0] < plain_inside[0] < b_commit[0] < a_abort_1[-1], "not interleaved"
    assert [(pid, first) for pid, first, _ in index] == [(pid_a, a_abort_1[0]), (pid_a, a_abort_2[0])]
    assert len(markers) == 5 and max(markers) == offset - 1 > max(committed + aborted)
    data_offsets = sorted(committed + aborted)
    consumed = consume_all(bootstrap, topic, 0, 0, offset, isolation_level="read_uncommitted")
    assert [c.offset for c in consumed] == data_offsets
    return TxnLog(topic, data_offsets, sorted(committed), sorted(aborted), markers, index, consumed)


@pytest.mark.parametrize("max_bytes", [1, LARGE_FETCH], ids=["batch-per-fetch", "one-fetch"])
def test_read_committed_hides_aborted_transactions(kafka, txn_log, decoder, max_bytes):
    topic = txn_log.topic

    def reader_for(fetch_offset, data):
        return RecordSetReader(data, topic=topic, partition=0, fetch_offset=fetch_offset,
                               aborted_transactions=aborted_for_fetch(txn_log.index, fetch_offset, data))

    rounds = kafka.fetch_all(kafka.leader(topic), txn_log.end, reader_for, max_bytes=max_bytes,
                             isolation_level=READ_COMMITTED)
    ours = decoded(rounds)

    committed = set(txn_log.committed)
    assert_same_records(ours, [c for c in txn_log.consumed if c.offset in committed], topic)
    assert not {r.offset for r in ours} & (set(txn_log.aborted) | set(txn_log.markers))
    assert sum(rnd.reader.aborted for rnd in rounds) == len(txn_log.aborted)
    assert sum(rnd.reader.control for rnd in rounds) == len(txn_log.markers)
    assert rounds[-1].reader.next_offset == txn_log.end + 1
    if max_bytes == 1:
        assert len(rounds) >= len(txn_log.markers) * 2


def test_read_uncommitted_returns_every_data_record(kafka, txn_log, decoder):
    topic = txn_log.topic
    rounds = kafka.fetch_all(kafka.leader(topic), txn_log.end,
                             plain_reader(topic, aborted_transactions=None), max_bytes=1)
    ours = decoded(rounds)

    assert_same_records(ours, txn_log.consumed, topic)
    assert [r.offset for r in ours] == txn_log.data_offsets
    assert sum(rnd.reader.control for rnd in rounds) == len(txn_log.markers)
    assert rounds[-1].reader.next_offset == txn_log.end + 1


# --- 4. a real broker's ApiVersions, Metadata and Fetch responses, every version ----------------

@pytest.fixture(scope="module")
def small_log(broker) -> GoldenLog:
    topic = unique("versions")
    create_topic(broker.bootstrap, topic)
    phases = PHASES[:1] + (("tail", lambda rng: TAIL, {}),)
    produced, offsets = produce_phases(broker.bootstrap, topic, "gzip", phases, "versions")
    consumed = consume_all(broker.bootstrap, topic, 0, 0, max(produced) + 1,
                           isolation_level="read_uncommitted")
    assert [c.offset for c in consumed] == sorted(produced)
    return GoldenLog(topic, "gzip", produced, consumed, offsets)


def offered(ranges, api, version: int) -> None:
    lo, hi = ranges.get(api.key, (0, -1))
    if not lo <= version <= hi:
        pytest.skip(f"the broker offers {api.name} v{lo}-v{hi}")


# Tansu writes some top-level tagged fields even when they hold their default value; our encoder
# leaves a default out (as Kafka's does), so there the broker's frame ends in a longer tagged
# section than the re-encoded one.  Each entry is Tansu's section exactly: count, then
# (tag, size, value) per field.
TANSU_DEFAULT_TAGS = {
    # ApiVersions v3+: supported_features [], finalized_features_epoch -1, finalized_features [],
    # zk_migration_ready false.
    API_VERSIONS.key: (3, bytes([4, 0, 1, 1, 1, 8]) + b"\xff" * 8 + bytes([2, 1, 1, 3, 1, 0])),
    # Fetch v16+: node_endpoints [].
    FETCH.key: (16, bytes([1, 0, 1, 1])),
}


def assert_reencodes_to_frame(kafka: Kafka, api, version: int, response) -> None:
    """Our encoder, given what we decoded, writes the broker's frame back: every byte was read."""
    assert response.trailing == 0
    frame = messages.encode_response(api, version, response.correlation_id, response.body)[4:]
    since, tagged = TANSU_DEFAULT_TAGS.get(api.key, (None, b""))
    if since is not None and version >= since:
        assert frame[-1:] == b"\x00", "expected an empty top-level tagged section"
        frame = frame[:-1] + tagged
    assert frame == kafka.conn.last_frame, f"{api.name} v{version} does not re-encode to the broker's bytes"


def test_negotiation_picks_topic_id_fetch(ranges):
    assert choose_version(FETCH, ranges) == min(FETCH.max_version, ranges[FETCH.key][1]) >= 13
    assert choose_version(METADATA, ranges) == min(METADATA.max_version, ranges[METADATA.key][1]) >= 10


@pytest.mark.parametrize("version", range(API_VERSIONS.min_version, API_VERSIONS.max_version + 1))
def test_api_versions_response_decodes(kafka, version):
    offered(kafka.ranges, API_VERSIONS, version)
    response = kafka.conn.request(API_VERSIONS, version, SOFTWARE)
    assert response.body["error_code"] == 0
    assert broker_ranges(response.body) == kafka.ranges
    assert_reencodes_to_frame(kafka, API_VERSIONS, version, response)


@pytest.mark.parametrize("version", range(METADATA.min_version, METADATA.max_version + 1))
def test_metadata_response_decodes(kafka, small_log, version):
    offered(kafka.ranges, METADATA, version)
    reference = kafka.leader(small_log.topic)  # at the negotiated version
    response = kafka.conn.request(METADATA, version, metadata_request(small_log.topic))
    body = response.body
    assert_reencodes_to_frame(kafka, METADATA, version, response)

    assert body["error_code"] == 0
    [topic] = body["topics"]
    assert (topic["error_code"], topic["name"]) == (0, small_log.topic)
    [partition] = topic["partitions"]
    assert (partition["error_code"], partition["partition_index"]) == (0, 0)
    assert partition["leader_id"] == reference.leader_id
    assert partition["replica_nodes"] == partition["isr_nodes"] == [reference.leader_id]
    [node] = body["brokers"]
    assert (node["node_id"], node["host"], node["port"]) == (reference.leader_id, kafka.host, kafka.port)
    if version >= 10:
        assert topic["topic_id"] == reference.topic_id != uuid.UUID(int=0)
    else:
        assert topic["topic_id"] == uuid.UUID(int=0)  # not in the response before v10
    if version >= 7:
        assert partition["leader_epoch"] == reference.leader_epoch >= 0


@pytest.mark.parametrize("version", range(FETCH.min_version, FETCH.max_version + 1))
def test_fetch_response_decodes(kafka, small_log, version):
    offered(kafka.ranges, FETCH, version)
    leader = kafka.leader(small_log.topic)
    response = kafka.conn.request(FETCH, version, fetch_request(leader, 0, max_bytes=LARGE_FETCH))
    assert_reencodes_to_frame(kafka, FETCH, version, response)
    body = response.body
    assert (body["error_code"], len(body["responses"])) == (0, 1)
    [topic] = body["responses"]
    if version >= 13:
        assert (topic["topic"], topic["topic_id"]) == ("", leader.topic_id)  # ids replace names
    else:
        assert (topic["topic"], topic["topic_id"]) == (small_log.topic, uuid.UUID(int=0))
    [p] = topic["partitions"]
    assert (p["partition_index"], p["error_code"]) == (0, 0)
    assert p["log_start_offset"] == (0 if version >= 5 else -1)  # -1: absent in v4, the default
    assert p["records"] is not None and len(split_batches(p["records"])) > 0

    rounds = fetch_until(kafka.conn, version, leader, last_offset=small_log.last_offset,
                         reader_for=plain_reader(small_log.topic), max_bytes=LARGE_FETCH)
    assert_same_records(decoded(rounds), small_log.consumed, small_log.topic)
    assert rounds[-1].reader.next_offset == small_log.last_offset + 1
