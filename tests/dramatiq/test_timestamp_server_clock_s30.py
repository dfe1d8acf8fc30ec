"""A Dramatiq message's `message_timestamp` is the claim on the Redis server's clock, not the
pump host's (found by a clocks probe, session 30).

`dramatiq.Message` stamps `time.time()` of the host that builds it, and Dramatiq's `AgeLimit`
(`max_age`) compares that stamp with the worker's clock. A pump whose host clock was 90 s
behind sent messages that looked 90 s old on arrival: an actor with `max_age=60_000` skipped
every occurrence, where docs/guarantees.md promises that the host clocks of pumps do not
matter (a pump ahead makes them look younger: a real backlog is run). Now the message is
stamped with the claim's server time (`Occurrence.released_ms`), on both dispatchers.

The pump's clock is shifted by a `sitecustomize` on its `PYTHONPATH` (`time.time` and
`datetime.now` move, `time.monotonic` does not, as on a host whose wall clock is off).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import dramatiq
import pytest
import redis
import skewed_clock
from dramatiq.brokers.redis import RedisBroker
from processes import EMQ_BRIDGE, stop, wait_until

from emq_bridge import HistoryEntry, Occurrence, Repeat
from emq_bridge.dramatiq import DramatiqDispatcher, PipelinedDramatiqDispatcher

BEHIND_S = -90  # the pump's clock, against the server's (and the worker's)
MAX_AGE_MS = 60_000
RUNS = 3  # slots that must be reported before the pump stops
T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z

SKEW = skewed_clock.FIXED_OFFSET

APP = (
    textwrap.dedent("""
    import os
    import time

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from emq_bridge.dramatiq import RecurringMiddleware, recurring

    env = os.environ
    broker = RedisBroker(url=env["S30_URL"], namespace=env["S30_NAMESPACE"])
    broker.add_middleware(
        RecurringMiddleware(
            prefix=env["S30_PREFIX"], run_pump=env.get("S30_RUN_PUMP") != "0", max_sleep_s=0.5
        )
    )
    dramatiq.set_broker(broker)
    if env.get("S30_CLOCK_FILE"):  # what this process's clock reads, for the test
        with open(env["S30_CLOCK_FILE"], "w") as f:
            f.write(repr(time.time()))


    @recurring(every="1s")
    @dramatiq.actor(queue_name=env["S30_QUEUE"], max_age=%d)
    def tick():
        return None
""")
    % MAX_AGE_MS
)


def finished(repeat: Repeat, queue: str) -> list[HistoryEntry]:
    return [e for e in repeat.history(queue, "tick") if e.status != "running"]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_pump_whose_clock_is_behind_sends_messages_a_max_age_actor_runs(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "s30dq.py").write_text(APP)
    (tmp_path / "skew").mkdir()
    (tmp_path / "skew" / "sitecustomize.py").write_text(SKEW)
    queue = f"{prefix}-q"
    namespace = f"ns{prefix}"
    env = {
        **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        "S30_URL": redis_url,
        "S30_PREFIX": prefix,
        "S30_QUEUE": queue,
        "S30_NAMESPACE": namespace,
        "PYTHONPATH": str(tmp_path),
    }
    clock_file = tmp_path / "pump_clock"
    pump_env = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "skew"), str(tmp_path)]),
        "CLOCK_OFFSET_S": str(BEHIND_S),
        "S30_CLOCK_FILE": str(clock_file),
    }
    client = redis.Redis.from_url(redis_url)
    repeat = Repeat(client, prefix)
    with (tmp_path / "worker.log").open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "s30dq", "--processes", "1", "--threads", "1"],
            cwd=tmp_path,
            env={**env, "S30_RUN_PUMP": "0"},  # the worker only runs; the pump sends
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with (tmp_path / "pump.log").open("wb") as out:
        pump = subprocess.Popen(
            [EMQ_BRIDGE, "pump", "--dramatiq", "s30dq"],
            cwd=tmp_path,
            env=pump_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def log_tail() -> str:
        statuses = [e.status for e in repeat.history(queue, "tick")]
        tails = {n: (tmp_path / f"{n}.log").read_text()[-2000:] for n in ("pump", "worker")}
        return f"history {statuses}; logs: {tails}"

    try:
        wait_until(lambda: clock_file.exists() and clock_file.read_text(), 30, "the pump's start")
        offset = float(clock_file.read_text()) - time.time()
        assert abs(offset - BEHIND_S) < 10, offset  # the pump's clock is behind
        wait_until(
            lambda: len(finished(repeat, queue)) >= RUNS,
            90,
            f"{RUNS} slots reported",
            then=log_tail,
        )
        stop(pump)
        # What was sent before the pump stopped is reported too (run, or skipped).
        wait_until(
            lambda: all(e.status != "running" for e in repeat.history(queue, "tick")),
            30,
            "every slot sent to be reported",
            then=log_tail,
        )
    finally:
        stop(pump)
        stop(worker)
        for pattern in (f"{namespace}:*",):
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
        client.close()
    history = repeat.history(queue, "tick")
    assert len(history) >= RUNS
    # Every slot ran: none was skipped by AgeLimit as older than it is.
    assert [e.status for e in history] == ["succeeded"] * len(history), log_tail()


@pytest.mark.parametrize("pipelined", [False, True], ids=["enqueue", "pipelined"])
def test_both_dispatchers_stamp_the_claims_server_time(redis_url: str, pipelined: bool) -> None:
    namespace = f"ns{uuid.uuid4().hex[:8]}"
    queue = f"q{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=redis_url, namespace=namespace)
    client = redis.Redis.from_url(redis_url)
    try:
        dramatiq.actor(broker=broker, queue_name=queue, actor_name="s30_tick")(lambda: None)
        released_ms = T0 + 123  # the claim, on the server's clock: far from this host's now
        occurrence = Occurrence(
            queue, "tick", T0, str(uuid.uuid4()), {"task": "s30_tick"}, released_ms=released_ms
        )
        dispatcher = (PipelinedDramatiqDispatcher if pipelined else DramatiqDispatcher)(broker)
        if isinstance(dispatcher, PipelinedDramatiqDispatcher):
            assert dispatcher.dispatch_batch([occurrence]) == [None]
        else:
            dispatcher.dispatch(occurrence)
        [raw] = client.hvals(f"{namespace}:{queue}.msgs")
        assert json.loads(raw)["message_timestamp"] == released_ms
    finally:
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
        broker.close()
