"""bench/groups' decomposition of the 4 -> 5 join: where the time from the newcomer's
first group request to the stable group goes, step by step, from the group requests and answers
every traced kdaemon member reports live (``group`` events, bench/groups/join_trace.py's
``group_event``) and the members' rebalance callbacks, all on one monotonic time line.

Consumer protocol (KIP-848), t0 = the newcomer's joining ConsumerGroupHeartbeat (epoch 0):

* the answer to it (the newcomer's epoch; its assignment empty while the others still own the
  partitions it is to have);
* for each member that gives partitions up: the heartbeat answer that brought the smaller
  assignment (the revocation; when that heartbeat went out is a random phase within the
  interval), its revoked callback, and the heartbeat that acknowledged it (its owned
  partitions = the smaller assignment);
* the newcomer's heartbeat that brought its partitions (when it was sent, when answered), its
  assigned callback, and the stable moment (bench/groups' definition).

Classic eager, t0 = the newcomer's first JoinGroup: for each other member, the Heartbeat answer
that told it of the rebalance (REBALANCE_IN_PROGRESS), its JoinGroup sent and answered, its
SyncGroup answered; the newcomer's JoinGroup answered (the join completes when the slowest member
has rejoined) and SyncGroup answered; then stable.

Only what was seen is reported: a step with no event in a round is left out of that round.
"""

from __future__ import annotations

import statistics

REBALANCE_IN_PROGRESS = 27
LOG_RESOLUTION_S = 0.001   # librdkafka's log timestamps

# Step keys in printing order, with their labels; per-member steps are summarized as the first
# and the last member's.
CONSUMER_STEPS = (
    ("join_answered", "newcomer's joining heartbeat answered (epoch given, assignment empty)"),
    ("revocation_first", "first revoking member's heartbeat answer brings its revocation"),
    ("revocation_last", "last revoking member's heartbeat answer brings its revocation"),
    ("ack_first", "first acknowledging heartbeat sent (owned = the smaller assignment)"),
    ("ack_last", "last acknowledging heartbeat sent"),
    ("newcomer_ask", "newcomer's heartbeat that brings its partitions: sent"),
    ("newcomer_wait", "  (duration: since the newcomer's previous heartbeat went out)"),
    ("newcomer_given", "  answered with its partitions"),
    ("newcomer_callback", "  newcomer's assigned callback"),
    ("stable", "group stable (last callback)"),
)
EAGER_STEPS = (
    ("learned_first", "first member learns of the rebalance (Heartbeat: REBALANCE_IN_PROGRESS)"),
    ("learned_last", "last member learns of it"),
    ("rejoin_last", "last member's JoinGroup sent"),
    ("join_answered", "newcomer's JoinGroup answered (the join completed; librdkafka: its SyncGroup sent)"),
    ("sync_last", "last SyncGroup answered"),
    ("stable", "group stable (last callback)"),
)


def _group(events: list, who: str, api: str, direction: str, after: float) -> list[tuple[float, dict]]:
    return [(t, ev) for t, w, ev in events if w == who and ev["event"] == "group" and ev["api"] == api
            and ev["dir"] == direction and t >= after]


def _first_callback(events: list, who: str, kind: str, after: float) -> float | None:
    return next((t for t, w, ev in events if w == who and ev["event"] == kind and t >= after
                 and ev.get("partitions")), None)


def consumer_join(events: list, t_build: float, t_stable: float, newcomer: str, others: list[str]) -> dict:
    """One round's consumer-protocol join, seconds from t0 (module docstring); {} without the
    newcomer's joining heartbeat."""
    events = sorted(events, key=lambda e: e[0])
    joining = next(((t, ev) for t, ev in _group(events, newcomer, "ConsumerGroupHeartbeat", "send", t_build)
                    if ev.get("epoch") == 0), None)
    if joining is None:
        return {}
    t0 = joining[0]
    out: dict = {"t0": t0, "members": {}}
    answers = _group(events, newcomer, "ConsumerGroupHeartbeat", "answer", t0)
    if answers:
        out["join_answered"] = answers[0][0] - t0
    for m in others:
        held = None
        for t, ev in _group(events, m, "ConsumerGroupHeartbeat", "answer", 0.0):
            if t >= t0:
                break
            if ev.get("assigned") is not None:
                held = set(ev["assigned"])
        rev = next(((t, ev) for t, ev in _group(events, m, "ConsumerGroupHeartbeat", "answer", t0)
                    if held is not None and ev.get("assigned") is not None and set(ev["assigned"]) < held), None)
        if rev is None:
            continue
        smaller = set(rev[1]["assigned"])
        sends = _group(events, m, "ConsumerGroupHeartbeat", "send", 0.0)
        before = [t for t, _ in sends if t < rev[0]]
        ack = next((t for t, ev in sends if t > rev[0] and ev.get("owned") is not None
                    and set(ev["owned"]) == smaller), None)
        callback = _first_callback(events, m, "revoked", rev[0])
        out["members"][m] = {
            "asked": before[-1] - t0 if before else None, "revocation": rev[0] - t0,
            "callback": None if callback is None else callback - t0, "ack": None if ack is None else ack - t0,
            "gave": len(held - smaller)}
    revs = [v["revocation"] for v in out["members"].values()]
    acks = [v["ack"] for v in out["members"].values() if v["ack"] is not None]
    if revs:
        out["revocation_first"], out["revocation_last"] = min(revs), max(revs)
    if acks:
        out["ack_first"], out["ack_last"] = min(acks), max(acks)
    given = next(((t, ev) for t, ev in answers if ev.get("assigned")), None)
    if given is not None:
        out["newcomer_given"] = given[0] - t0
        asks = [t for t, _ in _group(events, newcomer, "ConsumerGroupHeartbeat", "send", t0) if t < given[0]]
        if asks:
            out["newcomer_ask"] = asks[-1] - t0
        if len(asks) >= 2:   # what the newcomer waited: its heartbeat interval, the broker's
            out["newcomer_wait"] = asks[-1] - asks[-2]
    callback = _first_callback(events, newcomer, "assigned", t0)
    if callback is not None:
        out["newcomer_callback"] = callback - t0
    out["stable"] = t_stable - t0
    return out


def consumer_join_by_callbacks(events: list, t_build: float, t_stable: float, newcomer: str,
                               others: list[str]) -> dict:
    """``consumer_join``'s steps for a client whose log shows when its heartbeats went out and
    were answered but not what the answers carried (librdkafka): a member's revocation is its
    last heartbeat answer before its revoked callback, its acknowledgment its first heartbeat
    after that callback; the newcomer's partitions came with its last answer before its
    assigned callback.  librdkafka stamps its log in whole milliseconds, so a heartbeat logged
    in the callback's millisecond (``LOG_RESOLUTION_S``) counts as after it."""
    events = sorted(events, key=lambda e: e[0])
    eps = LOG_RESOLUTION_S
    sends = _group(events, newcomer, "ConsumerGroupHeartbeat", "send", t_build)
    if not sends:
        return {}
    t0 = sends[0][0]
    out: dict = {"t0": t0, "members": {}}
    answers = [t for t, _ in _group(events, newcomer, "ConsumerGroupHeartbeat", "answer", t0)]
    if answers:
        out["join_answered"] = answers[0] - t0
    for m in others:
        callback = _first_callback(events, m, "revoked", t0)
        if callback is None or callback > t_stable + 0.5:
            continue
        # In log order (the sort keeps it among equal stamps): the ask, the answer, the ack.
        mine = [(i, t, ev["dir"]) for i, (t, w, ev) in enumerate(events) if w == m and t >= t0
                and ev["event"] == "group" and ev["api"] == "ConsumerGroupHeartbeat"]
        before = [(i, t) for i, t, d in mine if d == "answer" and t <= callback]
        if not before:
            continue
        ri, rt = before[-1]
        asked = [t for i, t, d in mine if d == "send" and i < ri]
        ack = next((t for i, t, d in mine if d == "send" and i > ri and t >= callback - eps), None)
        out["members"][m] = {"asked": asked[-1] - t0 if asked else None, "revocation": rt - t0,
                             "callback": callback - t0, "ack": None if ack is None else ack - t0}
    for key, step in (("revocation", "revocation"), ("ack", "ack")):
        seen = [v[step] for v in out["members"].values() if v[step] is not None]
        if seen:
            out[f"{key}_first"], out[f"{key}_last"] = min(seen), max(seen)
    callback = _first_callback(events, newcomer, "assigned", t0)
    if callback is not None:
        out["newcomer_callback"] = callback - t0
        given = [t for t in answers if t <= callback]
        if given:
            out["newcomer_given"] = given[-1] - t0
            asks = [t for t, _ in sends if t <= given[-1]]
            if asks:
                out["newcomer_ask"] = asks[-1] - t0
            if len(asks) >= 2:
                out["newcomer_wait"] = asks[-1] - asks[-2]
    out["stable"] = t_stable - t0
    return out


def eager_join(events: list, t_build: float, t_stable: float, newcomer: str, others: list[str]) -> dict:
    """One round's classic eager join, seconds from t0 (module docstring); {} without the
    newcomer's JoinGroup."""
    events = sorted(events, key=lambda e: e[0])
    joins = _group(events, newcomer, "JoinGroup", "send", t_build)
    if not joins:
        return {}
    t0 = joins[0][0]
    out: dict = {"t0": t0, "members": {}}
    answered = [t for t, ev in _group(events, newcomer, "JoinGroup", "answer", t0) if not ev["error"]]
    if answered:
        out["join_answered"] = answered[0] - t0
    for m in others:
        learned = next((t for t, ev in _group(events, m, "Heartbeat", "answer", t0)
                        if ev["error"] == REBALANCE_IN_PROGRESS), None)
        rejoin = _group(events, m, "JoinGroup", "send", t0)
        sync = [t for t, ev in _group(events, m, "SyncGroup", "answer", t0) if not ev["error"]]
        out["members"][m] = {"learned": None if learned is None else learned - t0,
                             "rejoin": rejoin[0][0] - t0 if rejoin else None,
                             "sync": sync[0] - t0 if sync else None}
    for key, step in (("learned", "learned"), ("rejoin", "rejoin"), ("sync", "sync")):
        seen = [v[step] for v in out["members"].values() if v[step] is not None]
        if seen:
            out[f"{key}_first"], out[f"{key}_last"] = min(seen), max(seen)
    sync = [t for t, ev in _group(events, newcomer, "SyncGroup", "answer", t0) if not ev["error"]]
    if sync:
        out["sync_last"] = max(out.get("sync_last", 0.0), sync[0] - t0)
    out["stable"] = t_stable - t0
    return out


def eager_join_by_callbacks(events: list, t_build: float, t_stable: float, newcomer: str,
                            others: list[str]) -> dict:
    """``eager_join``'s steps for a client whose log shows when its group requests went out and
    were answered but not their errors (librdkafka): a member learned of the rebalance with its
    last Heartbeat answer before its revoked callback (eager revokes everything first); the
    newcomer's join completed when it sent its SyncGroup (right after the JoinGroup answer)."""
    events = sorted(events, key=lambda e: e[0])
    eps = LOG_RESOLUTION_S
    joins = _group(events, newcomer, "JoinGroup", "send", t_build)
    if not joins:
        return {}
    t0 = joins[0][0]
    out: dict = {"t0": t0, "members": {}}
    syncs = _group(events, newcomer, "SyncGroup", "send", t0)
    if syncs:
        out["join_answered"] = syncs[0][0] - t0
    for m in others:
        callback = _first_callback(events, m, "revoked", t0)
        if callback is None or callback > t_stable + 0.5:
            continue
        beats = [t for t, _ in _group(events, m, "Heartbeat", "answer", t0) if t <= callback + eps]
        rejoin = _group(events, m, "JoinGroup", "send", callback - eps)
        sync = _group(events, m, "SyncGroup", "answer", callback - eps)
        out["members"][m] = {"learned": beats[-1] - t0 if beats else None, "callback": callback - t0,
                             "rejoin": rejoin[0][0] - t0 if rejoin else None, "sync": sync[0][0] - t0 if sync else None}
    for key in ("learned", "rejoin", "sync"):
        seen = [v[key] for v in out["members"].values() if v[key] is not None]
        if seen:
            out[f"{key}_first"], out[f"{key}_last"] = min(seen), max(seen)
    sync = _group(events, newcomer, "SyncGroup", "answer", t0)
    if sync:
        out["sync_last"] = max(out.get("sync_last", 0.0), sync[0][0] - t0)
    out["stable"] = t_stable - t0
    return out


# (client, protocol) -> (decomposer, steps): kdaemon's traced members report their group requests
# and answers with content; librdkafka's are read from its debug log (bench/groups).
DECOMPOSERS = {("kdaemon", "consumer"): (consumer_join, CONSUMER_STEPS),
               ("kdaemon", "eager"): (eager_join, EAGER_STEPS),
               ("confluent", "consumer"): (consumer_join_by_callbacks, CONSUMER_STEPS),
               ("confluent", "eager"): (eager_join_by_callbacks, EAGER_STEPS)}


def decompose_from_logs(history: list, logs: dict, protocol: str, others: list[str], newcomer: str,
                        t0: float, t1: float) -> dict:
    """librdkafka's join decomposed: the group requests in each member's debug log (written by
    then: every member exited), put on the parent's time line by the wall clock at its build
    (its ``building`` event), beside the callbacks in ``history``."""
    from bench.groups.join_trace import confluent_group_requests
    events = [h for h in history if h[0] <= t1 + 0.5]
    for name in others + [newcomer]:
        build = next((ev for _, who, ev in history if who == name and ev["event"] == "building"), None)
        if build is None or "wall" not in build:
            continue
        events += [(ev["t"], name, ev) for ev in confluent_group_requests(logs[name], build["wall"], build["t"])
                   if ev["t"] <= t1 + 0.5]
    return DECOMPOSERS[("confluent", protocol)][0](events, t0, t1, newcomer, others)


def print_decomposition(client: str, protocol: str, label: str, rounds: list[dict], heartbeat_ms: int) -> None:
    """Each step's median (min-max) over the traced rounds, ms from t0, then every round's
    members."""
    steps = DECOMPOSERS[(client, protocol)][1]
    rounds = [r for r in rounds if r]
    t0_what = ("the newcomer's joining ConsumerGroupHeartbeat" if protocol == "consumer"
               else "the newcomer's first JoinGroup")
    print(f"\ndecomposition: {protocol}, {label}, member 5 joining 4, heartbeat {heartbeat_ms} ms, "
          f"{len(rounds)} traced round(s); ms from t0 = {t0_what}")
    for key, text in steps:
        values = [r[key] * 1000 for r in rounds if r.get(key) is not None]
        if values:
            print(f"  {text:<78} {statistics.median(values):8.1f}  "
                  f"({min(values):.1f}-{max(values):.1f}, n={len(values)})")
    for i, r in enumerate(rounds, 1):
        cells = []
        for m, v in r["members"].items():
            cells.append(f"{m} " + " ".join(f"{k} {'-' if x is None else f'{x * 1000:.0f}'}"
                                             for k, x in v.items() if k != "gave")
                         + (f" (gave {v['gave']})" if "gave" in v else ""))
        print(f"  round {i}: " + "; ".join(cells))
