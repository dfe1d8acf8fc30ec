"""Waiting on and stopping the real worker, beat and pump processes tests start."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_until(
    check: Callable[[], Any], timeout_s: float, what: str = "a condition", *, then: Any = None
) -> None:
    """Poll `check` until it returns something truthy; AssertionError after `timeout_s`,
    saying `what`, and what `then()` returns at that moment (a worker's log), if given."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    seen = f": {then()}" if then is not None else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{seen}")


def stop(process: subprocess.Popen[bytes], timeout_s: float = 20) -> None:
    """SIGTERM `process` (a warm shutdown), SIGKILL it if it outlives `timeout_s`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
