"""Benchmarks: scripts that print figures side by side; none of them asserts a timing.

One folder per benchmark, run from the repository root as ``python bench/<folder>`` (its
``__main__.py``) or ``python -m bench.<folder>``: consume (with consume/decode.py and
consume/pipeline.py), daemon, groups, spark (peer.py, sink.py), chaos and stall (the last two
run testkit/chaos and testkit/stall).  bench/peers.py is what consume, pipeline and daemon share;
the harness they all use is testkit/.  Nothing in testkit/ or tests/ imports bench.
"""
