"""``python -m kdaemon.cli``: what the supervisor runs to check a configuration in a throw-away
process."""

from . import main

if __name__ == "__main__":
    main()
