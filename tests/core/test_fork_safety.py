"""A process forked while another thread of it uses the registry (Celery's prefork pool
replacing a child while the main process's reporter thread sends a report) must find the Lua
moves usable in the child.

The Lua sources were read on first use, through `importlib.resources`, which imports
`importlib.readers` then: a fork in the middle left the child that module half imported, and
every later read failed (the child's reports dropped for good) or hung. They are read when
`emq_bridge.scripts` is imported now.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, sys, threading
    from emq_bridge import scripts

    thread = threading.Thread(target=lambda: scripts.lua_source("report"))
    thread.start()
    pid = os.fork()  # at once: the thread may be in its first read
    if pid == 0:
        try:
            scripts.lua_source("ack")
            scripts.lua_source("claim")
        except Exception as exc:
            print("child failed:", repr(exc), flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    thread.join()
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


def test_a_child_forked_while_a_thread_reads_a_lua_move_can_read_them_all() -> None:
    for _ in range(10):
        done = subprocess.run(
            [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=20
        )
        assert done.returncode == 0, done.stdout + done.stderr


REPORTER_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import redis
    from emq_bridge import Repeat
    from emq_bridge.outcome import Report
    from emq_bridge.reporting import Reporter

    url, prefix = sys.argv[1], sys.argv[2]
    repeat = Repeat(redis.Redis.from_url(url), prefix)
    now = repeat.server_time_ms()
    repeat.upsert("q", "job", every="1h", template={"task": "t"}, now_ms=now)
    # The parent's reporter: its thread runs, and a report waits in its queue (long linger).
    reporter = Reporter(lambda: Repeat(redis.Redis.from_url(url), prefix), linger_s=5.0)
    reporter.report(Report("started", "q", "job", "parent", now, now))
    pid = os.fork()
    if pid == 0:  # Celery's prefork child: a fresh queue and a thread of its own
        reporter.report(Report("started", "q", "job", "child", now - 1000, now))
        ok = reporter.flush(10) and not reporter._pending
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    ids = [entry.id for entry in repeat.history("q", "job")]
    assert ids == ["child"], ids  # the child sent its own only
    assert reporter.flush(10)
    assert sorted(entry.id for entry in repeat.history("q", "job")) == ["child", "parent"]
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


def test_a_forked_child_reports_on_its_own_and_leaves_the_parents_queue(
    redis_url: str, prefix: str
) -> None:
    """A Reporter is reset in a forked child at the fork (`os.register_at_fork`): the child
    gets a queue and a thread of its own, and what the parent had queued is sent by the
    parent alone."""
    done = subprocess.run(
        [sys.executable, "-c", REPORTER_CHILD, redis_url, prefix],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
