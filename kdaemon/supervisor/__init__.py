"""The pre-fork supervisor: forks workers, keeps them alive, talks to systemd, serves metrics."""
