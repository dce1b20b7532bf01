"""The chaos run's command (``python bench/chaos``); the run itself is testkit/chaos/."""
