"""``kdaemon offsets``: where the daemon's group stands on its topics (kafka-consumer-groups
--describe for one group, from the daemon's own configuration): its state and members, and per
partition the committed offset, the end, the lag and who holds it.

For a share group (``[kafka] group_type = "share"``, or a group id that names a share group and
no consumer group) what kafka-share-groups --describe and --describe --members show instead: the
members (id, host, client id, assignment: members share partitions) and per partition the start
offset, the end and the lag (records not yet settled, acquired ones included; KIP-1226).  Kafka
4.4 answers no per-partition count of acquired records (client/share/describe.py)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from .common import config_option, fail, kafka_errors, load_or_exit, usage_error
from .reset import given_option, reset_options, run_reset


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None   # None: the group never committed this partition
    start: int | None       # where the group would start without a commit (auto_offset_reset)
    end: int | None

    @property
    def lag(self) -> int | None:
        """Records the group has yet to consume: from its commit, or, without one, from where
        auto_offset_reset would start it (None if that is "none" and there is no commit)."""
        base = self.committed if self.committed is not None else self.start
        if base is None or self.end is None:
            return None
        return max(0, self.end - base)


def group_lag(consumer, parts, *, reset: str, has_group: bool, timeout_ms: int) -> list[PartitionLag]:
    ends = consumer.end_offsets(parts, timeout_ms=timeout_ms)
    committed = consumer.committed(parts, timeout_ms=timeout_ms) if has_group else {}
    uncommitted = [tp for tp in parts if committed.get(tp) is None]
    if reset == "earliest" and uncommitted:
        starts = consumer.beginning_offsets(uncommitted, timeout_ms=timeout_ms)
    elif reset == "latest":
        starts = {tp: ends.get(tp) for tp in uncommitted}
    else:
        starts = {}
    out = []
    for tp in parts:
        om = committed.get(tp)
        out.append(PartitionLag(tp.topic, tp.partition, om.offset if om is not None else None,
                                starts.get(tp), ends.get(tp)))
    return out


def _cell(v) -> str:
    return "-" if v is None else str(v)


def _consumer_and_partitions(config, opts: dict, timeout_ms: int):
    """A consumer for ``opts`` (the caller closes it), the configured topics' partitions and the
    topics that do not exist; one line and exit 1 when none exists."""
    from ..client import Consumer, TopicPartition
    consumer = Consumer(**opts)
    try:
        parts, missing = [], []
        for topic in config.daemon.topics:
            found = consumer.partitions_for(topic, timeout_ms=timeout_ms)
            if found is None:
                missing.append(topic)
                continue
            parts += [TopicPartition(topic, p) for p in sorted(found)]
        if not parts:
            fail(f"none of the configured topics exists ({', '.join(missing)}); check [daemon] topics "
                 f"in {config.path}")
    except BaseException:
        consumer.close()
        raise
    return consumer, parts, missing


def _watch_options_given() -> bool:
    """--interval, --window or --count on the command line (they go with --watch only)."""
    ctx = click.get_current_context()
    return any(ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
               for name in ("interval", "window", "count"))


WATCH_CLOSE_MS = 2000


def _watch(config, opts: dict, reset: str, timeout_ms: int, *, watch: bool, interval: float, window: int,
           count: int | None) -> None:
    """``offsets --watch``: a poll every ``interval`` judged by ``watch.GroupWatch``, until ``count``
    rounds (exit 0 if the group is OK then, else 1) or Ctrl-C (exit 0).  On a terminal each
    round redraws one table (``watch.watch_table``); elsewhere each round prints the partitions
    whose status changed and the group's line, which scripts and logs read."""
    import sys
    import time
    from contextlib import nullcontext
    from datetime import datetime

    from ..exit_codes import EXIT_FAILURE, EXIT_OK
    from .progress import LiveTable, console, live
    from .watch import GroupWatch, Status, watch_table
    if not watch:
        usage_error("--interval, --window and --count go with --watch")
    group = opts.get("group_id")
    if not group:
        usage_error(f"[kafka] group_id is not set in {config.path}: there is no group to watch")
    judge, status, rounds = GroupWatch(window), Status.UNKNOWN, 0
    stop = _ctrl_c_stops()
    try:
        with kafka_errors(config):
            consumer, parts, missing = _consumer_and_partitions(config, opts, timeout_ms)
            try:
                for topic in missing:
                    click.echo(f"{topic}: does not exist", err=True)
                out = console()
                table = LiveTable(out) if live(out, False) else None
                due = time.monotonic()
                with table if table is not None else nullcontext():
                    while count is None or rounds < count:
                        if stop.wait(max(0.0, due - time.monotonic())):
                            break
                        # A slow round delays the next one instead of bunching rounds to catch up.
                        due = max(due + interval, time.monotonic())
                        rows = group_lag(consumer, parts, reset=reset, has_group=True, timeout_ms=timeout_ms)
                        seen = judge.observe(time.monotonic(), rows)
                        stamp = datetime.now().isoformat(sep=" ", timespec="seconds")
                        status, rounds = seen.status, rounds + 1
                        if table is not None:
                            table.show(watch_table(group, stamp, rows, seen))
                            continue
                        for row, p in zip(rows, seen.partitions):
                            if p.changed:
                                click.echo(f"{stamp} {row.topic}[{row.partition}]: {p.verdict.status.value} "
                                           f"(committed {_cell(row.committed)}, end {_cell(row.end)}, lag "
                                           f"{_cell(row.lag)}): {p.verdict.reason}")
                        click.echo(f"{stamp} group {group}: {seen.status.value} ({seen.summary()})")
            finally:
                # The watch only reads (it joins no group and commits nothing), so its close has
                # nothing to wait for: bounded, so that a Ctrl-C in the middle of a round's
                # requests does not wait out the default API timeout on a slow broker.
                consumer.close(timeout_ms=WATCH_CLOSE_MS)
    except KeyboardInterrupt:   # a second Ctrl-C, during a round: still how a watch ends
        sys.exit(EXIT_OK)
    if stop.is_set():   # Ctrl-C is how a watch without --count ends: not a failure
        sys.exit(EXIT_OK)
    sys.exit(EXIT_OK if status is Status.OK else EXIT_FAILURE)


def _ctrl_c_stops():
    """An event the first Ctrl-C (SIGINT) sets; a second one raises ``KeyboardInterrupt``.

    The watch ends between rounds rather than by ``KeyboardInterrupt`` raised wherever the
    signal lands: raised inside the client it could leave a lock taken mid-request, and the
    consumer's close then waited on it for good (a watch under load ignored Ctrl-C)."""
    import signal
    import threading

    stop = threading.Event()

    def on_sigint(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
    signal.signal(signal.SIGINT, on_sigint)
    return stop


@click.command()
@config_option
@click.option("--timeout-ms", default=15000, show_default=True)
@click.option("--watch", is_flag=True,
              help="Poll every --interval and judge each partition's lag over time as Burrow does (OK, LAGGING, "
                   "STALLED, STOPPED, REWIND; see kdaemon/cli/watch.py): print each partition whose status "
                   "changed, then the group's status (its worst partition's), every round.")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              metavar="SECONDS", help="--watch: time between polls.")
@click.option("--window", type=click.IntRange(min=2), default=10, show_default=True, metavar="N",
              help="--watch: the polls, and the commits, each partition is judged over (Burrow's 10).")
@click.option("--count", type=click.IntRange(min=1), default=None, metavar="K",
              help="--watch: stop after K rounds; exit 0 if the group is OK then, 1 if it is not (LAGGING, "
                   "STALLED, STOPPED, REWIND, UNKNOWN: its last line says which) or Kafka failed (one line "
                   "on stderr).  Without it: until Ctrl-C, exit 0.")
@reset_options
def offsets(config_path: str, timeout_ms: int, watch: bool, interval: float, window: int,
            count: int | None, **reset_args) -> None:
    """Committed offset, end offset and lag per partition of the configured group and topics.

    A partition the group never committed is counted from where the group would start on it
    (``auto_offset_reset``), marked with "*".

    With --reset-offsets and one target, moves the group's offsets as kafka-consumer-groups
    --reset-offsets does: a dry run unless --execute is given, refused while the group has
    members."""
    if any(map(given_option, reset_args.values())):
        if watch:
            usage_error("--watch and --reset-offsets exclude each other")
        run_reset(config_path, timeout_ms, **reset_args)
        return
    from ..client import ConsumerConfig, TopicPartition
    from ..client.errors import KafkaClientError
    from ..client.group.describe import describe_group
    from ..protocol.errors import BrokerError
    config = load_or_exit(config_path)
    opts = config.consumer_options()
    opts["enable_auto_commit"] = False
    reset = opts.get("auto_offset_reset", "latest")
    share_mode = config.group_type == "share"
    if (watch or _watch_options_given()) and share_mode:
        usage_error(f"{config.path} names a share group: --watch judges committed offsets, which a share group "
                    "has none of; run kdaemon offsets (its lag per partition) or kdaemon status instead")
    if watch or _watch_options_given():
        _watch(config, opts, reset, timeout_ms, watch=watch, interval=interval, window=window, count=count)
        return
    if share_mode:   # the share consumer's own options: the look-ups here are a plain consumer's
        for key in ("share_acknowledgement_mode", "share_acquire_mode"):
            opts.pop(key, None)
    with kafka_errors(config):
        consumer, parts, missing = _consumer_and_partitions(config, opts, timeout_ms)
        try:
            rows = group_lag(consumer, parts, reset=reset, has_group=bool(opts.get("group_id")) and not share_mode,
                             timeout_ms=timeout_ms)
        finally:
            consumer.close()
        group, undescribed = None, None
        if opts.get("group_id") and not share_mode:
            try:
                group = describe_group(ConsumerConfig.from_options(**opts), timeout_ms=timeout_ms)
            except (KafkaClientError, BrokerError) as exc:   # the offsets still stand on their own
                undescribed = f"group {opts['group_id']}: not described ({type(exc).__name__}: {exc})"
        if opts.get("group_id") and (share_mode or undescribed is not None or group.state == "Dead"):
            # No consumer group of that name: a share group's, if it is one.
            from ..client.share.describe import describe_share_group, share_group_offsets
            client = ConsumerConfig.from_options(**opts)
            try:
                share = describe_share_group(client, timeout_ms=timeout_ms)
            except (KafkaClientError, BrokerError):
                if share_mode:
                    raise
                share = None   # the consumer group's view stands on its own
            if share_mode or share is not None:
                starts = share_group_offsets(client, parts, timeout_ms=timeout_ms)
                for topic in missing:
                    click.echo(f"{topic}: does not exist", err=True)
                _print_share_group(opts["group_id"], share, rows, starts)
                return
    for topic in missing:
        click.echo(f"{topic}: does not exist", err=True)
    if undescribed is not None:
        click.echo(undescribed)
    elif group is not None and group.state == "Dead":
        click.echo(f"group {group.group_id}: no group of that name now")
    elif group is not None:
        kind = f"{group.protocol_type} group" if group.protocol_type else "group"
        protocol = "consumer protocol, KIP-848" if group.protocol == "consumer" else "classic protocol"
        click.echo(f"{kind} ({protocol}) {group.group_id}: {group.state}, {len(group.members)} member(s)"
                   + (f", assignor {group.assignor}" if group.assignor else ""))
    click.echo(f"{'topic':<30} {'partition':>9} {'committed':>12} {'end':>12} {'lag':>10}  {'consumer':<36} "
               f"{'host':<15} client")
    for r in rows:
        lag = _cell(r.lag) + ("*" if r.committed is None and r.lag is not None else "")
        owner = group.owner_of(TopicPartition(r.topic, r.partition)) if group is not None else None
        who = (f"{owner.instance_id or owner.member_id:<36} {owner.host:<15} {owner.client_id}" if owner
               else f"{'-':<36} {'-':<15} -")
        click.echo(f"{r.topic:<30} {r.partition:>9} {_cell(r.committed):>12} {_cell(r.end):>12} {lag:>10}  {who}")
    uncommitted = [r for r in rows if r.committed is None]
    total = sum(r.lag or 0 for r in rows)
    unknown = [r for r in rows if r.lag is None]
    line = f"total lag: {total}"
    if uncommitted and reset in ("earliest", "latest"):
        line += (f" (* {len(uncommitted)} partition(s) without a commit, counted from the {reset} offset: "
                 f"auto_offset_reset = \"{reset}\")")
    if unknown:
        line += (f"; unknown for {len(unknown)} partition(s) without a commit (auto_offset_reset = \"none\": "
                 "the daemon would stop on them)" if reset == "none" else
                 f"; unknown for {len(unknown)} partition(s) without an end offset")
    click.echo(line)


def _assignment(partitions) -> str:
    """t:0,1;u:2, as kafka-share-groups --members writes a member's ASSIGNMENT."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ";".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items())) or "-"


def _print_share_group(group_id: str, share, rows: list[PartitionLag], starts) -> None:
    """A share group's members, then per partition its start offset, the end and the lag."""
    from ..client import TopicPartition
    if share is None:
        click.echo(f"share group {group_id}: no group of that name now (it is created when its first member joins)")
    else:
        click.echo(f"share group {share.group_id}: {share.state}, {len(share.members)} member(s), assignor "
                   f"{share.assignor}")
        if share.members:
            click.echo(f"{'member':<24} {'host':<15} {'client':<30} {'#partitions':>11}  assignment")
            for m in share.members:
                click.echo(f"{m.member_id:<24} {m.host:<15} {m.client_id:<30} {len(m.partitions):>11}  "
                           f"{_assignment(m.partitions)}")
    click.echo(f"{'topic':<30} {'partition':>9} {'start':>12} {'end':>12} {'lag':>10}")
    total, unstarted = 0, 0
    for r in rows:
        found = starts.get(TopicPartition(r.topic, r.partition))
        start, lag = (found.start_offset, found.lag) if found is not None else (None, None)
        total += lag or 0
        unstarted += start is None
        click.echo(f"{r.topic:<30} {r.partition:>9} {_cell(start):>12} {_cell(r.end):>12} {_cell(lag):>10}")
    line = f"total lag: {total} (records not yet settled, acquired ones included)"
    if unstarted:
        line += (f"; unknown for {unstarted} partition(s) the group has not started reading (its "
                 "share.auto.offset.reset decides where it will)")
    click.echo(line)
