"""Sans-IO Kafka protocol: primitives, declarative message specs, record batches.

Imports only the standard library and the codec packages; never a socket.
"""
