"""``kdaemon offsets``: where the daemon's group stands on its topics (kafka-consumer-groups
--describe for one group, from the daemon's own configuration): its state and members, and per
partition the committed offset, the end, the lag and who holds it."""

from __future__ import annotations

from dataclasses import dataclass

import click

from .common import config_option, fail, kafka_errors, load_or_exit


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


@click.command()
@config_option
@click.option("--timeout-ms", default=15000, show_default=True)
def offsets(config_path: str, timeout_ms: int) -> None:
    """Committed offset, end offset and lag per partition of the configured group and topics.

    A partition the group never committed is counted from where the group would start on it
    (``auto_offset_reset``), marked with "*"."""
    from ..client import Consumer, ConsumerConfig, TopicPartition
    from ..client.errors import KafkaClientError
    from ..client.group.describe import describe_group
    from ..protocol.errors import BrokerError
    config = load_or_exit(config_path)
    opts = config.consumer_options()
    opts["enable_auto_commit"] = False
    reset = opts.get("auto_offset_reset", "latest")
    with kafka_errors(config):
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
            rows = group_lag(consumer, parts, reset=reset, has_group=bool(opts.get("group_id")),
                             timeout_ms=timeout_ms)
        finally:
            consumer.close()
        group, undescribed = None, None
        if opts.get("group_id"):
            try:
                group = describe_group(ConsumerConfig.from_options(**opts), timeout_ms=timeout_ms)
            except (KafkaClientError, BrokerError) as exc:   # the offsets still stand on their own
                undescribed = f"group {opts['group_id']}: not described ({type(exc).__name__}: {exc})"
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
