"""The Spark batch uploader sink: exactly-once delivery of records into Spark output.

Three rooms.  This package is the worker side: ``staging.py`` (the ``spark`` sink, which stages
batches locally as Parquet), ``staged.py`` (that file's format), ``uplink.py`` (the client of
the uploader's socket), ``wire.py`` (what the two say to each other) and ``resume.py`` (where a
partition's next owner starts).  ``uploader/`` is the one process per daemon that owns the
SparkSession and turns staged batches into output; ``tables/`` the engines (Delta, Iceberg, the
path layout), which import neither.  Output file names are a pure function of (topic,
partition, first offset, last offset); a manifest written after the files is an upload's commit
point; offsets are committed only after the uploader confirmed (``tables/layout.py``).
"""
