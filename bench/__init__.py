"""Benchmarks: scripts that print figures side by side; none of them asserts a timing."""
