"""Test support: a real broker (Tansu), librdkafka's mock cluster, and confluent-kafka helpers.

The fixtures themselves live in ``tests/conftest.py``; these modules hold the machinery so that
benchmarks and one-off scripts can use it too.
"""
