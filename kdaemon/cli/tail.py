"""``kdaemon tail``: print a topic's records as the daemon would see them (``kcat -C``)."""

from __future__ import annotations

import dataclasses
import re
import time

import click

from .common import config_option, kafka_errors, load_or_exit, plugins_or_exit, setup_logging, usage_error
from .formats import as_json, as_template, check_template

OFFSET_FORMS = ("beginning, end, an offset (from the earliest to the end), -N (the last N records "
                "of each partition) or s@<timestamp ms> (the first record at or after it)")
_LAST_N = re.compile(r"-(\d+)$")
_AT_TIME = re.compile(r"s@(\d+)$")


def start_offsets(consumer, tps, start: str, timeout_ms: int | None = None) -> dict:
    """Where each partition is read from for ``-o start``; a usage error names what is wrong.

    An absolute offset is taken as given: the consumer runs with ``auto_offset_reset = "none"``,
    so one outside a partition's log fails its first fetch (``outside``) instead of being reset
    to the earliest or the end, printing something else than asked, or nothing.  (Checking it
    against ListOffsets first would refuse good offsets on brokers whose end offset lags, as
    Tansu's does.)"""
    if start in ("beginning", "end"):
        return (consumer.beginning_offsets if start == "beginning" else consumer.end_offsets)(tps, timeout_ms)
    if m := _AT_TIME.match(start):
        found = consumer.offsets_for_times({tp: int(m.group(1)) for tp in tps}, timeout_ms)
        ends = consumer.end_offsets(tps, timeout_ms)
        return {tp: found[tp].offset if found.get(tp) is not None else ends[tp] for tp in tps}
    if m := _LAST_N.match(start):
        n = int(m.group(1))
        firsts, ends = consumer.beginning_offsets(tps, timeout_ms), consumer.end_offsets(tps, timeout_ms)
        return {tp: max(firsts[tp], ends[tp] - n) for tp in tps}
    if not start.isdigit():
        usage_error(f"-o {start!r} is not an offset; use {OFFSET_FORMS}")
    return {tp: int(start) for tp in tps}


def outside(consumer, exc, timeout_ms: int | None = None) -> str:
    """The one line for an absolute offset a partition does not hold (``OffsetOutOfRangeError``)."""
    tps = sorted(exc.offsets)
    firsts, ends = consumer.beginning_offsets(tps, timeout_ms), consumer.end_offsets(tps, timeout_ms)
    held = [f"{tp.topic}-{tp.partition} holds {firsts[tp]}..{ends[tp] - 1}" if ends[tp] > firsts[tp]
            else f"{tp.topic}-{tp.partition} is empty (next offset {ends[tp]})" for tp in tps]
    offsets = sorted(set(exc.offsets.values()))
    return (f"offset {', '.join(map(str, offsets))} is outside {'; '.join(held)}; pick partitions with -p, or use "
            f"{OFFSET_FORMS}")


def _ranges(ids) -> str:
    """0,1,2,3,7 → "0-3, 7"."""
    out, ids = [], sorted(ids)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(out)


@click.command()
@click.argument("topic")
@config_option
@click.option("--partition", "-p", type=int, multiple=True, help="Only these partitions (default: all).")
@click.option("--offset", "-o", "start", default="end", show_default=True, help=OFFSET_FORMS.capitalize() + ".")
@click.option("--count", "-n", type=click.IntRange(min=1), default=None, help="Stop after this many records.")
@click.option("--timeout-ms", type=click.IntRange(min=1), default=15000, show_default=True,
              help="How long to wait for the brokers' answers (metadata, offsets) before giving up.")
@click.option("--idle-ms", type=click.IntRange(min=0), default=2000, show_default=True,
              help="Stop after this long without records (0: never).")
@click.option("--raw", is_flag=True, help="The records as the broker has them: no filters, no deserializers, "
                                         "no interceptors.")
@click.option("--format", "-f", "template", default="json", show_default=True,
              help="json (the sink's line format, header values as text when UTF-8), or a kcat-like template: "
                   "%t topic, %p partition, %o offset, %k key, %s value, %T timestamp, %h headers, %K/%S key/value "
                   "length, \\n, \\t.")
def tail(topic: str, config_path: str, partition: tuple[int, ...], start: str, count: int | None,
         timeout_ms: int, idle_ms: int, raw: bool, template: str) -> None:
    """Print records of TOPIC as JSON lines, through the configured filters and deserializers
    (like ``kcat -C``).  Never joins the group or commits.

    The records go through the daemon's own stages (config, ``build_pipeline_parts``, the
    consumer options and ``Pipeline``): tail only prints, so what it shows is what the daemon
    would hand to its sink.  ``--raw`` skips them."""
    from ..client import Consumer, OffsetOutOfRangeError, TopicPartition
    from ..plugins.types import Record
    from ..worker.build import build_pipeline_parts
    from ..worker.main import consumer_options
    from ..worker.pipeline import Pipeline, StageObserver
    if template != "json" and (wrong := check_template(template)):
        usage_error(wrong)
    config = load_or_exit(config_path)
    setup_logging("WARNING")
    if raw:
        config = dataclasses.replace(config, filters=(), interceptors=(),
                                     deserializer=dataclasses.replace(config.deserializer, key="bytes", value="bytes"))
    manager = plugins_or_exit(config)
    parts = build_pipeline_parts(config, manager, dry_run=True)
    opts = consumer_options(config, parts)
    opts.pop("group_id", None)
    opts.pop("group_instance_id", None)
    opts["auto_offset_reset"] = "none"   # every position is set by -o; see start_offsets

    class Report(StageObserver):
        def deserialize_failed(self, record, exc):
            # The position and why, never the payload.
            reason = str(exc).splitlines()[0][:200] if str(exc) else ""
            click.echo(f"# {record.topic}-{record.partition}@{record.offset}: could not deserialize "
                       f"({type(exc).__name__}{': ' + reason if reason else ''})", err=True)

    # Whatever the daemon's policy, tail reports a record that fails to deserialize and goes
    # on ("stop" would end it on exactly the record one wants to look at); "dlq" only hands
    # the dead letter back, which tail drops once reported.
    pipeline = Pipeline(dataclasses.replace(
        config, daemon=dataclasses.replace(config.daemon, on_deserialize_error="dlq")), parts,
        observer=Report())
    printed = 0
    with kafka_errors(config):
        consumer = Consumer(**opts)
        try:
            found = consumer.partitions_for(topic, timeout_ms=timeout_ms)
            if found is None:
                usage_error(f"topic {topic} does not exist at {opts.get('bootstrap_servers')}")
            unknown = sorted(set(partition) - found)
            if unknown:
                usage_error(f"topic {topic} has no partition {_ranges(unknown)} (it has {_ranges(found)})")
            tps = [TopicPartition(topic, p) for p in sorted(found) if not partition or p in partition]
            consumer.assign(tps)
            for tp, offset in start_offsets(consumer, tps, start, timeout_ms).items():
                consumer.seek(tp, offset)
            last = time.monotonic()
            while count is None or printed < count:
                try:
                    polled = consumer.poll(200)
                except OffsetOutOfRangeError as exc:
                    usage_error(outside(consumer, exc, timeout_ms))
                fetched = [r for rs in polled.values() for r in rs]
                if fetched:
                    last = time.monotonic()
                records, _ = pipeline.deserialize(fetched)
                for r in pipeline.intercept(records):
                    if raw:
                        r = Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type, r.raw_key,
                                   r.raw_value, r.headers, r.raw_key, r.raw_value)
                    click.echo(as_json(r) if template == "json" else as_template(r, template),
                               nl=template == "json")
                    printed += 1
                    if count is not None and printed >= count:
                        break
                if idle_ms and (time.monotonic() - last) * 1000 >= idle_ms:
                    break
        finally:
            consumer.close()
