"""Running the CLI as a process, and waiting on and stopping the real worker, beat and pump
processes tests start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery import Celery

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher

# The `emq-bridge` script of the interpreter running the tests.
EMQ_BRIDGE = str(Path(sys.executable).parent / "emq-bridge")


def run_cli(
    redis_url: str, prefix: str, *args: str, timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    """`emq-bridge --redis-url URL --prefix PREFIX ARGS` as a process of its own."""
    return subprocess.run(
        [EMQ_BRIDGE, "--redis-url", redis_url, "--prefix", prefix, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def run_app_cli(
    app_dir: Path, *args: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """`emq-bridge ARGS` as a process of its own, in `app_dir`, with `app_dir` importable (an
    app module a test wrote there) and no `$REDIS_URL`: the registry is what ARGS and the
    app name, never the suite's server by accident."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(app_dir), env.get("PYTHONPATH")]))
    return subprocess.run(
        [EMQ_BRIDGE, *args],
        cwd=app_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


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


def celery_worker(
    app_dir: Path, module: str, queue: str, variables: dict[str, str], concurrency: int = 2
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start a real prefork `celery worker` of the app `module` in `app_dir` (on its
    PYTHONPATH, with `variables` in its environment, `$REDIS_URL` left out) consuming
    `queue`; return the process and its log (`app_dir/worker.log`)."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(app_dir), env.get("PYTHONPATH")]))
    log = app_dir / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", module, "worker", "-Q", queue),
                *("-c", str(concurrency), "-P", "prefork", "-l", "info", "--without-mingle"),
                "--without-gossip",
            ],
            cwd=app_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return worker, log


@contextmanager
def celery_pump(repeat: Repeat, queue: str, broker_url: str) -> Iterator[Pump]:
    """Run a pump of `queue` on a thread of its own for the block, sending through a Celery
    app of its own on `broker_url` (`CeleryDispatcher`); stop it and close that app after."""
    sender = Celery(f"{queue}-sender", broker=broker_url)
    sender.conf.update(result_backend=None, task_default_queue=queue)
    pump = Pump(repeat, [queue], CeleryDispatcher(sender), max_sleep_s=0.5)
    halt = threading.Event()
    thread = threading.Thread(target=pump.run, args=(halt,), daemon=True)
    thread.start()
    try:
        yield pump
    finally:
        halt.set()
        thread.join(10)
        sender.close()
