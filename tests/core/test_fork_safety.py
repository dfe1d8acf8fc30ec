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
