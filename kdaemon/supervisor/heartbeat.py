"""The worker heartbeat: the one definition of what a worker tells the supervisor over its pipe.

A forked worker writes one ``WorkerHeartbeat`` per line (JSON) at most every half second, and
at once when its readiness changes; the supervisor reads them with a ``HeartbeatReader`` per
pipe.  A line is liveness (the supervisor kills a worker silent for ``heartbeat_timeout_s``),
readiness (READY=1 once every worker has its assignment) and the figures of systemd's STATUS.
Both ends use this module, so the fields cannot drift apart.  ``held`` (each partition's
position and lag) is what ``kdaemon status`` shows per worker (``control.py``); a share-group
member (``[kafka] group_type = "share"``) has no positions: it sends ``share`` (its acquired,
settled and in-flight records) instead.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

log = logging.getLogger("kdaemon.supervisor")


@dataclass(frozen=True)
class HeldPartition:
    """A partition a worker holds: its position (next offset to read) and lag to the high
    watermark, as the worker's consumer last measured them (None: not measured yet)."""

    topic: str
    partition: int
    position: int | None
    lag: int | None


@dataclass(frozen=True)
class ShareFigures:
    """A share-group member's records since it started: acquired from the broker, settled by
    verdict (accepted, released, rejected) and held now without a verdict (in flight)."""

    acquired: int
    accepted: int
    released: int
    rejected: int
    in_flight: int


@dataclass(frozen=True)
class WorkerHeartbeat:
    """One beat.  ``generation`` and ``partitions`` only come with the beat on which ``ready``
    turns true, or on which a ready worker's partitions changed (once per assignment): who
    holds what since when, for the supervisor's log.
    ``member_id`` and ``group_protocol`` come whenever the member id is new, the first time
    before the worker joins when the protocol lets the client choose it (KIP-848)."""

    ready: bool
    assigned: int
    lag: int
    delivered: int
    generation: int | None = None
    partitions: tuple[str, ...] | None = None
    # The worker's member id and group protocol ("classic", "consumer"), so its successor can
    # release a static membership it left behind (worker.main.release_predecessor).
    member_id: str | None = None
    group_protocol: str | None = None
    # Seconds the worker's sink has been unable to take records (0: fine), for STATUS=.
    sink_down_s: float = 0.0
    # Why it consumes nothing, if it cannot (worker.health.CONDITIONS names), for STATUS=.
    problems: tuple[str, ...] = ()
    # Every partition the worker holds now, with position and lag, for ``kdaemon status``; None:
    # unchanged since the last beat that carried it (sent on a change, at most every
    # ``HELD_EVERY_S`` unless the assignment itself changed: ``child.Heartbeat``).
    held: tuple[HeldPartition, ...] | None = None
    # The member's generation (its member epoch under KIP-848) when it changed: it joined, or
    # the coordinator moved it to a new target.  Sent at once; the supervisor tells the other
    # workers (``siblings.py``).  None: unchanged.
    epoch: int | None = None
    # A share-group member's figures (instead of ``held``), when they changed.  None: unchanged,
    # or not a share member.
    share: ShareFigures | None = None

    def encode(self) -> bytes:
        msg = asdict(self)
        if self.partitions is None:
            del msg["generation"], msg["partitions"]
        else:
            msg["partitions"] = list(self.partitions)
        if self.member_id is None:
            del msg["member_id"], msg["group_protocol"]
        if not self.sink_down_s:
            del msg["sink_down_s"]
        else:
            msg["sink_down_s"] = round(self.sink_down_s, 1)
        if self.problems:
            msg["problems"] = list(self.problems)
        else:
            del msg["problems"]
        if self.held is None:
            del msg["held"]
        else:
            msg["held"] = [[h.topic, h.partition, h.position, h.lag] for h in self.held]
        if self.epoch is None:
            del msg["epoch"]
        if self.share is None:
            del msg["share"]
        return json.dumps(msg).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> "WorkerHeartbeat":
        """One line without its newline; ValueError names what is wrong with it."""
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise ValueError(f"a heartbeat is a JSON object, not {type(msg).__name__}")
        try:
            partitions = msg.get("partitions")
            return cls(bool(msg["ready"]), int(msg["assigned"]), int(msg["lag"]), int(msg["delivered"]),
                       None if msg.get("generation") is None else int(msg["generation"]),
                       None if partitions is None else tuple(str(p) for p in partitions),
                       None if msg.get("member_id") is None else str(msg["member_id"]),
                       None if msg.get("group_protocol") is None else str(msg["group_protocol"]),
                       float(msg.get("sink_down_s") or 0.0),
                       tuple(str(p) for p in msg.get("problems") or ()),
                       None if msg.get("held") is None else tuple(
                           HeldPartition(str(t), int(p), None if pos is None else int(pos),
                                         None if lag is None else int(lag)) for t, p, pos, lag in msg["held"]),
                       None if msg.get("epoch") is None else int(msg["epoch"]),
                       None if msg.get("share") is None else ShareFigures(**{k: int(v) for k, v in msg["share"].items()}))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a heartbeat without a valid {exc}") from None


@dataclass(frozen=True)
class Predecessor:
    """What the supervisor remembers of a worker index's last process, for its successor: the
    group membership it had (from its heartbeats) and whether it exited cleanly (code 0, after
    leaving as its protocol leaves)."""

    member_id: str
    group_protocol: str | None
    clean: bool


class HeartbeatReader:
    """Turns the bytes read from one worker's pipe into heartbeats (a line may arrive in parts)."""

    def __init__(self, who: str) -> None:
        self.who = who
        self._buffer = b""

    def feed(self, data: bytes) -> list[WorkerHeartbeat]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        beats = []
        for line in lines:
            try:
                beats.append(WorkerHeartbeat.decode(line))
            except ValueError as exc:
                log.warning("%s sent a heartbeat that does not parse (%s): %.200r", self.who, exc, line)
        return beats
