"""The Spark sink's table engines: what a format's files and commits are, with no process of
their own.

``formats.py`` is the one interface the uploader and the resume answer use (recorded offsets,
pending commits); ``delta*.py`` and ``iceberg*.py`` are the two table formats; ``layout.py``
the path mode's naming, manifests and locks (the exactly-once rules); ``arrow_rows.py`` the rows
a direct write turns into files; ``ddl.py`` the declared schemas; ``jars.py`` the JVM jars a
format needs.  Nothing here imports the worker side or the uploader.
"""
