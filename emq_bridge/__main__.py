"""Run the `emq-bridge` command line: `python -m emq_bridge --help`."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
