"""Sinks: where a worker delivers records.  ``flush()`` returns only once writes are durable."""
