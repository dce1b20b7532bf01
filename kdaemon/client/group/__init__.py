"""Consumer group membership: the member state machine, the coordinator, partition assignors."""
