"""Spark: kdaemon beside Spark Structured Streaming's own Kafka source
(``python bench/spark/peer.py``; its processes in peer_procs.py, the Spark side in
peer_spark.py) and the Spark sink alone (``python bench/spark/sink.py``)."""
