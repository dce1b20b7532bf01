"""The Spark batch uploader sink: exactly-once delivery of records into Spark output.

Workers stage batches locally as Parquet (``staging.py``, the ``spark`` sink); one uploader
process per daemon (``uploader.py``) owns the SparkSession and turns staged batches into output
files whose names are a pure function of (topic, partition, first offset, last offset).  A
manifest written after the files is the upload's commit point; offsets are committed only after
the uploader confirmed.  ``layout.py`` has the naming and the invariants.
"""
