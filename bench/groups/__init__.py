"""Group join and rebalance latency (``python bench/groups``): the members (join_members.py),
their traces (join_trace.py), the join decomposed (join_decompose.py), the daemon rows
(join_daemon.py); and ``python bench/groups/spread.py``, how soon every worker of ``kdaemon run``
holds partitions on Kafka 4.4's shipped group settings (start, SIGHUP roll, TTIN)."""
