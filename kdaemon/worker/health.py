"""Why a worker consumes nothing, said within seconds: the conditions an operator otherwise met
as silence (an unreachable broker, a missing topic, a join that does not complete, a worker
left without partitions, a partition no consumer holds).

A worker left without partitions is one of two conditions, told apart by counting both sides
(``ownership.GroupCensus``: the group's members, the configured topics' partitions):
``no_assignment`` when the group has more members than there are partitions (lower the workers,
or add partitions), ``assignment_pending`` when it has not (this worker waits for partitions
another member still holds: said only if that lasts).  Before the census answers, neither.

``CONDITIONS`` is the one table: each condition, how long it must hold before it is said (a
join takes a moment; a broker that does not answer for five seconds is news), and what to look
at.  ``HealthWatch`` logs one WARNING when a condition has held that long, a summary a minute
while it lasts, and one INFO when it is over; ``problems`` is what the heartbeat carries to the
supervisor (STATUS=) and the metrics (``kdaemon_worker_problems``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..durations import duration

log = logging.getLogger(__name__)

FIRST_WARNING_S = 5.0
# A worker that holds nothing in a group with partitions enough for it waits for another member
# to give some up (its next heartbeat, then its revocation); longer than this is news.
PENDING_S = 15.0
SUMMARY_EVERY_S = 60.0
CHECK_EVERY_S = 1.0

# name → (seconds it must hold before it is said, what to look at)
CONDITIONS: dict[str, tuple[float, str]] = {
    "broker_unreachable": (FIRST_WARNING_S, "check [kafka] bootstrap_servers (and the TLS/SASL settings) and "
                                            "that the brokers run"),
    "topic_missing": (FIRST_WARNING_S, "check [daemon] topics (or topic_pattern), or create the topic"),
    "join_incomplete": (8.0, "look at the group coordinator's broker log; a member slow to rejoin holds a classic "
                             "group for up to its max_poll_interval_ms, a departed static member for its "
                             "session_timeout_ms"),
    "no_assignment": (FIRST_WARNING_S, "the group has more members than the topics have partitions: lower "
                                       "[daemon] workers, or add partitions"),
    "assignment_pending": (PENDING_S, "the coordinator gives a member partitions that another member holds only "
                                      "once that one has given them up: look at the other workers' logs for a "
                                      "revocation that does not end, and for members of the group outside this "
                                      "daemon (kdaemon offsets); a member that stopped without leaving holds its "
                                      "partitions until the group's session timeout (the broker's "
                                      "group.consumer.session.timeout.ms, 45 s by default); under the classic "
                                      "protocol the assignor may leave a member out (range, with several topics "
                                      "of few partitions)"),
    "partition_unowned": (FIRST_WARNING_S, "partitions added since the assignment was made reach a classic group "
                                           "at its leader's next metadata refresh ([kafka] metadata_max_age_ms), "
                                           "and a static assignment ([daemon] assignment = \"static\") only at a "
                                           "restart or reload (SIGHUP); otherwise look for members of the group "
                                           "subscribed to other topics"),
}
# Said instead of the conditions after it: a worker that reaches no broker cannot join, and a
# missing topic leaves it without partitions.
MASKS = {"broker_unreachable": ("join_incomplete", "no_assignment", "assignment_pending", "topic_missing",
                                "partition_unowned"),
         "topic_missing": ("no_assignment", "assignment_pending")}


def observe(consumer, topics, unowned=None, census=None) -> dict[str, str]:
    """The conditions that hold now, each with its detail, from the consumer's public view
    (the group ones only for a group member); ``unowned``: worker 0's ``OwnershipCheck``
    answer, (partitions, who holds none of them), if it has one; ``census()``: the group's
    (members, partitions) from ``ownership.GroupCensus`` or None while unknown, asked only of a
    member left without partitions."""
    out: dict[str, str] = {}
    connected, error = consumer.reachability()
    if not connected and error:
        out["broker_unreachable"] = f"no broker reachable ({error})"
    missing = consumer.missing_topics() & set(topics)
    if missing:
        out["topic_missing"] = f"topic(s) {', '.join(sorted(missing))} do not exist"
    state = consumer.group_state()
    if state is not None:
        if not state.stable:
            out["join_incomplete"] = f"group {state.group_id}: the join has not completed"
        elif not consumer.assignment():
            sizes = census() if census is not None else None
            if sizes is not None:
                members, partitions = sizes
                if members > partitions:
                    out["no_assignment"] = (f"group {state.group_id}: its {members} members share {partitions} "
                                            "partition(s) and this worker has none")
                else:
                    out["assignment_pending"] = (f"group {state.group_id}: this worker has no partitions yet, "
                                                 f"though the group's {members} members share {partitions}")
    if unowned is not None and unowned[0]:
        parts, holder = unowned
        names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(parts)[:10])
        more = f" and {len(parts) - 10} more" if len(parts) > 10 else ""
        out["partition_unowned"] = f"{len(parts)} partition(s) consumed by {holder}: {names}{more}"
    for masking, masked in MASKS.items():
        if masking in out:
            for m in masked:
                out.pop(m, None)
    return out


class HealthWatch:
    def __init__(self, who: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.who = who
        self._clock = clock
        self._since: dict[str, float] = {}
        self._next_summary: dict[str, float] = {}   # the conditions said, and when to say them again
        self._next_check = 0.0

    @property
    def problems(self) -> tuple[str, ...]:
        """The conditions said (held past their grace), sorted."""
        return tuple(sorted(self._next_summary))

    def due(self) -> bool:
        return self._clock() >= self._next_check

    def update(self, observed: dict[str, str]) -> None:
        now = self._clock()
        self._next_check = now + CHECK_EVERY_S
        for name, detail in observed.items():
            since = self._since.setdefault(name, now)
            grace, hint = CONDITIONS[name]
            if now - since < grace:
                continue
            if name not in self._next_summary:
                log.warning("%s: %s for %s; %s", self.who, detail, duration(now - since), hint)
                self._next_summary[name] = now + SUMMARY_EVERY_S
            elif now >= self._next_summary[name]:
                log.warning("%s: still %s, for %s now", self.who, detail, duration(now - since))
                self._next_summary[name] = now + SUMMARY_EVERY_S
        for name in [n for n in self._since if n not in observed]:
            since = self._since.pop(name)
            if self._next_summary.pop(name, None) is not None:
                log.info("%s: %s is over, after %s", self.who, name.replace("_", " "), duration(now - since))
