"""The spark sink's settings: the ``[sink]`` table of ``type = "spark"`` as one frozen dataclass.

Parsed and checked once (``kdaemon.settings.parse_settings``): by ``check-config`` and a
worker's build (``sinks/builtin.py``), by each worker's ``SparkSink``, and by the uploader,
which gets them over the companion's wire as ``to_wire()`` made them (the table with every
default filled in) and parses that again, so both sides read the same values from one place.
Every default is written here, once; the checks between settings (a format's jars and path,
``merge_schema`` against Parquet, ``value_format`` against ``value_schema``, a share group
refused) are ``_problems``, run by ``parse``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ...settings import SettingsError, parse_settings, setting, settings_table
from .tables import formats, iceberg
from .tables.jars import JarsMissing, staged_jars

VALUE_FORMATS = ("binary", "string", "json")
FORMATS = ("parquet", *formats.FORMATS)   # path mode's own Parquet layout, or a table (tables/formats.py)
PARTITION_COLUMNS = ("topic", "partition", "date", "timestamp_type")
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
GROUP_TYPES = ("consumer", "share")
# Settings taken out, and what to do instead.
RETIRED = {
    # Spark's default catalog is in memory: the table it names was gone at every uploader
    # restart, and its appends were at-least-once.
    "table": "no longer supported (a table in Spark's in-memory catalog was lost at every uploader restart): "
             "write a Delta table with format = \"delta\" and path = its location, and register that location "
             "in your catalog (CREATE TABLE ... USING DELTA LOCATION ...)",
}
SHARE_GROUP_REFUSED = (
    "the spark sink cannot consume from a share group ([kafka] group_type = \"share\"): its exactly-once "
    "rests on each partition having one owner whose offsets rise (the uploader keeps a batch's offset range "
    "per partition and commits a table version with it, docs/SPARK.md), while a share group hands one "
    "partition's records to many workers out of order and again after a lock expiry or a crash; "
    "consume with a consumer group ([kafka] group_type = \"consumer\", the default), which also scales "
    "workers up to the partition count, or write JSON lines (type = \"jsonl\") from the share group")


@dataclass(frozen=True)
class SparkSettings:
    """``[sink]`` with ``type = "spark"`` (docs/SPARK.md describes each setting)."""

    path: str = setting(pattern=r"(?s).+", expected="a directory path",
                        needs="the Parquet output directory, or the table's location with format = \"delta\" "
                              "or \"iceberg\"")
    format: str = setting("parquet", choices=FORMATS)
    master: str = "local[*]"
    conf: dict[str, str | int | float | bool] = setting(default_factory=dict, expected="a table of Spark settings")
    # None: "json" when value_schema is given, else "binary" (set by __post_init__).
    value_format: str | None = setting(None, choices=VALUE_FORMATS)
    value_schema: str | None = setting(None, expected="a Spark DDL string (such as \"id BIGINT, type STRING\")")
    partition_by: tuple[str, ...] = setting(("topic", "date"), choices=PARTITION_COLUMNS)
    max_records: int = setting(100_000, min=1)
    # None: DEFAULT_MAX_BYTES, or less under the worker's memory budget (``batch_bytes``).
    max_bytes: int | None = setting(None, min=1)
    max_age_s: float = setting(10.0, above=0)
    # None: off.  A batch no record has joined for this long is flushed before max_age_s (Flink's
    # file sink rolls on an inactivity interval the same way): a backlog's tail is delivered as
    # soon as the topic goes quiet, while a steady stream still gathers max_records.
    max_idle_s: float | None = setting(None, above=0)
    upload_timeout_s: float = setting(300.0, above=0)
    merge_schema: bool = False
    direct_writes: bool = True
    socket: str | None = None      # default: spark-uploader.sock in the state directory (wire.py)
    state_dir: str | None = None   # default: the daemon's

    def __post_init__(self) -> None:
        if self.value_format is None:
            object.__setattr__(self, "value_format", "json" if self.value_schema else "binary")

    @classmethod
    def parse(cls, table: Mapping, *, group_type: str = "consumer") -> SparkSettings:
        """The ``[sink]`` table checked whole; ``SettingsError`` naming every problem.
        ``group_type`` (``SinkContext.group_type``): a share group is refused, whatever the
        settings (``SHARE_GROUP_REFUSED`` says why)."""
        _check_group_type(group_type)
        return parse_settings(cls, table, "sink", retired=RETIRED, check=lambda s: _problems(s, group_type))

    @classmethod
    def of(cls, settings: SparkSettings | Mapping, *, group_type: str = "consumer") -> SparkSettings:
        """``settings`` as SparkSettings: a table parsed (``parse``), parsed settings as they
        are, the share group refused either way."""
        if not isinstance(settings, SparkSettings):
            return cls.parse(settings, group_type=group_type)
        _check_group_type(group_type)
        if group_type == "share":
            raise SettingsError("sink", [("type", SHARE_GROUP_REFUSED)])
        return settings

    def to_wire(self) -> dict:
        """The table ``parse`` reads back to these settings (JSON values): what the uploader
        companion gets (``sinks/builtin.py``, ``uploader/process.py run``)."""
        return settings_table(self)

    def batch_bytes(self, memory_bytes: int = 0) -> int:
        """How many bytes of buffers a worker stages a batch at: ``max_bytes`` if set, else
        ``DEFAULT_MAX_BYTES``, under half the sink's share of the worker's memory budget
        (``memory_bytes``, SinkContext; 0: no budget).  The buffers hold Python objects: about
        twice the bytes a buffer counts."""
        if self.max_bytes is not None:
            return self.max_bytes
        return DEFAULT_MAX_BYTES if not memory_bytes else min(DEFAULT_MAX_BYTES, memory_bytes // 2)

    @property
    def table_format(self) -> bool:
        """True for a Delta or Iceberg table (``tables/formats.py``), False for path mode."""
        return self.format in formats.FORMATS


def _check_group_type(group_type: str) -> None:
    if group_type not in GROUP_TYPES:   # the caller's mistake, not the operator's
        raise ValueError(f"group_type must be \"consumer\" or \"share\", not {group_type!r}")


def _problems(s: SparkSettings, group_type: str) -> Iterator[tuple[str, str]]:
    """The checks between settings, and against the daemon (its group type) and this machine
    (the staged jars of a table format)."""
    if group_type == "share":
        yield "type", SHARE_GROUP_REFUSED
    if s.table_format:
        try:
            staged_jars(s.format)
        except JarsMissing as exc:
            yield "format", str(exc)
        if s.format == "iceberg" and (problem := iceberg.check_path(s.path)) is not None:
            yield "path", problem
    if s.merge_schema and not s.table_format:
        yield "merge_schema", ("applies to format = \"delta\" or \"iceberg\" (Parquet files each keep their own "
                               "schema: read them with Spark's mergeSchema option)")
    if s.value_format == "json" and not s.value_schema:
        yield "value_format", ("\"json\" needs value_schema (a Spark DDL string such as "
                               "\"id BIGINT, type STRING\")")
    elif s.value_schema and s.value_format != "json":
        yield "value_schema", f"only used with value_format = \"json\", not {s.value_format!r}"
