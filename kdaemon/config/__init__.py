"""The daemon's configuration: one TOML file, loaded into typed dataclasses, validated at once.

Validation collects *every* problem and reports each as ``file: section.key: problem`` so an
operator fixes a file in one pass (the CLI exits 2).  A value of the wrong TOML type is always
``file: section.key: expected <type>, found <type> <value>`` (``daemon.topics[1]`` for a list
element), from one description of each key's type (``kdaemon.settings``, the checker every sink
and plugin uses too).  ``KDAEMON_<SECTION>_<KEY>``
environment variables set values over the file (``env``) and get the same checks; their
problems start ``environment <VARIABLE>:`` instead of ``file:``.

The package, by responsibility:

* ``model``: the dataclasses (their annotations are the type schema) and ``ConfigError``;
* ``schema``: the file's own kinds (its sections, arrays of tables, the consumer's list options),
  on top of ``kdaemon.settings`` (``Kind`` derived from those annotations, and the wording);
* ``kafka``: the ``[kafka]`` section, typed from ``ConsumerConfig`` and checked by it (by
  ``ShareConsumerConfig`` with ``group_type = "share"``, which refuses consumer-group options);
* ``loader``: ``load``/``parse``, the other sections (``[share]``: a share group's configs;
  ``[otel]``: the otel plugin's exporter), the default DLQ;
* ``env``: ``KDAEMON_<SECTION>_<KEY>`` overrides from the environment, set over the file by
  ``load`` before validation, and the effective configuration ``check-config --show`` prints;
* ``toml_out``: ``dump_toml``, for the files kdaemon writes itself.

Its place in the layers: above ``kdaemon.protocol`` and ``kdaemon.client`` (it checks consumer
options with ``ConsumerConfig`` and header rules with ``header_match``) and above the plugins and
sinks, below the worker, the supervisor and the CLI, which read it.  It names plugins, filters and
sinks by string and never imports them; plugins and sinks never import it either (a factory gets
its own ``settings`` table).  What only the loaded plugins can check about a configuration is the
worker's business: ``kdaemon.worker.build.check_against_plugins``.
"""

from .env import Override, effective_toml
from .kafka import DAEMON_OWNED, KAFKA_KINDS, SECRETS
from .loader import ENV_LAYOUT, default_dlq, load, load_for_check, parse
from .model import (DEFAULT_DLQ_DIR, DEFAULT_PLUGINS, ERROR_POLICIES_DESERIALIZE, ERROR_POLICIES_SINK,
                    GROUP_PROTOCOLS, GROUP_TYPES, ON_STOP, ConfigError, DaemonConfig, DaemonSection,
                    DeserializerConfig, FilterConfig, InterceptorConfig, OtelSection, ShareSection, SinkConfig)
from .toml_out import dump_toml

__all__ = ["DAEMON_OWNED", "DEFAULT_DLQ_DIR", "DEFAULT_PLUGINS", "ENV_LAYOUT", "ERROR_POLICIES_DESERIALIZE",
           "ERROR_POLICIES_SINK", "GROUP_PROTOCOLS", "GROUP_TYPES", "KAFKA_KINDS", "ON_STOP", "SECRETS", "ConfigError",
           "DaemonConfig", "DaemonSection", "DeserializerConfig", "FilterConfig", "InterceptorConfig",
           "OtelSection", "Override", "ShareSection", "SinkConfig", "default_dlq", "dump_toml", "effective_toml", "load", "load_for_check",
           "parse"]
