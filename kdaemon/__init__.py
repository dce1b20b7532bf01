"""kdaemon: a Kafka consumer daemon with its own Kafka client.

Layering, lowest first: ``kdaemon.protocol`` (bytes only, no sockets) <- ``kdaemon.client`` <-
``kdaemon.plugins`` / ``kdaemon.sinks`` <- worker <- supervisor <- CLI.  Nothing lower imports
anything higher.
"""

__version__ = "0.1.0"
