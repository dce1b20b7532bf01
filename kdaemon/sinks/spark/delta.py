"""Exactly-once into a Delta Lake table (``format = "delta"``): Delta's idempotent writes.

Each topic partition is one idempotent application of the table, ``kdaemon:<topic>:<partition>``,
and a job appends each partition's new rows in its own commit, with the newest offset among
them as the transaction version (``txnAppId``/``txnVersion``).  Delta records the pair in the
same atomic commit as the rows and skips a later write of that application whose version is
not above the recorded one; so the recorded version of a partition is the newest offset of it
in the table, whoever wrote it — another uploader, another daemon sharing the table — and a
write repeated after a crash adds nothing.

The rest of the exactly-once bookkeeping is path mode's (``layout.py``): the partition locks,
the manifests that drop rows already uploaded, and a pending record written before the commit
— here naming the application and version it commits.  An uploader killed between a commit
and its manifest leaves the pending record; the next upload of that partition reads the
table's recorded version (``delta_log.transactions``): at or above the record's, the commit
happened and the manifest is written now; below it, it did not (a Delta commit is all or
nothing), and the record goes.

One table per (topic, consumer group): the application ids name the topic partition only.
"""

from __future__ import annotations

from .delta_log import transactions
from .jars import staged_jars


def app_id(topic: str, partition: int) -> str:
    return f"kdaemon:{topic}:{partition}"


def session_conf() -> dict[str, str]:
    """What a SparkSession needs to write Delta: the jars staged at install time (a running
    daemon never downloads), Delta's SQL extension and catalog."""
    return {"spark.jars": ",".join(staged_jars("delta")),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}


def pending_entry(topic: str, partition: int, version: int) -> dict:
    """What a pending record says of the commit it announces."""
    return {"app_id": app_id(topic, partition), "version": version}


def committed(table_path: str, entry: dict) -> bool:
    """Did the commit a pending record announced happen?"""
    return transactions(table_path).get(entry["app_id"], -1) >= int(entry["version"])
