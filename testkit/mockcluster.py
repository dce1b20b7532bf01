"""librdkafka's mock cluster, driven through ctypes.

The confluent-kafka wheel bundles librdkafka, and librdkafka contains a mock Kafka cluster: brokers
on loopback ports that speak enough of the protocol for producers, consumers and groups, with
hooks to inject errors, move leaders, take brokers down, and limit API versions.  It is the place
to test failure handling that a real broker cannot be made to show on demand.

The mock API is declared experimental by librdkafka (no ABI promise), so every signature used is
written out below and checked at load time: a missing symbol fails loudly, not with a crash.

A mock cluster needs an ``rd_kafka_t`` for its bookkeeping; we create a bare producer handle for
it with the C API.  The handle and the cluster live in this process (the cluster runs its own
thread), so they go away with ``close()`` or at the end of the ``with`` block.

Known quirks of the mock (librdkafka 2.16):
* it implements ApiVersions v0-v2 only, and answers v3+ with UNSUPPORTED_VERSION in a layout of
  its own (int16 error, *int8* entry count, the ApiVersions entry, int32 throttle), which is
  neither Kafka's v0 fallback (int32 count) nor v3; ask it v0-v2.
* transaction control batches it writes carry CRC 0: read them with ``check.crcs`` off.
* like Tansu, its Fetch never lists aborted transactions.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Iterable

# Error codes librdkafka defines below zero that are useful to inject.
ERR_TRANSPORT = -195  # RD_KAFKA_RESP_ERR__TRANSPORT: the mock broker drops the connection

_RD_KAFKA_PRODUCER = 0
_c_rk = ctypes.c_void_p
_c_mcluster = ctypes.c_void_p

# name: (restype, argtypes)
_SIGNATURES = {
    "rd_kafka_conf_new": (ctypes.c_void_p, []),
    "rd_kafka_conf_set": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_char_p, ctypes.c_size_t]),
    "rd_kafka_conf_destroy": (None, [ctypes.c_void_p]),
    "rd_kafka_new": (_c_rk, [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    "rd_kafka_destroy": (None, [_c_rk]),
    "rd_kafka_err2name": (ctypes.c_char_p, [ctypes.c_int]),
    "rd_kafka_version_str": (ctypes.c_char_p, []),
    "rd_kafka_mock_cluster_new": (_c_mcluster, [_c_rk, ctypes.c_int]),
    "rd_kafka_mock_cluster_destroy": (None, [_c_mcluster]),
    "rd_kafka_mock_cluster_bootstraps": (ctypes.c_char_p, [_c_mcluster]),
    "rd_kafka_mock_topic_create": (ctypes.c_int, [_c_mcluster, ctypes.c_char_p, ctypes.c_int,
                                                  ctypes.c_int]),
    "rd_kafka_mock_topic_set_error": (None, [_c_mcluster, ctypes.c_char_p, ctypes.c_int]),
    "rd_kafka_mock_partition_set_leader": (ctypes.c_int, [_c_mcluster, ctypes.c_char_p,
                                                          ctypes.c_int32, ctypes.c_int32]),
    "rd_kafka_mock_partition_set_follower": (ctypes.c_int, [_c_mcluster, ctypes.c_char_p,
                                                            ctypes.c_int32, ctypes.c_int32]),
    "rd_kafka_mock_broker_set_down": (ctypes.c_int, [_c_mcluster, ctypes.c_int32]),
    "rd_kafka_mock_broker_set_up": (ctypes.c_int, [_c_mcluster, ctypes.c_int32]),
    "rd_kafka_mock_broker_set_rtt": (ctypes.c_int, [_c_mcluster, ctypes.c_int32, ctypes.c_int]),
    "rd_kafka_mock_coordinator_set": (ctypes.c_int, [_c_mcluster, ctypes.c_char_p,
                                                     ctypes.c_char_p, ctypes.c_int32]),
    "rd_kafka_mock_push_request_errors_array": (None, [_c_mcluster, ctypes.c_int16,
                                                       ctypes.c_size_t,
                                                       ctypes.POINTER(ctypes.c_int)]),
    "rd_kafka_mock_clear_request_errors": (None, [_c_mcluster, ctypes.c_int16]),
    "rd_kafka_mock_set_apiversion": (ctypes.c_int, [_c_mcluster, ctypes.c_int16, ctypes.c_int16,
                                                    ctypes.c_int16]),
    "rd_kafka_mock_group_initial_rebalance_delay_ms": (None, [_c_mcluster, ctypes.c_int32]),
}

# The newest group API versions whose requests the mock parses (librdkafka 2.16): it offers
# JoinGroup v6 and SyncGroup v4 but reads their arrays with the non-flexible int32 count (a
# flexible JoinGroup makes it drop the connection), and reads LeaveGroup in the v0-2 layout
# whatever the version.  These are the versions librdkafka's own consumer uses.
_GROUP_API_CAPS = ((11, 5), (14, 3), (12, 3), (13, 2))   # JoinGroup, SyncGroup, Heartbeat, LeaveGroup

_lib: ctypes.CDLL | None = None


class MockClusterError(RuntimeError):
    pass


def librdkafka_path() -> str:
    """The librdkafka shared library bundled in the confluent-kafka wheel."""
    import confluent_kafka

    site = os.path.dirname(os.path.dirname(confluent_kafka.__file__))
    found = sorted(glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*")))
    if not found:
        raise MockClusterError(
            f"no bundled librdkafka under {site}/confluent_kafka.libs; the mock cluster needs the "
            "confluent-kafka binary wheel (a source build links a system librdkafka instead)")
    return found[0]


def librdkafka() -> ctypes.CDLL:
    """Load the bundled librdkafka once, with every mock-cluster signature declared."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(librdkafka_path())
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise MockClusterError(f"the bundled librdkafka has no {name}; the mock "
                                       "cluster API changed in this confluent-kafka") from None
            fn.restype, fn.argtypes = restype, argtypes
        _lib = lib
    return _lib


def _check(err: int, what: str) -> None:
    if err:
        name = librdkafka().rd_kafka_err2name(err).decode()
        raise MockClusterError(f"{what} failed: {name} ({err})")


class MockCluster:
    """A running mock cluster of ``brokers`` brokers with ids 1..brokers."""

    def __init__(self, brokers: int = 3) -> None:
        lib = librdkafka()
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # A quiet handle: it only owns the cluster, it never connects anywhere.
        for k, v in (("log_level", "3"),):
            if lib.rd_kafka_conf_set(conf, k.encode(), v.encode(), errstr, len(errstr)) != 0:
                lib.rd_kafka_conf_destroy(conf)
                raise MockClusterError(f"rd_kafka_conf_set({k}): {errstr.value.decode()}")
        rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not rk:  # rd_kafka_new frees conf only on success
            lib.rd_kafka_conf_destroy(conf)
            raise MockClusterError(f"rd_kafka_new: {errstr.value.decode()}")
        mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
        if not mc:
            lib.rd_kafka_destroy(rk)
            raise MockClusterError(f"rd_kafka_mock_cluster_new({brokers}) returned NULL")
        self._lib, self._rk, self._mc = lib, rk, mc
        self.broker_ids = list(range(1, brokers + 1))
        self.bootstrap: str = lib.rd_kafka_mock_cluster_bootstraps(mc).decode()

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each broker, in broker id order."""
        out = []
        for hp in self.bootstrap.split(","):
            host, _, port = hp.rpartition(":")
            out.append((host, int(port)))
        return out

    def _handle(self) -> int:
        if self._mc is None:
            raise MockClusterError("the mock cluster has been closed")
        return self._mc

    def topic_create(self, name: str, partitions: int = 1, replication: int = 1) -> None:
        _check(self._lib.rd_kafka_mock_topic_create(self._handle(), name.encode(), partitions,
                                                    replication), f"topic_create({name!r})")

    def topic_set_error(self, name: str, error_code: int) -> None:
        """Error to return for the topic in Metadata and AddPartitionsToTxn (0 clears it)."""
        self._lib.rd_kafka_mock_topic_set_error(self._handle(), name.encode(), error_code)

    def partition_set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move a partition's leader; -1 leaves it without one.  Creates the topic if needed."""
        _check(self._lib.rd_kafka_mock_partition_set_leader(
            self._handle(), topic.encode(), partition, broker_id),
            f"partition_set_leader({topic!r}, {partition}, {broker_id})")

    def partition_set_follower(self, topic: str, partition: int, broker_id: int) -> None:
        """The preferred read replica the leader points fetchers to (KIP-392)."""
        _check(self._lib.rd_kafka_mock_partition_set_follower(
            self._handle(), topic.encode(), partition, broker_id),
            f"partition_set_follower({topic!r}, {partition}, {broker_id})")

    def broker_set_down(self, broker_id: int) -> None:
        """Drop the broker's connections and refuse new ones (-1: all).  Leaders do not move."""
        _check(self._lib.rd_kafka_mock_broker_set_down(self._handle(), broker_id),
               f"broker_set_down({broker_id})")

    def broker_set_up(self, broker_id: int) -> None:
        _check(self._lib.rd_kafka_mock_broker_set_up(self._handle(), broker_id),
               f"broker_set_up({broker_id})")

    def broker_set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response of the broker (-1: all) by ``rtt_ms``."""
        _check(self._lib.rd_kafka_mock_broker_set_rtt(self._handle(), broker_id, rtt_ms),
               f"broker_set_rtt({broker_id}, {rtt_ms})")

    def coordinator_set(self, key_type: str, key: str, broker_id: int) -> None:
        """Pin the coordinator for a group (``key_type='group'``) or a transactional id."""
        if key_type not in ("group", "transaction"):
            raise ValueError(f"key_type must be 'group' or 'transaction', not {key_type!r}")
        _check(self._lib.rd_kafka_mock_coordinator_set(
            self._handle(), key_type.encode(), key.encode(), broker_id),
            f"coordinator_set({key_type!r}, {key!r}, {broker_id})")

    def push_request_errors(self, api_key: int, errors: Iterable[int]) -> None:
        """The next requests with ``api_key``, on any broker, fail with these codes in order.

        ``ERR_TRANSPORT`` makes the broker close the connection instead of answering.
        """
        errs = list(errors)
        arr = (ctypes.c_int * len(errs))(*errs)
        self._lib.rd_kafka_mock_push_request_errors_array(self._handle(), api_key, len(errs), arr)

    def clear_request_errors(self, api_key: int) -> None:
        self._lib.rd_kafka_mock_clear_request_errors(self._handle(), api_key)

    def set_apiversion(self, api_key: int, min_version: int, max_version: int) -> None:
        """Limit the versions offered for ``api_key``; -1, -1 removes the API.

        ``max_version`` must not exceed what the mock implements.
        """
        _check(self._lib.rd_kafka_mock_set_apiversion(self._handle(), api_key, min_version,
                                                      max_version),
               f"set_apiversion({api_key}, {min_version}, {max_version})")

    def serve_groups(self, initial_rebalance_delay_ms: int = 100) -> None:
        """Make the group APIs usable by a client that picks the newest version offered (kdaemon's
        does): cap them at the versions the mock parses, and answer a group's first join after
        ``initial_rebalance_delay_ms`` instead of 3 s."""
        for api_key, highest in _GROUP_API_CAPS:
            self.set_apiversion(api_key, 0, highest)
        self._lib.rd_kafka_mock_group_initial_rebalance_delay_ms(self._handle(), initial_rebalance_delay_ms)

    def close(self) -> None:
        mc, rk, self._mc, self._rk = self._mc, self._rk, None, None
        if mc is not None:
            self._lib.rd_kafka_mock_cluster_destroy(mc)
        if rk is not None:
            self._lib.rd_kafka_destroy(rk)

    def __enter__(self) -> "MockCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # A forgotten cluster keeps threads and sockets; closing here is a backstop only.
        try:
            self.close()
        except Exception:
            pass
