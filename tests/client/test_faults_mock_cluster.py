"""kdaemon.client.Consumer under faults, against librdkafka's mock cluster (brokers 1, 2, 3).

The issue's requirement: leader moves, a broker going down and up, injected Fetch and
ListOffsets errors and dropped connections lose no record and repeat none, never hang, and end
in a clear error where the cause is permanent.  The mock's watermarks are right (Tansu's are
not), so end offsets and lag are checked here too.

Every scenario writes numbered records with an idempotent confluent-kafka producer (so its own
retries add nothing to the log), writes more while the fault is on, and checks the consumer's
records as they arrive (per partition each offset is exactly the one after the last: a gap is a
loss, a step back a duplicate) and at the end against the delivery reports (same offsets, same
values).  Each consume phase has a deadline, and each scenario runs in a worker thread with a
hard limit, so a hang fails the test with the stuck stack instead of blocking the run.

What the mock cluster (librdkafka 2.16) does not do, and how that shapes the tests:
* no fetch sessions: it answers every Fetch with session id 0, so the consumer stays on full
  fetches (checked below); incremental sessions are tested in test_fetch_session.py;
* no ListOffsets by timestamp: any timestamp gets offset -1, so offsets_for_times is tested
  against Apache Kafka's time index instead (tests/client/test_offsets_for_times_kafka.py);
* injected Fetch errors are set on the whole response (the top-level error code), not on one
  partition; a partition-level NOT_LEADER_OR_FOLLOWER comes from really moving the leader;
* flexible Metadata responses carry one trailing byte too many (the client logs and ignores it).
"""

from __future__ import annotations

import random
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict

import pytest

from kdaemon.client import (Consumer, KafkaTimeoutError, NoBrokersAvailableError, OffsetOutOfRangeError,
                            TopicPartition)
from kdaemon.protocol.apis import LIST_OFFSETS
from kdaemon.protocol.errors import BrokerError, Errors
from testkit import produce
from testkit.mockcluster import ERR_TRANSPORT
from testkit.proxy import CuttingProxy

TOPIC = "faults"
FETCH_KEY, LIST_OFFSETS_KEY = 1, 2
SCENARIO_LIMIT_S = 40  # hard limit for one test's scenario thread
PHASE_S = 15           # deadline for one "consume until ..." phase

# Short timeouts and backoffs so every fault is noticed and retried within a second or two.
FAST = dict(auto_offset_reset="earliest", fetch_max_wait_ms=50, request_timeout_ms=1500,
            reconnect_backoff_ms=20, reconnect_backoff_max_ms=200, retry_backoff_ms=20,
            metadata_max_age_ms=500, socket_connection_setup_timeout_ms=1000,
            default_api_timeout_ms=5000, max_poll_records=50)


# -- machinery ---------------------------------------------------------------------------------

def within(limit_s: float, scenario, *args):
    """Run ``scenario`` in a worker thread; a scenario still running after ``limit_s`` is a hang."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = scenario(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            result["error"] = exc

    worker = threading.Thread(target=run, daemon=True, name="fault-scenario")
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        frame = sys._current_frames().get(worker.ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
        pytest.fail(f"scenario still running after {limit_s} s (hang); it is at:\n{stack}")
    if "error" in result:
        raise result["error"]
    return result.get("value")


class Writer:
    """An idempotent confluent-kafka producer that remembers where each record was delivered."""

    def __init__(self, bootstrap: str, partitions: int, topic: str = TOPIC) -> None:
        self.out = produce.Writer(bootstrap, topic, on_delivered=self._delivered,
                                  **{"enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 30_000})
        self.topic = topic
        self.partitions = partitions
        self.sent = Counter()
        self.delivered: dict[tuple[int, int], bytes] = {}
        self.errors = self.out.errors

    def write(self, n: int, partition: int | None = None) -> None:
        """``n`` records, round-robin over the partitions unless one is given."""
        for _ in range(n):
            i = sum(self.sent.values())
            p = i % self.partitions if partition is None else partition
            self.sent[p] += 1
            self.out.send(f"{self.topic}/{p}/{self.sent[p] - 1}".encode(), partition=p)
        self.out.poll(0)

    def _delivered(self, msg) -> None:
        self.delivered[(msg.partition(), msg.offset())] = msg.value()

    def flush(self, timeout: float = 20.0) -> None:
        left = self.out.flush(timeout)
        assert left == 0 and not self.errors, f"{left} record(s) not delivered; errors: {self.errors[:3]}"
        assert len(self.delivered) == sum(self.sent.values())

    def ends(self) -> dict[int, int]:
        """End offset per partition, from the delivery reports (the test's own truth)."""
        return dict(self.out.ends)


class Ledger:
    """What the consumer returned, checked on arrival."""

    def __init__(self, start: dict[int, int] | None = None) -> None:
        self.next: defaultdict[int, int] = defaultdict(int, start or {})
        self.values: dict[tuple[int, int], bytes] = {}

    def add(self, polled) -> None:
        for tp, records in polled.items():
            for r in records:
                expected = self.next[tp.partition]
                assert r.offset == expected, (
                    f"{tp}: got offset {r.offset} where {expected} was next: "
                    f"{'a duplicate' if r.offset < expected else 'records were skipped'}")
                self.next[tp.partition] = expected + 1
                self.values[(tp.partition, r.offset)] = r.value

    @property
    def count(self) -> int:
        return len(self.values)


def tps(n: int, topic: str = TOPIC) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(n)]


def poll(consumer: Consumer, ledger: Ledger, timeout_ms: int = 100):
    started = time.monotonic()
    polled = consumer.poll(timeout_ms)
    took = time.monotonic() - started
    # Liveness, not speed: poll must come back about when its timeout says, whatever the fault.
    assert took < timeout_ms / 1000 + 5, f"poll({timeout_ms}) blocked for {took:.1f} s"
    ledger.add(polled)
    return polled


def consume_until(consumer: Consumer, ledger: Ledger, done, what: str, writer: Writer | None = None,
                  deadline_s: float = PHASE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {deadline_s} s; consumed per partition "
                                 f"{dict(ledger.next)}, written {dict(writer.sent) if writer else '?'}")
        poll(consumer, ledger)
        if writer is not None:
            writer.out.poll(0)


def everything(ledger: Ledger, writer: Writer):
    """Done when every record written was delivered and consumed."""
    def done() -> bool:
        writer.out.poll(0)
        return len(writer.delivered) == sum(writer.sent.values()) and ledger.count >= len(writer.delivered)
    return done


def check_exactly_once(ledger: Ledger, writer: Writer, consumer: Consumer) -> None:
    """Every delivered record consumed once with its value; a few more polls catch a late duplicate."""
    writer.flush()
    for _ in range(3):
        poll(consumer, ledger)
    assert ledger.values == writer.delivered


def new_consumer(bootstrap: str, partitions: list[TopicPartition], **options) -> Consumer:
    consumer = Consumer(bootstrap, **{**FAST, **options})
    consumer.assign(partitions)
    return consumer


def leaders(cluster, partitions: int) -> dict[int, int]:
    """Pin partition p's leader to broker p % 3 + 1 and return that map."""
    out = {}
    for p in range(partitions):
        out[p] = p % 3 + 1
        cluster.partition_set_leader(TOPIC, p, out[p])
    return out


# -- it works at all -----------------------------------------------------------------------------

def test_consumes_every_record_from_the_mock_cluster(mock_cluster):
    """The mock answers ApiVersions v3+ in a layout of its own and pads flexible Metadata; the
    consumer still connects to all three brokers and reads everything exactly once."""
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 1)
        leaders(mock_cluster, 3)
        writer = Writer(mock_cluster.bootstrap, 3)
        writer.write(300)
        writer.flush()
        with new_consumer(mock_cluster.bootstrap, tps(3)) as c:
            ledger = Ledger()
            consume_until(c, ledger, everything(ledger, writer), "all records")
            check_exactly_once(ledger, writer, c)
            assert set(c.metrics().fetch_requests_per_node) == {1, 2, 3}
    within(SCENARIO_LIMIT_S, scenario)


def test_first_poll_returns_records_instead_of_sitting_out_its_timeout(mock_cluster):
    """With positions known (a seek, a committed offset) nothing waits on ListOffsets; connecting,
    metadata and the leader's connection must still progress inside one poll."""
    def scenario():
        mock_cluster.topic_create(TOPIC, 1, 1)
        writer = Writer(mock_cluster.bootstrap, 1)
        writer.write(10)
        writer.flush()
        with new_consumer(mock_cluster.bootstrap, tps(1), auto_offset_reset="none") as c:
            c.seek(TopicPartition(TOPIC, 0), 0)
            ledger = Ledger()
            polled = poll(c, ledger, timeout_ms=10_000)
            assert polled, "poll(10 s) returned nothing although 10 records were there"
    within(SCENARIO_LIMIT_S, scenario)


# -- leaders and brokers -------------------------------------------------------------------------

def test_leader_moves_mid_consumption(mock_cluster):
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 3)
        first = leaders(mock_cluster, 3)
        writer = Writer(mock_cluster.bootstrap, 3)
        writer.write(300)
        writer.flush()
        with new_consumer(mock_cluster.bootstrap, tps(3)) as c:
            ledger = Ledger()
            consume_until(c, ledger, lambda: ledger.count >= 100, "first third")
            moved = {p: leader % 3 + 1 for p, leader in first.items()}
            for p, leader in moved.items():
                mock_cluster.partition_set_leader(TOPIC, p, leader)
            writer.write(150)
            consume_until(c, ledger, lambda: ledger.count >= 250, "after the first move", writer)
            for p, leader in first.items():  # and back, while records keep coming
                mock_cluster.partition_set_leader(TOPIC, p, leader)
            writer.write(150)
            consume_until(c, ledger, everything(ledger, writer), "after the second move", writer)
            check_exactly_once(ledger, writer, c)
            assert {p: c._metadata.leader_for(tp) for p, tp in enumerate(tps(3))} == first
            assert all(c._metadata.leader_epoch(tp) >= 2 for tp in tps(3))
    within(SCENARIO_LIMIT_S, scenario)


def test_leader_broker_down_and_up(mock_cluster):
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 1)
        leaders(mock_cluster, 3)  # partition 0 on broker 1
        writer = Writer(mock_cluster.bootstrap, 3)
        writer.write(300)
        writer.flush()
        with new_consumer(mock_cluster.bootstrap, tps(3)) as c:
            ledger = Ledger()
            consume_until(c, ledger, lambda: ledger.count >= 100, "first third")
            mock_cluster.broker_set_down(1)
            writer.write(150)  # partition 0's share waits in the producer until broker 1 is back
            # Partitions on the live brokers keep flowing meanwhile.
            consume_until(c, ledger, lambda: all(ledger.next[p] == writer.sent[p] for p in (1, 2)),
                          "partitions 1 and 2 while broker 1 is down", writer)
            stuck_at = ledger.next[0]
            for _ in range(5):
                poll(c, ledger)
            assert ledger.next[0] == stuck_at
            mock_cluster.broker_set_up(1)
            consume_until(c, ledger, everything(ledger, writer), "after broker 1 came back", writer)
            check_exactly_once(ledger, writer, c)
    within(SCENARIO_LIMIT_S, scenario)


def test_slow_broker_times_out_and_recovers(mock_cluster):
    """Answers slower than request_timeout_ms: the request fails, the connection is replaced, the
    other brokers' partitions are not held up, and nothing is lost once the broker is fast again."""
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 1)
        leaders(mock_cluster, 3)
        writer = Writer(mock_cluster.bootstrap, 3)
        writer.write(300)
        writer.flush()
        with new_consumer(mock_cluster.bootstrap, tps(3), request_timeout_ms=700) as c:
            ledger = Ledger()
            consume_until(c, ledger, lambda: ledger.count >= 100, "first third")
            errors_before = c.metrics().fetch_errors_total
            mock_cluster.broker_set_rtt(1, 2000)
            writer.write(150)
            consume_until(c, ledger, lambda: all(ledger.next[p] == writer.sent[p] for p in (1, 2)),
                          "partitions 1 and 2 while broker 1 is slow", writer)
            consume_until(c, ledger, lambda: c.metrics().fetch_errors_total > errors_before,
                          "a timed-out fetch to broker 1", writer)
            mock_cluster.broker_set_rtt(1, 0)
            consume_until(c, ledger, everything(ledger, writer), "after broker 1 sped up", writer)
            check_exactly_once(ledger, writer, c)
    within(SCENARIO_LIMIT_S, scenario)


# -- injected errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("code", [
    Errors.NOT_LEADER_OR_FOLLOWER, Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.FENCED_LEADER_EPOCH,
    Errors.FETCH_SESSION_ID_NOT_FOUND, Errors.INVALID_FETCH_SESSION_EPOCH, Errors.REQUEST_TIMED_OUT,
    ERR_TRANSPORT,
], ids=lambda code: "TRANSPORT" if code == ERR_TRANSPORT else str(code))
def test_injected_fetch_errors(mock_cluster, code):
    """ERR_TRANSPORT makes the broker drop the connection instead of answering."""
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 1)
        leaders(mock_cluster, 3)
        writer = Writer(mock_cluster.bootstrap, 3)
        writer.write(300)
        writer.flush()
        with new_consumer(mock_cluster.bootstrap, tps(3)) as c:
            ledger = Ledger()
            consume_until(c, ledger, lambda: ledger.count >= 100, "first third")
            errors_before = c.metrics().fetch_errors_total
            mock_cluster.push_request_errors(FETCH_KEY, [code] * 4)
            writer.write(150)
            consume_until(c, ledger, everything(ledger, writer), "after the errors", writer)
            check_exactly_once(ledger, writer, c)
            # The errors really happened (each one is a failed or refused Fetch).
            assert c.metrics().fetch_errors_total - errors_before >= 4
    within(SCENARIO_LIMIT_S, scenario)


def test_offset_out_of_range_without_reset_policy_raises_and_loses_nothing(mock_cluster):
    """Partition 1's position is past the log end and there is no reset policy: a clear error.
    Partition 0's records from the same Fetch response are handed out, before or after the
    error, never dropped (their positions had already advanced)."""
    def scenario():
        mock_cluster.topic_create(TOPIC, 2, 1)
        for p in (0, 1):  # one leader, so both partitions come back in one response
            mock_cluster.partition_set_leader(TOPIC, p, 1)
        writer = Writer(mock_cluster.bootstrap, 2)
        writer.write(40)
        writer.flush()
        tp0, tp1 = tps(2)
        with new_consumer(mock_cluster.bootstrap, [tp0, tp1], auto_offset_reset="none") as c:
            c.seek(tp0, 0)
            c.seek(tp1, 1000)
            ledger = Ledger()
            raised = None
            deadline = time.monotonic() + PHASE_S
            while raised is None:
                assert time.monotonic() < deadline, "no OffsetOutOfRangeError"
                try:
                    poll(c, ledger)
                except OffsetOutOfRangeError as exc:
                    raised = exc
            assert raised.offsets == {tp1: 1000}
            assert "auto_offset_reset='none'" in str(raised) and "faults-1@1000" in str(raised)
            c.seek(tp1, 0)  # the operator's decision
            consume_until(c, ledger, everything(ledger, writer), "after seeking back", writer)
            check_exactly_once(ledger, writer, c)
    within(SCENARIO_LIMIT_S, scenario)


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_offset_out_of_range_resets_by_policy(mock_cluster, policy):
    def scenario():
        mock_cluster.topic_create(TOPIC, 1, 1)
        writer = Writer(mock_cluster.bootstrap, 1)
        writer.write(20)
        writer.flush()
        tp = TopicPartition(TOPIC, 0)
        with new_consumer(mock_cluster.bootstrap, [tp], auto_offset_reset=policy) as c:
            c.seek(tp, 1000)
            ledger = Ledger({0: 0 if policy == "earliest" else 20})
            consume_until(c, ledger, lambda: c.position(tp) != 1000, "the reset")
            writer.write(5)
            consume_until(c, ledger, lambda: ledger.next[0] == 25, "the new records", writer)
            writer.flush()
            for _ in range(3):
                poll(c, ledger)
            expected = {k: v for k, v in writer.delivered.items() if k[1] >= (0 if policy == "earliest" else 20)}
            assert ledger.values == expected
    within(SCENARIO_LIMIT_S, scenario)


def test_list_offsets_errors_during_reset_are_retried(mock_cluster):
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 1)
        for p in range(3):  # one leader: one ListOffsets request per attempt
            mock_cluster.partition_set_leader(TOPIC, p, 1)
        writer = Writer(mock_cluster.bootstrap, 3)
        writer.write(90)
        writer.flush()
        retriable = [Errors.NOT_LEADER_OR_FOLLOWER, Errors.UNKNOWN_TOPIC_OR_PARTITION,
                     Errors.LEADER_NOT_AVAILABLE, Errors.REQUEST_TIMED_OUT, Errors.FENCED_LEADER_EPOCH]
        mock_cluster.push_request_errors(LIST_OFFSETS_KEY, retriable)
        with new_consumer(mock_cluster.bootstrap, tps(3)) as c:
            sent = count_requests(c)
            ledger = Ledger()
            consume_until(c, ledger, everything(ledger, writer), "all records", writer)
            check_exactly_once(ledger, writer, c)
            assert sent[LIST_OFFSETS.key] >= len(retriable) + 1
    within(SCENARIO_LIMIT_S, scenario)


def test_list_offsets_permanent_error_is_raised(mock_cluster):
    """TOPIC_AUTHORIZATION_FAILED is not retried silently: poll (resetting a position) and
    end_offsets raise it; once the cause is gone, consuming resumes."""
    def scenario():
        mock_cluster.topic_create(TOPIC, 1, 1)
        writer = Writer(mock_cluster.bootstrap, 1)
        writer.write(10)
        writer.flush()
        tp = TopicPartition(TOPIC, 0)
        mock_cluster.push_request_errors(LIST_OFFSETS_KEY, [Errors.TOPIC_AUTHORIZATION_FAILED] * 2)
        with new_consumer(mock_cluster.bootstrap, [tp]) as c:
            ledger = Ledger()
            with pytest.raises(BrokerError) as raised:
                consume_until(c, ledger, lambda: False, "the authorization error")
            assert raised.value.code == Errors.TOPIC_AUTHORIZATION_FAILED
            assert ledger.count == 0
            with pytest.raises(BrokerError) as raised:
                c.end_offsets([tp], timeout_ms=3000)
            assert raised.value.code == Errors.TOPIC_AUTHORIZATION_FAILED
            consume_until(c, ledger, everything(ledger, writer), "after the cause went away", writer)
            check_exactly_once(ledger, writer, c)
    within(SCENARIO_LIMIT_S, scenario)


def test_no_broker_reachable_is_a_clear_error_not_a_hang(mock_cluster):
    def scenario():
        mock_cluster.topic_create(TOPIC, 1, 1)
        writer = Writer(mock_cluster.bootstrap, 1)
        writer.write(10)
        writer.flush()
        for broker in mock_cluster.broker_ids:
            mock_cluster.broker_set_down(broker)
        tp = TopicPartition(TOPIC, 0)
        with new_consumer(mock_cluster.bootstrap, [tp], default_api_timeout_ms=1500) as c:
            with pytest.raises(KafkaTimeoutError):
                c.end_offsets([tp], timeout_ms=500)
            ledger = Ledger()
            with pytest.raises(NoBrokersAvailableError):
                consume_until(c, ledger, lambda: False, "NoBrokersAvailableError")
            for broker in mock_cluster.broker_ids:
                mock_cluster.broker_set_up(broker)
            consume_until(c, ledger, everything(ledger, writer), "after the brokers came back", writer)
            check_exactly_once(ledger, writer, c)
    within(SCENARIO_LIMIT_S, scenario)


def count_requests(consumer: Consumer) -> Counter:
    """Count requests by API key as the consumer sends them (a test seam on the network client)."""
    sent = Counter()
    network = consumer._network
    send = network.send

    def counting(node_id, api, body, **kw):
        sent[api.key] += 1
        return send(node_id, api, body, **kw)

    network.send = counting
    return sent


# -- dropped connections -------------------------------------------------------------------------

def route_through(consumer: Consumer, proxy: CuttingProxy) -> None:
    """Make the consumer reach every broker through ``proxy`` (the mock advertises its own
    addresses, so the broker list from metadata is rewritten on its way in)."""
    network = consumer._network
    set_brokers = network.set_brokers
    network.set_brokers = lambda brokers: set_brokers(
        {node: proxy.addresses.get(addr, addr) for node, addr in brokers.items()})


def test_connections_cut_at_random_points(mock_cluster):
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 1)
        leaders(mock_cluster, 3)
        writer = Writer(mock_cluster.bootstrap, 3)
        writer.write(300)
        writer.flush()
        rng = random.Random(20250101)
        budgets = [rng.randint(50, 8000) for _ in range(6)]
        with CuttingProxy(mock_cluster.addresses) as proxy:
            c = Consumer(proxy.bootstrap(mock_cluster.addresses[0]), **FAST)
            route_through(c, proxy)
            c.assign(tps(3))
            with c:
                ledger = Ledger()
                proxy.cut_after(*budgets)
                consume_until(c, ledger, lambda: ledger.count >= 150, "half, while cutting")
                writer.write(150)
                done = everything(ledger, writer)
                consume_until(c, ledger, lambda: done() and proxy.pending_cuts == 0,
                              "everything, after all cuts", writer)
                check_exactly_once(ledger, writer, c)
            assert proxy.cuts == len(budgets)
            assert proxy.connections > 3 + 1  # reconnected after cuts, to every broker via the proxy
    within(SCENARIO_LIMIT_S, scenario)


def test_an_unreachable_coordinator_is_looked_up_with_backoff_and_reconnected(mock_cluster):
    """The coordinator's broker refuses connections for a while but the cluster still names it
    (testkit/chaos/run.py's proxy cuts did this): the member looks it up again with a growing backoff
    and reconnects to it once it answers.  (A classic member, as here, always recovered: its
    heartbeat goes out whatever the lookup thinks and reconnects.  A KIP-848 member sends only
    to a coordinator the lookup calls known, and the lookup called a failed connection unknown
    but kept it, so nothing reconnected it: it asked FindCoordinator ten times a second for as
    long as its session lasted, with the broker up; tests/chaos/test_chaos_reduced.py shows
    that on Kafka, the librdkafka mock has no KIP-848.)"""
    from kdaemon.protocol.apis import FIND_COORDINATOR

    def scenario():
        mock_cluster.serve_groups()
        mock_cluster.topic_create(TOPIC, 2, 1)
        writer = Writer(mock_cluster.bootstrap, 2)
        writer.write(100)
        writer.flush()
        c = Consumer(mock_cluster.bootstrap, group_id=f"unreachable-{random.random()}",
                     session_timeout_ms=10_000, heartbeat_interval_ms=200, **FAST)
        sent = count_requests(c)
        c.subscribe([TOPIC])
        with c:
            ledger = Ledger()
            consume_until(c, ledger, lambda: ledger.count >= 50, "the first records")
            coordinator = c._group.coordinator.broker   # noqa: SLF001 - which broker to take down
            before = sent[FIND_COORDINATOR.key]
            mock_cluster.broker_set_down(coordinator)
            try:
                until = time.monotonic() + 2.0
                while time.monotonic() < until:
                    ledger.add(c.poll(100))
            finally:
                mock_cluster.broker_set_up(coordinator)
            until = time.monotonic() + 2.0
            while time.monotonic() < until:
                ledger.add(c.poll(100))
            lookups = sent[FIND_COORDINATOR.key] - before
            assert lookups <= 15, f"{lookups} FindCoordinator requests in 4 s"
            writer.write(100)
            consume_until(c, ledger, everything(ledger, writer), "everything, after the outage", writer)
            assert c.group_state().stable
    within(SCENARIO_LIMIT_S, scenario)


# -- pause ----------------------------------------------------------------------------------------

def test_pause_holds_only_the_paused_partition_and_repeats_nothing(mock_cluster):
    """Both partitions come back in one Fetch response.  Pausing the one being drained must not
    hold up the other (its data is queued behind it), and resuming must go on where it stopped,
    not hand the rest of the batch out twice."""
    def scenario():
        mock_cluster.topic_create(TOPIC, 2, 1)
        for p in (0, 1):
            mock_cluster.partition_set_leader(TOPIC, p, 1)
        writer = Writer(mock_cluster.bootstrap, 2)
        writer.write(40)
        writer.flush()
        with new_consumer(mock_cluster.bootstrap, tps(2), max_poll_records=5) as c:
            ledger = Ledger()
            consume_until(c, ledger, lambda: ledger.count > 0, "the first records")
            (paused,) = {tp for tp in tps(2) if ledger.next[tp.partition]}
            other = tps(2)[1 - paused.partition]
            assert ledger.next[paused.partition] < 20  # some of its batch is still buffered
            c.pause(paused)
            consume_until(c, ledger, lambda: ledger.next[other.partition] == 20, "the other partition")
            held = ledger.next[paused.partition]
            for _ in range(3):
                poll(c, ledger)
            assert ledger.next[paused.partition] == held
            c.resume(paused)
            consume_until(c, ledger, everything(ledger, writer), "after resume", writer)
            check_exactly_once(ledger, writer, c)
    within(SCENARIO_LIMIT_S, scenario)


# -- offsets, watermarks, lag --------------------------------------------------------------------

def test_end_offsets_beginning_offsets_and_lag(mock_cluster):
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 1)
        leaders(mock_cluster, 3)
        writer = Writer(mock_cluster.bootstrap, 3)
        for p, n in ((0, 30), (1, 20), (2, 10)):
            writer.write(n, partition=p)
        writer.flush()
        parts = tps(3)
        with new_consumer(mock_cluster.bootstrap, parts, max_poll_records=7) as c:
            ends = {tp: writer.ends()[tp.partition] for tp in parts}
            assert ends == {parts[0]: 30, parts[1]: 20, parts[2]: 10}
            assert c.end_offsets(parts) == ends
            assert c.beginning_offsets(parts) == {tp: 0 for tp in parts}
            assert all(m.records_lag is None for m in c.metrics().partitions.values())

            ledger = Ledger()
            seen_lag = set()
            deadline = time.monotonic() + PHASE_S
            while ledger.count < 60:
                assert time.monotonic() < deadline, f"consumed {dict(ledger.next)}"
                poll(c, ledger)
                for tp, m in c.metrics().partitions.items():
                    if m.records_lag is not None:
                        assert m.records_lag == ends[tp] - ledger.next[tp.partition], tp
                        seen_lag.add(m.records_lag)
            assert max(seen_lag) > 0  # lag was seen above zero, not only at the end
            for _ in range(3):
                poll(c, ledger)
            metrics = c.metrics()
            assert {tp: m.records_lag for tp, m in metrics.partitions.items()} == {tp: 0 for tp in parts}
            assert metrics.records_lag_max == 0
            assert {tp: m.high_watermark for tp, m in metrics.partitions.items()} == ends

            # More records: the end moves, lag follows, and drains back to 0.
            writer.write(9, partition=0)
            writer.flush()
            assert c.end_offsets([parts[0]]) == {parts[0]: 39}
            consume_until(c, ledger, lambda: ledger.next[0] == 39, "the 9 new records")
            consume_until(c, ledger, lambda: c.metrics().partitions[parts[0]].records_lag == 0,
                          "lag back to 0")
            check_exactly_once(ledger, writer, c)

        # seek_to_end on a fresh consumer: nothing old comes back, only what is written after.
        with new_consumer(mock_cluster.bootstrap, parts) as c:
            c.seek_to_end(*parts)
            ends = writer.ends()
            assert {tp: c.position(tp) for tp in parts} == {tp: ends[tp.partition] for tp in parts}
            ledger = Ledger(ends)
            writer.write(6)
            consume_until(c, ledger, lambda: ledger.count == 6, "the records after the end", writer)
            writer.flush()
            for _ in range(3):
                poll(c, ledger)
            assert ledger.values == {k: v for k, v in writer.delivered.items() if k[1] >= ends[k[0]]}
    within(SCENARIO_LIMIT_S, scenario)


# -- fetch sessions --------------------------------------------------------------------------------

def test_fetch_sessions_the_mock_declines_mean_full_fetches(mock_cluster):
    """Every Fetch asks for a session (id 0, epoch 0); the mock always answers session id 0, so
    each next request must again be a full one listing every partition, never an incremental one
    for a session the broker does not have."""
    def scenario():
        mock_cluster.topic_create(TOPIC, 3, 1)
        for p in range(3):
            mock_cluster.partition_set_leader(TOPIC, p, 1)
        writer = Writer(mock_cluster.bootstrap, 3)
        writer.write(150)
        writer.flush()
        with new_consumer(mock_cluster.bootstrap, tps(3)) as c:
            ledger = Ledger()
            bodies = []
            deadline = time.monotonic() + PHASE_S
            while ledger.count < 150 or len(bodies) < 10:
                assert time.monotonic() < deadline
                poll(c, ledger)
                body = c.metrics().last_fetch_request
                if body is not None and (not bodies or body is not bodies[-1]):
                    bodies.append(body)
            assert all((b["session_id"], b["session_epoch"]) == (0, 0) for b in bodies)
            assert all(b["forgotten_topics_data"] == [] for b in bodies)
            # Idle at the end: nothing buffered, so a full request names all three partitions.
            for _ in range(3):
                poll(c, ledger)
            last = c.metrics().last_fetch_request
            assert sorted(p["partition"] for t in last["topics"] for p in t["partitions"]) == [0, 1, 2]
            session = c._fetcher._sessions[1]
            assert (session.session_id, session.epoch) == (0, 0)
            check_exactly_once(ledger, writer, c)
    within(SCENARIO_LIMIT_S, scenario)
