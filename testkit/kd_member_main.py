"""A kdaemon group member as a process of its own (``KdProcessMember`` in group_members.py).

``python -m testkit.kd_member_main '<json spec>'`` subscribes as the spec says and polls until
SIGTERM (then closes) or SIGKILL (the point: a member that dies without leaving).  Prints one JSON
object a line:

* the rebalance listener calls ``{"event": "assigned"|"revoked"|"lost", "partitions": [[t, p],
  ...], "t": time.monotonic()}``;
* the records each poll returned ``{"event": "records", "records": [[t, p, offset], ...]}``;
* with ``"commit": true``, after the records of a poll, the commit of exactly those
  (next offset per partition): ``{"event": "committed", "offsets": [[t, p, next], ...]}`` once it
  returned, or ``{"event": "commit_failed", "type", "error", "offsets"}`` if it raised (the
  member goes on polling: a fenced member's commit must fail, and it rejoins);
* whenever they change, ``{"event": "generation", "generation": g, "member_id": m}`` and
  ``{"event": "epoch", "epoch", "member_id", "stable", "assignment"}`` from ``group_state()``
  (the generation is the member epoch under the consumer protocol);
* ``{"event": "heartbeat", "what": ["sent", epoch] | ["answer", error_code, epoch]}`` for each
  ConsumerGroupHeartbeat whose epoch or error differs from the one before (seen on the wire
  through ``NetworkClient.observers``): how a test sees a fenced member rejoin at epoch 0.

With ``"stall_file"``: once that file exists, the member prints ``{"event": "stalling",
"records": [...], "t": time.monotonic()}`` after the next records it printed and SIGSTOPs itself before committing
them (the file is removed first, so it stalls once); after SIGCONT it goes on with the commit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time

from kdaemon.client import Consumer, TopicPartition


def main(spec: dict) -> None:
    # The group's story on stderr (KdProcessMember.stderr), for a failing test to show.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kdaemon.client.group").setLevel(logging.INFO)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    printing = threading.Lock()   # heartbeats are observed on the heartbeat thread

    def emit(**o) -> None:
        line = json.dumps(o)
        with printing:
            print(line, flush=True)

    class Listener:
        def on_partitions_assigned(self, ps):
            emit(event="assigned", partitions=sorted([tp.topic, tp.partition] for tp in ps), t=time.monotonic())

        def on_partitions_revoked(self, ps):
            emit(event="revoked", partitions=sorted([tp.topic, tp.partition] for tp in ps), t=time.monotonic())

        def on_partitions_lost(self, ps):
            emit(event="lost", partitions=sorted([tp.topic, tp.partition] for tp in ps), t=time.monotonic())

    last_heartbeat: list = [None, None]

    def observe(node, api, version, body, response) -> None:
        if api.name != "ConsumerGroupHeartbeat":
            return
        what = ["answer", body["error_code"], body["member_epoch"]] if response else ["sent", body["member_epoch"]]
        if last_heartbeat[response] != what:
            last_heartbeat[response] = what
            emit(event="heartbeat", what=what)

    c = Consumer(spec["bootstrap"], group_id=spec["group"], **spec["options"])
    c._network.observers.append(observe)   # the public seam for tests; Consumer has no option for it
    c.subscribe(spec["topics"], listener=Listener())
    stall_file = spec.get("stall_file")
    last_generation = last_state = None
    try:
        while not stop.is_set():
            batches = c.poll(100)
            if batches:
                records = [[r.topic, r.partition, r.offset] for batch in batches.values() for r in batch]
                emit(event="records", records=records)
                if stall_file and os.path.exists(stall_file):
                    os.unlink(stall_file)
                    emit(event="stalling", records=records, t=time.monotonic())
                    os.kill(os.getpid(), signal.SIGSTOP)
                if spec.get("commit"):
                    commit(c, batches, emit)
            generation = c.group_generation()
            if generation is not None and generation != last_generation:
                last_generation = generation
                emit(event="generation", generation=generation[0], member_id=generation[1])
            state = c.group_state()
            if state is not None:
                now = (state.generation, state.member_id, state.stable,
                       sorted([tp.topic, tp.partition] for tp in c.assignment()))
                if now != last_state:
                    last_state = now
                    emit(event="epoch", epoch=now[0], member_id=now[1], stable=now[2], assignment=now[3])
    finally:
        c.close()


def commit(c: Consumer, batches: dict, emit) -> None:
    """Commit what this poll returned (commit-after-process) and say how it went."""
    offsets = {TopicPartition(tp.topic, tp.partition): batch[-1].offset + 1 for tp, batch in batches.items()}
    rows = sorted([tp.topic, tp.partition, o] for tp, o in offsets.items())
    try:
        c.commit(offsets)
    except Exception as exc:  # reported; the test decides whether this commit had to fail
        emit(event="commit_failed", type=type(exc).__name__, error=str(exc), offsets=rows)
    else:
        emit(event="committed", offsets=rows)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
