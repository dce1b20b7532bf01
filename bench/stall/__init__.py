"""The stall run's command (``python bench/stall``); the run itself is testkit/stall/."""
