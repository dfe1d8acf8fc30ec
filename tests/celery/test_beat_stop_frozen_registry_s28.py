"""SIGTERM to a real `celery beat -S emq` while its registry Redis does not answer (a probe).

The registry's process is stopped (SIGSTOP): connections are accepted, nothing is answered.
The beat's tick blocks on it; the SIGTERM it holds is handed on `STOP_DEADLINE_S` later, and
Celery's handler then closed the scheduler, whose heartbeat removal blocked on the same
registry inside the signal handler; the alarm, re-armed, went off in it again and again, so
the 30 s socket timeout never ended it: the beat stayed up, logging "did not end within"
every 3 s, until the registry answered again. It now leaves the registry alone once the
stop is overdue, and exits within seconds, its warning naming the registry.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from processes import wait_until

from emq_bridge.embedded import EmbeddedServer
from emq_bridge.pump import STOP_DEADLINE_S

pytestmark = [pytest.mark.timeout(120)]

APP = textwrap.dedent("""
    import os

    from celery import Celery

    env = os.environ
    app = Celery("frozenreg", broker=env["FR_BROKER"])
    app.conf.update(
        emq_bridge_redis_url=env["FR_REGISTRY"],
        emq_bridge_prefix=env["FR_PREFIX"],
        task_default_queue=env["FR_QUEUE"],
        beat_schedule={"tick": {"task": "frozenreg.tick", "schedule": 1.0}},
        result_backend=None,
        result_expires=None,
    )


    @app.task(name="frozenreg.tick")
    def tick():
        pass
""")


def test_sigterm_to_a_beat_whose_registry_does_not_answer_exits_within_seconds(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    (tmp_path / "fr_app.py").write_text(APP)
    log = tmp_path / "beat.log"
    with EmbeddedServer(directory=str(tmp_path)) as registry:
        assert registry.process is not None
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            ),
            "FR_BROKER": redis_url,
            "FR_REGISTRY": registry.url,
            "FR_PREFIX": prefix,
            "FR_QUEUE": f"{prefix}-frozen",
        }
        with log.open("wb") as out:
            beat = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "fr_app", "beat", "-S", "emq"),
                    *("--pidfile=", f"--schedule={tmp_path / 'beat.db'}", "-l", "info"),
                ],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        frozen = False

        def output() -> str:
            return log.read_text(errors="replace")

        try:

            def sending() -> bool:
                assert beat.poll() is None, output()
                return "Scheduler: Sending due task" in output()

            wait_until(sending, 60, "the beat's first send")
            os.kill(registry.process.pid, signal.SIGSTOP)
            frozen = True
            # The beat sends every second while its registry answers: two seconds without a
            # send say its tick waits on the registry.
            sent, quiet_since = output().count("Scheduler: Sending due task"), time.monotonic()
            while time.monotonic() - quiet_since < 2.0:
                time.sleep(0.1)
                if output().count("Scheduler: Sending due task") != sent:
                    sent, quiet_since = (
                        output().count("Scheduler: Sending due task"),
                        time.monotonic(),
                    )
            beat.send_signal(signal.SIGTERM)
            stopping = time.monotonic()
            try:
                beat.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the beat was still running 20s after SIGTERM:\n{output()[-3000:]}")
            took_s = time.monotonic() - stopping
        finally:
            if frozen:
                os.kill(registry.process.pid, signal.SIGCONT)
            if beat.poll() is None:
                beat.kill()
                beat.wait()
    text = output()
    # About STOP_DEADLINE_S: the first alarm interrupts the tick, and the stop leaves the
    # registry alone; the second, should the hand-back wait on it too, ends it.
    assert took_s < 10, f"the beat took {took_s:.1f}s to stop:\n{text[-3000:]}"
    assert text.count("did not end within") == 1, text[-3000:]
    assert f"the registry Redis at {registry.url} does not answer" in text, text[-3000:]


HANGING = textwrap.dedent("""
    import logging, signal, sys, threading, time

    from emq_bridge.celery.beat import _signals_held

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")

    def celery_handler(signum, frame):  # Celery's: it closes the scheduler, which hangs too
        print("handler: closing", flush=True)
        time.sleep(60)
        raise SystemExit()

    signal.signal(signal.SIGTERM, celery_handler)
    print("ticking", flush=True)
    try:
        with _signals_held(threading.Event(), lambda: "the registry Redis at x does not answer?"):
            time.sleep(60)  # a tick blocked on the registry
    except SystemExit:
        print("exiting", flush=True)
        time.sleep(60)  # and the exit hangs as well
""")


def test_a_stop_whose_hand_on_and_exit_hang_too_is_ended_by_the_last_alarms(
    tmp_path: Path,
) -> None:
    script = tmp_path / "hanging.py"
    script.write_text(HANGING)
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"ticking\n"
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        output, _ = process.communicate(timeout=30)
        took_s = time.monotonic() - stopping
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = output.decode(errors="replace")
    # 3 s: the first alarm hands the signal on (Celery's handler hangs); 6 s: the second
    # raises SystemExit in it; 9 s: the exit hangs too, and the last alarm's default action
    # ends the process.
    assert process.returncode == -signal.SIGALRM, text
    assert 3 * STOP_DEADLINE_S - 1 < took_s < 3 * STOP_DEADLINE_S + 3, took_s
    assert "WARNING the tick did not end within 3.0s of the stop (the registry Redis" in text
    assert "ERROR the stop did not end within 3.0s more" in text
    assert text.index("handler: closing") < text.index("exiting"), text
