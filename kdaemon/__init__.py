"""kdaemon: a Kafka consumer daemon with its own Kafka client.

Layering, lowest first: ``kdaemon.protocol`` (bytes only, no sockets) <- ``kdaemon.client`` <-
``kdaemon.plugins`` / ``kdaemon.sinks`` <- ``kdaemon.config`` <- worker <- supervisor <- CLI.
Nothing lower imports anything higher (tests/test_layers.py; the table is in
testkit/layers.py).
"""

__version__ = "0.1.0"
