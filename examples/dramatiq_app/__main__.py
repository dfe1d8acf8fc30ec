"""Run the example app on an embedded server: `python -m examples.dramatiq_app [dramatiq args]`.

Starts a throwaway Redis-protocol server (or uses `$REDIS_URL`), then the `dramatiq`
command on `examples.dramatiq_app`. Stop it with Ctrl-C.
"""

from __future__ import annotations

import os
import subprocess
import sys

from emq_bridge.embedded import redis_url


def main() -> int:
    """Run `dramatiq examples.dramatiq_app` until it exits; return its exit code."""
    with redis_url() as url:
        print(f"Redis at {url}; starting: dramatiq examples.dramatiq_app (Ctrl-C stops it)")
        command = [
            sys.executable,
            "-m",
            "dramatiq",
            "examples.dramatiq_app",
            "--processes",
            "1",
            "--threads",
            "2",
            *sys.argv[1:],
        ]
        process = subprocess.Popen(command, env={**os.environ, "REDIS_URL": url})
        try:
            return process.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached dramatiq too: let it shut its workers down gracefully.
            return process.wait()


if __name__ == "__main__":
    sys.exit(main())
