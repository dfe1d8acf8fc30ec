"""`python -m emq_bridge.demo`: the demo, which lives in `emq_bridge.dramatiq.demo`.

Kept at this path for the command in the docs; it imports the Dramatiq adapter only when
it runs, so importing this module never imports a framework.
"""

from __future__ import annotations

import importlib


def main(url: str | None = None) -> int:
    """Run the demo on the server at `url` (else `$REDIS_URL`, else an embedded one).

    Return its exit code. Every key it writes is under a throwaway prefix, removed at the end.
    """
    demo = importlib.import_module("emq_bridge.dramatiq.demo")
    return int(demo.main(url=url) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
