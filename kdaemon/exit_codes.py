"""The exit codes of ``kdaemon`` and of its worker processes: one definition for every caller.

A worker process returns one of these to its supervisor, and the supervisor (``kdaemon run``)
returns one to whoever started it (systemd, an operator's shell).  Both sides import them from
here, so a worker's "stopped on an error policy" is the code the supervisor recognises, and the
code the operator sees means the same thing it meant in the worker.

A leaf module: it imports nothing from kdaemon, so every layer may use it.
"""

from __future__ import annotations

EXIT_OK = 0
"""A clean stop: the workers flushed, committed and left their group."""

EXIT_FAILURE = 1
"""Something failed that a restart may cure: a worker crashed (the supervisor restarts it with
backoff), or the supervisor itself failed, or a worker had to be killed because it did not stop
within ``shutdown_timeout_s`` (what it had not committed is delivered again)."""

EXIT_CONFIG = 2
"""The configuration (or the command line) cannot be used; every problem was listed."""

EXIT_STOPPED_ON_ERROR = 3
"""A worker stopped on an error policy (``on_deserialize_error`` or ``on_sink_error`` = "stop",
or records to dead-letter and no ``[dlq]``): it committed what came before the failing record
and exited.  (A plugin's interceptor that raises never stops a worker: it is logged and skipped.)
The supervisor does not restart it (it would stop at the same record again); it stops every
worker gracefully and exits with this code, so an operator fixes the record or the policy."""

EXIT_BOOT_FAILURE = 4
"""A worker cannot boot (a plugin or sink cannot be built, a refused login), or workers died
repeatedly before ever getting their assignment.  The supervisor stops instead of restarting
them in a loop."""

EXIT_FENCED = 5
"""Kafka fenced a worker (FENCED_INSTANCE_ID): another consumer joined the group with the
worker's static member id (``group.instance.id``, ``<daemon_id>-<index>``), most often a second
daemon with the same ``[daemon] daemon_id`` (default: the host name) and group.  Restarting it
would fence the other one in turn, for ever, so the supervisor stops the daemon instead."""

EXIT_SINK_REFUSED = 6
"""The sink or the dead-letter queue refused for good (``kdaemon.plugins.types.SinkRefused``):
its Kafka topic does not exist (found before anything is consumed, or when it went away), the
producer is not authorized, a table's schema does not take the rows, a Spark job fails the same
way every time (an analysis error) or the JVM does not match its jars, or the Spark uploader
refuses to start with a Spark its staged jars are not built for.  Retrying cannot help,
so the worker commits nothing past the records it could not deliver and stops, saying in one
line which topic or table refused and what to change; the supervisor stops every worker
gracefully and exits with this code.  Fix the target (create the topic, grant the ACL, alter
the table) and start the daemon again: it reads on from the last commit."""

# Codes a restart does not cure (systemd's RestartPreventExitStatus= lists them).
PERMANENT = frozenset({EXIT_CONFIG, EXIT_STOPPED_ON_ERROR, EXIT_BOOT_FAILURE, EXIT_FENCED, EXIT_SINK_REFUSED})
