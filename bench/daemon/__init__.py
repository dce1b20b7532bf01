"""The whole daemon beside the peers (``python bench/daemon``): the daemon side (run.py) and the
``--profile`` plugin (profile_plugin.py, loaded by the daemon as ``bench.daemon.profile_plugin``)."""
