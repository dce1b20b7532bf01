"""Group join and rebalance latency (``python bench/groups``): the members (join_members.py),
their traces (join_trace.py), the join decomposed (join_decompose.py), the daemon rows
(join_daemon.py)."""
