"""``kdaemon offsets --reset-offsets``: move the daemon's group to other offsets, as
``kafka-consumer-groups --reset-offsets`` does, from the daemon's own configuration.

What an operator who knows that tool expects, and what it does (Kafka 4.4's GroupOffsetsResetter):

* one target — ``--to-earliest``, ``--to-latest``, ``--to-datetime``, ``--shift-by N``,
  ``--to-offset N`` — for the configured topics, or ``--topic T`` / ``--topic T:0,2``;
* ``--to-offset`` and ``--shift-by`` are clamped to the partition's [earliest, end] range, with
  a warning naming the partition; ``--shift-by`` needs a commit on every partition it moves;
* ``--to-datetime`` takes the first offset at or after the time; a partition with no record
  that recent moves to its end (a warning says so);
* a dry run unless ``--execute`` is given (``--dry-run`` says so explicitly);
* refused while the group has members: a member would overwrite the new offsets with its own
  positions on its next commit, and the broker refuses a commit from outside a live classic
  generation anyway.  The refusal says who the members are (``refusal``): a stopped daemon's
  workers stay static members for a restart until their session times out (consumer protocol:
  member epoch -2), which is not "running", and ``kdaemon stop --leave-group`` (or
  ``[daemon] on_stop = "leave_group"``) is the stop that leaves nobody behind.

The commit is the same as an admin's: OffsetCommit with generation (member epoch) -1 and no
member id, which Kafka accepts for an empty group of either protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

# The one list of targets: option name (as a click parameter) → what it moves the group to.
TARGETS: dict[str, str] = {
    "to_earliest": "The first offset still in the log",
    "to_latest": "The end of the log (skip everything not consumed yet)",
    "to_datetime": "The first offset with a timestamp at or after an ISO 8601 time",
    "shift_by": "The committed offset plus N (negative: back), within the log",
    "to_offset": "Offset N, within the log",
}
INACTIVE_STATES = ("Empty", "Dead")


class ResetError(Exception):
    """What makes a reset impossible, in words for the operator."""


@dataclass(frozen=True)
class Target:
    kind: str                  # a key of TARGETS
    value: int | None = None   # the offset, the shift, or the time in ms since the epoch


@dataclass(frozen=True)
class PlannedReset:
    topic: str
    partition: int
    committed: int | None
    new: int


def parse_datetime(text: str) -> int:
    """ISO 8601 (what kafka-consumer-groups takes: 2026-11-27T01:00:00.000, with an optional
    zone such as Z or +01:00) in ms since the epoch.  Without a zone the time is UTC, as there
    (Kafka's Utils.getDateTime appends "Z"): the same command gives the same offsets on every
    host, whatever its local zone."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ResetError(f"--to-datetime {text!r} is not an ISO 8601 time; write e.g. "
                         "2026-11-27T01:00:00.000 (UTC) or 2026-11-27T02:00:00.000+01:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


def parse_partitions(args: tuple[str, ...], configured: list[str]) -> list[tuple[str, list[int] | None]]:
    """``--topic`` values (``T`` or ``T:0,2``) as (topic, partitions or None for all); none
    given: every configured topic."""
    if not args:
        return [(t, None) for t in configured]
    out: list[tuple[str, list[int] | None]] = []
    for arg in args:
        topic, sep, parts = arg.partition(":")
        if not topic:
            raise ResetError(f"--topic {arg!r}: name a topic, as T or T:0,1")
        if not sep:
            out.append((topic, None))
            continue
        try:
            numbers = [int(p) for p in parts.split(",")]
        except ValueError:
            raise ResetError(f"--topic {arg!r}: partitions must be numbers, as in {topic}:0,1") from None
        out.append((topic, numbers))
    return out


def plan(consumer, partitions, target: Target, *, timeout_ms: int) -> tuple[list[PlannedReset], list[str]]:
    """The new offset of each partition, and the warnings (clamped, no record that recent).

    ``partitions`` are TopicPartitions that exist; ``consumer`` has the group's id."""
    committed = {tp: (om.offset if om is not None else None)
                 for tp, om in consumer.committed(partitions, timeout_ms=timeout_ms).items()}
    starts = consumer.beginning_offsets(partitions, timeout_ms=timeout_ms)
    ends = consumer.end_offsets(partitions, timeout_ms=timeout_ms)
    warnings: list[str] = []
    for tp in partitions:
        if tp not in starts or tp not in ends:
            raise ResetError(f"{tp.topic}-{tp.partition}: no earliest or end offset (no leader?); retry")
    wanted: dict = {}
    if target.kind == "to_earliest":
        wanted = dict(starts)
    elif target.kind == "to_latest":
        wanted = dict(ends)
    elif target.kind == "to_datetime":
        assert target.value is not None
        found = consumer.offsets_for_times({tp: target.value for tp in partitions}, timeout_ms=timeout_ms)
        for tp in partitions:
            hit = found.get(tp)
            if hit is None:
                warnings.append(f"{tp.topic}-{tp.partition}: no record at or after that time; "
                                f"moving to the end ({ends[tp]})")
                wanted[tp] = ends[tp]
            else:
                wanted[tp] = hit.offset
    elif target.kind == "shift_by":
        assert target.value is not None
        bare = [tp for tp in partitions if committed[tp] is None]
        if bare:
            raise ResetError(f"--shift-by moves a committed offset, and {_names(bare)} "
                             f"{'has' if len(bare) == 1 else 'have'} none; name the partitions with --topic "
                             "T:P, or use --to-earliest / --to-latest / --to-offset")
        wanted = {tp: committed[tp] + target.value for tp in partitions}
    elif target.kind == "to_offset":
        assert target.value is not None
        wanted = {tp: target.value for tp in partitions}
    else:
        raise ValueError(f"unknown reset target {target.kind!r}")
    if target.kind in ("shift_by", "to_offset"):
        for tp in partitions:
            if wanted[tp] > ends[tp]:
                warnings.append(f"{tp.topic}-{tp.partition}: {wanted[tp]} is past the end; moving to the end "
                                f"({ends[tp]})")
                wanted[tp] = ends[tp]
            elif wanted[tp] < starts[tp]:
                warnings.append(f"{tp.topic}-{tp.partition}: {wanted[tp]} is before the earliest offset; moving to "
                                f"the earliest ({starts[tp]})")
                wanted[tp] = starts[tp]
    rows = [PlannedReset(tp.topic, tp.partition, committed[tp], wanted[tp])
            for tp in sorted(partitions, key=lambda t: (t.topic, t.partition))]
    return rows, warnings


@dataclass(frozen=True)
class Expiry:
    """How long the coordinator keeps a member that stopped heartbeating: at most ``ms`` from
    now (its session runs from its last heartbeat, which nobody outside knows), and whose
    setting that is.  ``ms`` None: the broker did not say."""

    ms: int | None
    source: str

    def within(self) -> str:
        if self.ms is None:
            return f"when its session times out ({self.source})"
        return f"within {self.ms / 1000:g} s ({self.source})"


@dataclass(frozen=True)
class Context:
    """What the refusal knows besides the group: this configuration's daemon_id, how long a
    stopped member stays, and the daemon answering on this configuration's state_dir here
    (its pid), if any."""

    daemon_id: str
    expiry: Expiry
    running_here: int | None = None


HOW_TO_LEAVE = ('stop the daemon with kdaemon stop --leave-group (or set [daemon] on_stop = "leave_group") '
                "and its workers leave at once")


def active(group) -> bool:
    """Whether the group (a ``GroupDescription``) has members, or a state only members give it."""
    return group.state not in INACTIVE_STATES or bool(group.members)


def refuse_if_active(group, context: Context | None = None) -> None:
    """Raise if the group is ``active``, saying who its members are."""
    if active(group):
        raise ResetError(refusal(group, context))


def refusal(group, context: Context | None) -> str:
    """Why a group with members cannot be reset, in one line: which members, and what ends each.

    Under the consumer protocol a member with epoch -2 is a static member that left to come
    back (a stopped daemon's worker); the coordinator drops it when its session times out, and
    a restart of its daemon takes it over.  A classic static member that stopped looks like a
    live one (it sends no LeaveGroup), so there only the local daemon's control socket tells."""
    from ..worker.main import daemon_of
    head = (f"group {group.group_id} is {group.state} with {len(group.members)} member(s); offsets can only be "
            "reset while the group has none")
    if context is None:
        return f"{head}: stop every daemon and consumer of it (systemctl stop kdaemon) and retry"
    left = [m for m in group.members if m.left_to_come_back]
    others = [m for m in group.members if not m.left_to_come_back]
    said = []
    if left:
        said.append(f"{_described(left, context.daemon_id, daemon_of)} stopped and "
                    f"{'is' if len(left) == 1 else 'are'} kept for a restart (member epoch -2, static members "
                    f"leaving temporarily): Kafka drops {'it' if len(left) == 1 else 'them'} "
                    f"{context.expiry.within()}; retry then, or next time {HOW_TO_LEAVE}")
    if others:
        if group.protocol == "consumer":
            said.append(f"{_described(others, context.daemon_id, daemon_of)} "
                        f"{'is' if len(others) == 1 else 'are'} running: stop every daemon and consumer of the "
                        "group (kdaemon stop, systemctl stop kdaemon) and retry")
        else:
            said.append(_classic(others, context, daemon_of))
    return f"{head}: " + "; ".join(said)


def _classic(members, context: Context, daemon_of) -> str:
    """Classic members: running, or (static ones) stopped and kept until their session ends."""
    ours = [m for m in members if daemon_of(m.instance_id) == context.daemon_id]
    text = _described(members, context.daemon_id, daemon_of)
    if context.running_here is not None and ours:
        return (f"{text}; daemon {context.daemon_id} runs here (pid {context.running_here}): stop it with "
                f"kdaemon stop --leave-group (or systemctl stop kdaemon with [daemon] on_stop = \"leave_group\") "
                "and retry")
    if any(m.instance_id for m in members):
        # A classic static member sends no LeaveGroup when it stops: running or not, it looks the same.
        here = (f"no daemon answers on this configuration's state_dir here; if {'that daemon is' if ours else 'they are'} "
                "stopped, Kafka keeps its static members for a restart until their session times out, "
                f"{context.expiry.within()}, then retry; else stop every daemon and consumer of the group and "
                f"retry; next time {HOW_TO_LEAVE}")
        return f"{text}: {here}"
    return f"{text}: stop every daemon and consumer of the group (kdaemon stop, systemctl stop kdaemon) and retry"


def _described(members, own: str, daemon_of) -> str:
    """"static members kd-0, kd-1 of daemon kd (this configuration's daemon_id), member m (client
    c on host h)": static members by the daemon their instance id names."""
    by_daemon: dict[str | None, list[str]] = {}
    dynamic = []
    for m in members:
        if m.instance_id:
            by_daemon.setdefault(daemon_of(m.instance_id), []).append(m.instance_id)
        else:
            dynamic.append(f"member {m.member_id} (client {m.client_id} on {m.host})")
    parts = []
    for daemon, ids in sorted(by_daemon.items(), key=lambda kv: (kv[0] != own, kv[0] or "")):
        names = ", ".join(sorted(ids))
        kind = "static member" if len(ids) == 1 else "static members"
        if daemon is None:
            parts.append(f"{kind} {names}")
        elif daemon == own:
            parts.append(f"{kind} {names} of daemon {daemon} (this configuration's daemon_id)")
        else:
            parts.append(f"{kind} {names} of daemon {daemon}")
    return ", ".join(parts + dynamic)


def given_option(value) -> bool:
    """Whether a click option was given: a flag set, a value (0 too), a non-empty repeat."""
    return value is not None and value is not False and value != ()


def _names(parts) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in parts)


def reset_options(command):
    """The options of ``offsets --reset-offsets``, named as kafka-consumer-groups names them."""
    import click
    for decorator in reversed([
        click.option("--reset-offsets", is_flag=True, help="Move the group's offsets (one target below)."),
        click.option("--to-earliest", is_flag=True, help=TARGETS["to_earliest"]),
        click.option("--to-latest", is_flag=True, help=TARGETS["to_latest"]),
        click.option("--to-datetime", metavar="TIME", help=TARGETS["to_datetime"]),
        click.option("--shift-by", type=int, metavar="N", help=TARGETS["shift_by"]),
        click.option("--to-offset", type=int, metavar="N", help=TARGETS["to_offset"]),
        click.option("--topic", "topic_args", multiple=True, metavar="T[:P,...]",
                     help="Reset only this topic, or these partitions of it (repeatable; default: the "
                          "configured topics)."),
        click.option("--dry-run", is_flag=True, help="Show the new offsets, commit nothing (the default)."),
        click.option("--execute", is_flag=True, help="Commit the new offsets."),
    ]):
        command = decorator(command)
    return command


def _target(args: dict) -> Target:
    given = [k for k in TARGETS if given_option(args.get(k))]
    if len(given) != 1:
        names = ", ".join("--" + k.replace("_", "-") for k in TARGETS)
        raise ResetError(f"--reset-offsets needs exactly one of {names}"
                         + (f" (got {', '.join('--' + k.replace('_', '-') for k in given)})" if given else ""))
    kind = given[0]
    value = args[kind]
    if kind == "to_datetime":
        return Target(kind, parse_datetime(value))
    if kind == "to_offset" and value < 0:
        raise ResetError(f"--to-offset {value}: an offset is >= 0 (to go back from the commit, use --shift-by)")
    return Target(kind, None if value is True else value)


def _context(config, client_config, group, timeout_ms: int) -> Context:
    """What the refusal says besides the members (``Context``), asked only when refusing."""
    from ..client.errors import KafkaClientError
    from ..client.group.describe import SESSION_TIMEOUT_CONFIG, consumer_group_session_timeout_ms
    from ..protocol.errors import BrokerError
    from ..supervisor.control import ControlError, request_status
    from ..worker.main import daemon_id
    if group.protocol == "consumer":
        try:
            ms = consumer_group_session_timeout_ms(client_config, timeout_ms=timeout_ms)
        except (KafkaClientError, BrokerError):
            ms = None
        expiry = Expiry(ms, f"the group's {SESSION_TIMEOUT_CONFIG}"
                        + ("" if ms is not None else ", which the broker did not tell"))
    else:
        # A classic member's session is its own, sent in its JoinGroup: this configuration's.
        given = "session_timeout_ms" in config.kafka
        expiry = Expiry(client_config.session_timeout_ms,
                        f"[kafka] session_timeout_ms of {config.path}, which its workers joined with" if given else
                        f"the default session_timeout_ms, which {config.path} does not change")
    try:
        running = request_status(config.daemon.state_dir, timeout_s=2.0).pid
    except ControlError:
        running = None
    return Context(daemon_id(config), expiry, running)


def run_reset(config_path: str, timeout_ms: int, *, reset_offsets: bool = False, topic_args: tuple[str, ...] = (),
              dry_run: bool = False, execute: bool = False, **targets) -> None:
    import click

    from ..client import Consumer, ConsumerConfig, TopicPartition
    from ..client.group.describe import describe_group
    from .common import fail, kafka_errors, load_or_exit, usage_error
    if not reset_offsets:
        usage_error("--to-*, --shift-by, --topic, --dry-run and --execute go with --reset-offsets")
    if dry_run and execute:
        usage_error("--dry-run and --execute exclude each other")
    config = load_or_exit(config_path)
    if config.group_type == "share":
        usage_error(f"{config.path} names a share group: a share group keeps a start offset per partition, not "
                    "committed offsets, and --reset-offsets does not move it; use kafka-share-groups.sh "
                    "--reset-offsets (with the daemon stopped)")
    opts = config.consumer_options()
    group_id = opts.get("group_id")
    if not group_id:
        usage_error(f"[kafka] group_id is not set in {config.path}: there is no group to reset")
    opts["enable_auto_commit"] = False
    try:
        target = _target(targets)
        scope = parse_partitions(topic_args, list(config.daemon.topics))
    except ResetError as exc:
        usage_error(str(exc))
    with kafka_errors(config):
        client_config = ConsumerConfig.from_options(**opts)
        group = describe_group(client_config, timeout_ms=timeout_ms)
        if active(group):   # the context costs requests: only for a refusal
            try:
                refuse_if_active(group, _context(config, client_config, group, timeout_ms))
            except ResetError as exc:
                fail(str(exc))
        consumer = Consumer(**opts)
        try:
            parts = []
            for topic, numbers in scope:
                found = consumer.partitions_for(topic, timeout_ms=timeout_ms)
                if found is None:
                    usage_error(f"topic {topic} does not exist")
                absent = sorted(set(numbers or ()) - found)
                if absent:
                    usage_error(f"topic {topic} has no partition {', '.join(map(str, absent))} (it has "
                                f"{len(found)}: 0-{len(found) - 1})")
                parts += [TopicPartition(topic, p) for p in sorted(numbers if numbers is not None else found)]
            try:
                rows, warnings = plan(consumer, parts, target, timeout_ms=timeout_ms)
            except ResetError as exc:
                fail(str(exc))
            for w in warnings:
                click.echo(f"warning: {w}", err=True)
            if execute:
                consumer.commit({TopicPartition(r.topic, r.partition): r.new for r in rows}, timeout_ms=timeout_ms)
        finally:
            consumer.close()
    click.echo(f"{'group':<24} {'topic':<30} {'partition':>9} {'committed':>12} {'new':>12}")
    for r in rows:
        committed = "-" if r.committed is None else str(r.committed)
        click.echo(f"{group_id:<24} {r.topic:<30} {r.partition:>9} {committed:>12} {r.new:>12}")
    if execute:
        click.echo(f"committed the new offsets of {len(rows)} partition(s) for group {group_id}")
    else:
        click.echo("dry run: nothing committed; add --execute to commit these offsets")
