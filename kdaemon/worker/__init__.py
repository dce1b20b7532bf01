"""A worker: one consumer and its pipeline, in one process (forked by the supervisor)."""
