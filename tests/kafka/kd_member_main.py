"""A kdaemon group member as a process of its own (``KdProcessMember`` in group_members.py).

``python -m tests.kafka.kd_member_main '<json spec>'`` subscribes as the spec says and polls until
SIGTERM (then closes) or SIGKILL (the point: a member that dies without leaving).  Prints one JSON
object a line: the rebalance listener calls ``{"event": "assigned"|"revoked"|"lost",
"partitions": [[t, p], ...]}``, the records each poll returned ``{"event": "records", "records":
[[t, p, offset], ...]}`` and, whenever it changes, ``{"event": "generation", "generation": g,
"member_id": m}``.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading

from kdaemon.client import Consumer


def main(spec: dict) -> None:
    # The group's story on stderr (KdProcessMember.stderr), for a failing test to show.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kdaemon.client.group").setLevel(logging.INFO)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def emit(**o) -> None:
        print(json.dumps(o), flush=True)

    class Listener:
        def on_partitions_assigned(self, ps):
            emit(event="assigned", partitions=sorted([tp.topic, tp.partition] for tp in ps))

        def on_partitions_revoked(self, ps):
            emit(event="revoked", partitions=sorted([tp.topic, tp.partition] for tp in ps))

        def on_partitions_lost(self, ps):
            emit(event="lost", partitions=sorted([tp.topic, tp.partition] for tp in ps))

    c = Consumer(spec["bootstrap"], group_id=spec["group"],
                 partition_assignment_strategy=(spec["assignor"],), **spec["options"])
    c.subscribe(spec["topics"], listener=Listener())
    last = None
    try:
        while not stop.is_set():
            batches = c.poll(100)
            if batches:
                emit(event="records", records=[[r.topic, r.partition, r.offset]
                                               for batch in batches.values() for r in batch])
            generation = c.group_generation()
            if generation is not None and generation != last:
                last = generation
                emit(event="generation", generation=generation[0], member_id=generation[1])
    finally:
        c.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
