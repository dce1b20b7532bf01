"""What a sink tells the daemon about itself: its context, and the companion processes it needs.

A *companion* is a long-lived process a sink's workers talk to — the Spark uploader holding the
one SparkSession of a daemon is the first.  The sink's plugin describes it with a
``CompanionSpec`` (hook ``kdaemon_sink_companions``); the supervisor (or ``kdaemon run
--in-process``) starts it before the workers, restarts it with backoff when it dies, restarts it
on a reload that changes its spec, and stops it after the last worker, because stopping workers
flush their final batches to it.  The supervisor knows nothing else about it.

``SinkContext`` is what the daemon tells a sink (and its companion factory) about the daemon:
where its state lives, who it is.  It is passed to the hooks instead of the whole
configuration, so sinks do not depend on the configuration's layout.

A leaf of the plugin layer: the standard library only.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SinkContext:
    """The daemon-wide facts a sink may need.

    :param state_dir: ``[daemon] state_dir`` as an absolute path: where sinks keep local state
        (staging, sockets); one per daemon.
    :param daemon_id: ``[daemon] daemon_id``, or the host name when it is empty: tells this
        daemon's files and processes from another daemon's on shared storage.
    :param heartbeat_timeout_s: ``[daemon] heartbeat_timeout_s``: a worker blocked longer than
        this (in a flush, say) is killed by the supervisor.
    :param log_level: ``[daemon] log_level`` ("DEBUG", "INFO", ...), for companion processes.
    :param memory_budget_bytes: how much a sink may hold of records in memory (its share of
        ``[daemon] memory_budget_mb``, kdaemon/worker/memory.py); 0: no budget.  A sink that
        buffers records keeps its default batch size under it.
    :param kafka: the consumer's ``[kafka]`` options (secrets resolved; ``ConsumerConfig``
        names), for a sink that writes to the cluster the daemon reads (the ``kafka`` DLQ):
        it connects as the consumer does, bootstrap, TLS and SASL included.  Never in a repr.
    :param on_sink_error: ``[daemon] on_sink_error`` ("stop", "retry", "dlq"), for a companion
        that meets records refused for what they are where no worker sees them (the Spark
        uploader, for rows a table refuses: "stop" stops there, the others dead-letter them).
    """

    state_dir: str
    daemon_id: str
    heartbeat_timeout_s: float
    log_level: str = "INFO"
    memory_budget_bytes: int = 0
    kafka: Mapping[str, Any] = field(default_factory=dict, repr=False)
    on_sink_error: str = "retry"
    group_type: str = "consumer"


@dataclass(frozen=True)
class CompanionSpec:
    """One companion process, as its sink's plugin describes it.

    Give exactly one of ``entry`` or ``argv``:

    * ``entry = "package.module:function"`` runs ``function(**kwargs)`` in a fresh Python
      interpreter (this one's ``sys.executable``; never a fork of the supervisor) with logging
      set up like the daemon's; its return value is the exit code.  ``kwargs`` must be JSON
      values; they travel in the environment, not the command line (settings may hold
      secrets, and any user can read a command line), and are removed from the environment
      before ``function`` runs.
    * ``argv = ("program", "arg", ...)`` runs any executable.

    Everything the process gets is in the spec: on a reload (SIGHUP) the supervisor restarts a
    companion exactly when its spec changed, and a waiting restart happens at once.

    :param name: unique among a daemon's companions; names it in the log ("companion <name>").
    :param env: added to the daemon's environment (systemd's NOTIFY_SOCKET and WATCHDOG_* are
        never passed on).
    :param stop_signal: sent to stop it; after ``stop_timeout_s`` (default: ``[daemon]
        shutdown_timeout_s``) it gets SIGKILL.
    :param restart_backoff_s: (initial, maximum) of the exponential delay before restarting a
        companion that exited while the daemon runs; the delay starts again from ``initial``
        once a run lasted a minute.  Workers must cope with the companion being away meanwhile.
    """

    name: str
    entry: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    argv: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    stop_signal: int = signal.SIGTERM
    stop_timeout_s: float | None = None
    restart_backoff_s: tuple[float, float] = (1.0, 30.0)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"a companion needs a name, got {self.name!r}")
        if (self.entry is None) == (self.argv is None):
            raise ValueError(f"companion {self.name!r}: give exactly one of entry or argv")
        if self.entry is not None:
            module, sep, function = self.entry.partition(":")
            if not module or not sep or not function:
                raise ValueError(f"companion {self.name!r}: entry must be 'module:function', not {self.entry!r}")
        if self.argv is not None and (not self.argv or not all(isinstance(a, str) for a in self.argv)):
            raise ValueError(f"companion {self.name!r}: argv must be a non-empty sequence of strings")
        initial, maximum = self.restart_backoff_s
        if not 0 < initial <= maximum:
            raise ValueError(f"companion {self.name!r}: restart_backoff_s must be (initial, maximum) with "
                             f"0 < initial <= maximum, not {self.restart_backoff_s!r}")
        try:
            json.dumps(dict(self.kwargs))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"companion {self.name!r}: kwargs must be JSON values: {exc}") from None
        if self.argv is not None:
            object.__setattr__(self, "argv", tuple(self.argv))
