"""Share groups (KIP-932): one member of kdaemon's ShareConsumer beside Java's KafkaShareConsumer and
confluent-kafka's ShareConsumer (``python bench/share``), and the daemon's scaling past its partition
count, ``kdaemon run`` with share workers against a consumer group when every record costs CPU in a
plugin (``python bench/share/scaling.py``, its plugin ``bench/share/burn_plugin.py``)."""
