"""Consumer group membership (see coordinator.py for the map of its modules): coordinator
discovery, the member's state table, the classic membership protocol behind the seam a second
one (KIP-848) plugs into, the heartbeat timer, commits and OffsetFetch, partition assignors."""
