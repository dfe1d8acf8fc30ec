"""One `trigger` call is one trigger, even when redis-py sends the call twice (found by a
Python API probe).

redis-py resends a command whose reply did not come within `socket_timeout` (its retry on
`TimeoutError`, on by default since redis-py 6), though the server may have run it: the
server was only busy. `trigger` then wrote a second trigger 1 ms after the first, which a
pump sent as a second occurrence with another id. Each call now sends a nonce, and its
script answers a nonce it has seen as it did. (`register` of a new name resent so answers
"exists", though it made the record: it keeps no nonce, docs/design.md says why.)

The server is kept busy with `DEBUG SLEEP` from another client, started just before the
call is sent and seen to hold the server (a PING that times out): it blocks the server for a
set wall-clock time on any server (a Lua loop would need a clock, and Valkey freezes `TIME`
inside a script; a loop count would depend on the machine). The call times out, and redis-py
resends it on a new connection once the server wakes; the server runs the first copy too
(its bytes were read before the client hung up). A server of its own is started with
`enable-debug-command` (Redis 7 and Valkey refuse DEBUG without it; Redis 6.2 has no such
option and always takes DEBUG).
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from emq_bridge import Pump, Repeat
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import EmqError
from emq_bridge.testing import RecordingDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z
TEMPLATE = {"task": "reports.digest"}
# The call's reply is awaited this long; the server sleeps longer, and wakes before redis-py
# has spent its retries (3, each a new connection whose first reply waits as long).
SOCKET_TIMEOUT_S = 0.5
SLEEP_S = 1.0
# A PING unanswered this long: the server is asleep (well below SLEEP_S - SOCKET_TIMEOUT_S,
# so the call sent next still times out).
ASLEEP_S = 0.15


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    """A server of its own that takes DEBUG SLEEP."""
    started: EmbeddedServer | None = None
    for extra in (["--enable-debug-command", "yes"], []):  # [] for a 6.2 binary
        candidate = EmbeddedServer(extra_args=extra)
        try:
            started = candidate.start()
            break
        except EmqError:
            candidate.stop()
    assert started is not None, "no embedded server could be started"
    try:
        redis.Redis(port=started.port).execute_command("DEBUG", "SLEEP", "0")
    except redis.ResponseError as exc:
        started.stop()
        pytest.fail(f"the embedded server refuses DEBUG SLEEP: {exc}")
    yield started
    started.stop()


def put_to_sleep(port: int, threads: list[threading.Thread]) -> None:
    """Start `DEBUG SLEEP` on another connection; return once the server stopped answering."""
    sleeper = redis.Redis(port=port)
    thread = threading.Thread(
        target=lambda: sleeper.execute_command("DEBUG", "SLEEP", str(SLEEP_S)), daemon=True
    )
    thread.start()
    threads.append(thread)
    probe = redis.Redis(port=port, socket_timeout=ASLEEP_S, retry=Retry(NoBackoff(), 0))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            probe.ping()
        except redis.TimeoutError:
            return
        time.sleep(0.002)
    raise AssertionError("the server never went to sleep")


def retrying_client(port: int, threads: list[threading.Thread]) -> tuple[redis.Redis, Any]:
    """Return a client with redis-py's retry on timeouts, and `arm(script)`: the next call of
    that script (a redis-py `Script`) is sent just after the server went to sleep."""
    armed: list[bytes] = []

    class StallingConnection(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            sent = b"".join(command) if isinstance(command, list) else command
            if armed and armed[0] in sent:
                armed.clear()
                put_to_sleep(port, threads)
            super().send_packed_command(command, check_health)

    with warnings.catch_warnings():  # redis-py 5 needs it; 6 retries on timeouts anyway
        warnings.simplefilter("ignore", DeprecationWarning)
        client = redis.Redis(
            port=port,
            socket_timeout=SOCKET_TIMEOUT_S,
            retry=Retry(NoBackoff(), 3),
            retry_on_timeout=True,
        )
    client.connection_pool.connection_class = StallingConnection

    def arm(script: Any) -> None:
        # Loaded first: else both copies would meet NOSCRIPT, and redis-py's reload send once.
        client.script_load(script.script)
        armed[:] = [script.sha.encode()]

    return client, arm


@pytest.fixture
def stalled(server: EmbeddedServer, prefix: str) -> Iterator[tuple[Repeat, Callable[[Any], None]]]:
    threads: list[threading.Thread] = []
    client, arm = retrying_client(server.port, threads)
    yield Repeat(client, prefix), arm
    for thread in threads:
        thread.join(10)
    client.close()


def test_a_trigger_redis_py_sends_twice_fires_once_with_the_id_the_caller_got(
    server: EmbeddedServer, stalled: tuple[Repeat, Callable[[Any], None]]
) -> None:
    repeat, arm = stalled
    plain = Repeat(redis.Redis(port=server.port), repeat.prefix)
    plain.register("trigger", "nightly", cron="0 3 * * *", template=TEMPLATE)

    arm(repeat.scripts.trigger)
    started = time.monotonic()
    triggered = repeat.trigger("trigger", "nightly")
    assert time.monotonic() - started > SOCKET_TIMEOUT_S  # it did wait out a timeout

    recorder = RecordingDispatcher()
    Pump(plain, ["trigger"], recorder).run_once()
    [sent] = recorder.occurrences
    assert (sent.id, sent.triggered, sent.redelivered) == (triggered, True, False)
    assert plain.leases("trigger") == []


# -- the scripts, called twice with one nonce (on the server and on fakeredis) --------------


def _trigger_lua(repeat: Repeat, nonce: str, now_ms: int) -> list[int]:
    """Call trigger.lua for q/nightly with `nonce` at `now_ms`, as `Repeat.trigger` does."""
    keys = repeat.keys("q")
    reply = repeat.scripts.trigger(
        keys=[keys.record("nightly"), keys.leases],
        args=["nightly", now_ms, keys.wake_channel, nonce],
    )
    return [int(part) for part in reply]


def test_trigger_lua_called_again_with_the_same_nonce_writes_nothing_and_answers_the_same(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("q", "nightly", cron="0 3 * * *", template=TEMPLATE, now_ms=T0)
    keys = any_repeat.keys("q")
    call = functools.partial(_trigger_lua, any_repeat)

    assert call("first", T0) == [1, T0]
    assert call("first", T0 + 5) == [1, T0]  # the resent call: nothing written
    assert any_repeat.client.zrange(keys.leases, 0, -1) == [f"nightly {T0} manual".encode()]
    assert call("second", T0) == [1, T0 + 1]  # another call: a trigger of its own
    assert any_repeat.client.zcard(keys.leases) == 2


def test_a_resent_trigger_is_recognised_after_another_callers_trigger(any_repeat: Repeat) -> None:
    # Session 34 (a probe of the API from web apps): the record kept only the last call's
    # nonce, so a resend that came after another caller's trigger wrote a trigger of its
    # own: two calls, three or four triggers, ids no caller got.
    any_repeat.register("q", "nightly", cron="0 3 * * *", template=TEMPLATE, now_ms=T0)
    keys = any_repeat.keys("q")
    call = functools.partial(_trigger_lua, any_repeat)

    assert call("a", T0) == [1, T0]
    assert call("b", T0) == [1, T0 + 1]  # another caller, between a's call and its resend
    assert call("a", T0 + 500) == [1, T0]  # a's resend: its own trigger, nothing written
    assert call("b", T0 + 600) == [1, T0 + 1]
    assert any_repeat.client.zcard(keys.leases) == 2
    for i in range(70):  # the calls kept are bounded: the newest 64, of the last minute
        call(f"n{i}", T0 + 1_000 + i)
    assert call("n69", T0 + 2_000) == [1, T0 + 1_069]
    assert call("a", T0 + 2_000)[1] > T0 + 1_069  # pushed out: a call of its own now
    later = T0 + 120_000
    call("late", later)
    field = any_repeat.client.hget(keys.record("nightly"), "trigger_call")
    assert field == f"late {later}".encode()  # a minute on, the others are gone
