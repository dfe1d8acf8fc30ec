"""A server busy with a slow script (BUSY) or loading its data set (LOADING) is an outage, not
a broken registry: pumps retry it with backoff and the Reporter keeps its reports.

A wake-up subscription used in a process forked since it was made (Celery's prefork pool,
gunicorn) subscribes again on a connection of its own: on the parent's socket, both processes
would read one stream and take each other's wake-ups.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import EmqError, RegistryError, RegistryUnavailable
from emq_bridge.replies import redis_errors

# Spins (reading TIME, writing nothing: SCRIPT KILL can stop it) until ARGV[1] µs have passed.
SLOW_SCRIPT = """
local start = redis.call('TIME')
local t0 = start[1] * 1000000 + start[2]
repeat
  local now = redis.call('TIME')
until now[1] * 1000000 + now[2] - t0 >= tonumber(ARGV[1])
return 1
"""
PORTS = range(27300, 27400)  # this suite's own servers, apart from the shared fixtures'


@pytest.fixture
def busy_url() -> Iterator[str]:
    """A server of its own (it is made busy) that answers BUSY after a script ran 100 ms."""
    for port in PORTS:
        server = EmbeddedServer(port=port, extra_args=["--lua-time-limit", "100"])
        try:
            server.start()
        except EmqError:  # the port is taken: the next one
            continue
        try:
            yield server.url
        finally:
            server.stop()
        return
    pytest.fail(f"no free port from {PORTS.start} to {PORTS.stop - 1}")


def _run_slow_script(url: str) -> threading.Thread:
    """Start a slow script on a connection of its own; return once the server answers BUSY."""
    runner = redis.Redis.from_url(url)

    def run() -> None:
        try:
            runner.eval(SLOW_SCRIPT, 0, 10_000_000)
        except redis.ResponseError:  # SCRIPT KILL ends it
            pass
        finally:
            runner.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    with redis.Redis.from_url(url) as probe:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                probe.ping()
            except redis.ResponseError as exc:
                assert str(exc).startswith("BUSY"), exc
                return thread
            time.sleep(0.02)
    pytest.fail("the server never answered BUSY")


def _kill_script(url: str, thread: threading.Thread) -> None:
    with redis.Redis.from_url(url) as client:
        client.script_kill()
    thread.join(10)


def test_a_move_on_a_server_busy_with_a_slow_script_is_an_outage(busy_url: str) -> None:
    repeat = Repeat(redis.Redis.from_url(busy_url), "p")
    thread = _run_slow_script(busy_url)
    try:
        with pytest.raises(RegistryUnavailable, match="busy running a script") as caught:
            repeat.upsert("q", "job", every="1h", template={"task": "t"}, now_ms=10**12)
        assert str(caught.value).startswith("upsert q: Redis cannot serve it now: ")
        # A pipeline's error names its command first; still an outage.
        with pytest.raises(RegistryUnavailable, match="busy running a script"):
            repeat.any_exist([["p:k"]], "EXISTS p:k")
    finally:
        _kill_script(busy_url, thread)
    assert repeat.upsert("q", "job", every="1h", template={"task": "t"}, now_ms=10**12)


@pytest.mark.parametrize(
    "reply",
    [
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
        "LOADING Redis is loading the dataset in memory",
    ],
)
def test_busy_and_loading_replies_are_an_outage(client: redis.Redis, reply: str) -> None:
    expected = reply.partition(" ")[2]
    with (
        pytest.raises(RegistryUnavailable, match="claim q: Redis cannot serve it now: ") as caught,
        redis_errors("claim q"),
    ):
        client.eval("return redis.error_reply(ARGV[1])", 0, reply)
    assert str(caught.value).endswith(expected)


def test_busy_read_from_an_older_redis_py_text_is_an_outage() -> None:
    """redis-py before 8 keeps no `status_code`: the code is read from the text."""
    reply = "Command # 1 (TIME) of pipeline caused error: BUSY Redis is busy running a script."
    with pytest.raises(RegistryUnavailable), redis_errors("TIME"):
        raise redis.ResponseError(reply)


@pytest.mark.parametrize(
    "reply",
    [
        "BUSYGROUP Consumer Group name already exists",
        "BUSYKEY Target key name already exists.",
    ],
)
def test_other_busy_like_replies_are_still_a_broken_registry(
    client: redis.Redis, reply: str
) -> None:
    with pytest.raises(RegistryError) as caught, redis_errors("claim q"):
        client.eval("return redis.error_reply(ARGV[1])", 0, reply)
    assert not isinstance(caught.value, RegistryUnavailable)


FORKED = textwrap.dedent(
    """
    import json, os, sys
    import redis
    from emq_bridge import Repeat

    url, prefix = sys.argv[1], sys.argv[2]
    # A read that hangs on a stolen reply ends (TimeoutError) instead of hanging the test.
    repeat = Repeat(redis.Redis.from_url(url, socket_timeout=5), prefix)
    wakeups = repeat.subscribe(["q"])
    assert wakeups.wait(0.2) is False  # SUBSCRIBE's reply is read; nothing changed yet
    ready_r, ready_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # Celery's prefork child: it waits on the subscription the parent made
        try:
            wakeups.wait(1.0)  # subscribed on its own by now (a SUBSCRIBE's reply read)
            os.write(ready_w, b"ready")
            result = "woke" if wakeups.wait(5.0) else "timed out"
            wakeups.close()  # as a pump's stop does: the parent's subscription lives on
        except Exception as exc:
            result = repr(exc)
        os.write(result_w, result.encode())
        os._exit(0)
    os.read(ready_r, 5)
    repeat.register("q", "first", every="1m", template={"task": "t"})
    try:
        parent = "woke" if wakeups.wait(5.0) else "timed out"
    except Exception as exc:
        parent = repr(exc)
    child = os.read(result_r, 1000).decode()
    os.waitpid(pid, 0)
    repeat.register("q", "second", every="1m", template={"task": "t"})
    try:
        after = "woke" if wakeups.wait(5.0) else "timed out"
    except Exception as exc:
        after = repr(exc)
    print(json.dumps({"parent": parent, "child": child, "parent after": after}))
    """
)


def test_a_forked_child_waits_on_a_subscription_of_its_own(redis_url: str, prefix: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORKED, redis_url, prefix],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    heard = json.loads(done.stdout)
    assert heard == {"parent": "woke", "child": "woke", "parent after": "woke"}, heard
