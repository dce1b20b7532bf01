"""The configuration file's own kinds, on top of the one settings checker (``kdaemon.settings``).

What a key takes comes from the annotation of the dataclass field it fills (``DaemonSection``,
``FilterConfig``, ``ConsumerConfig`` ...) through ``kdaemon.settings.kinds_of``, so the type a key
is parsed into and the type its error message asks for cannot drift apart; every type problem
reads as a sink's or a plugin's does, ``section.key: expected <kind>, found <TOML type>
<value>``.  Here only what the file's layout adds: its sections, its arrays of tables, and the
consumer's list options, which take a comma-separated string too.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..settings import STRING, Kind


def string_or_list(expected: str) -> Kind:
    """A comma-separated string or a list of strings (what the consumer takes for its list
    options, e.g. ``bootstrap_servers``)."""
    return Kind(expected, lambda v: isinstance(v, (str, list)), STRING)


def section_kind(name: str) -> Kind:
    """A top-level table, named as the file writes it: ``a table ([daemon])``."""
    return Kind(f"a table ([{name}])", lambda v: isinstance(v, Mapping))


def table_array_kind(name: str) -> Kind:
    """An array of tables: ``[[filters]]``.  Its elements are checked by the section, so that
    one bad entry does not hide the others."""
    return Kind(f"an array of tables ([[{name}]])", lambda v: isinstance(v, list))
