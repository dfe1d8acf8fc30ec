"""SIGTERM to a real `dramatiq` worker whose middleware pumps a burst leaves nothing leased.

The worker's shutdown calls `before_worker_shutdown`, which stops the pump thread: it settles
the batch in hand (what it has not enqueued within half a second is handed back) and the
worker exits. A second pump then sends everything left at once, and each occurrence id is
enqueued exactly once. The worker consumes another queue, so the burst's messages stay in
the broker to be counted.

Sent one `broker.enqueue` at a time (`pipelined=False`), enqueueing is slowed to 30 ms a
message and the worker is stopped in the burst's third batch (500 occurrences: 15 s to send,
longer than the worker waits for its pump thread), so finishing that batch is not an option.
Sent pipelined (the automatic choice on a `RedisBroker`), a batch is one send, finished: with
2 ms a message the worker stops once the batch in hand is in, having claimed nothing more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from quiet import quiet_offset

from emq_bridge import Pump, Repeat
from emq_bridge.definition import define
from emq_bridge.dramatiq import DramatiqDispatcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

BURST = 3_000
HOUR = 3_600_000
FIRST_BATCHES = 32 + 128  # a burst's batches: 32, 128, then 500

APP = textwrap.dedent("""
    import os
    import time

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import Middleware

    from emq_bridge.dramatiq import RecurringMiddleware

    env = os.environ


    class SlowEnqueue(Middleware):
        def before_enqueue(self, broker, message, delay):  # a slow broker
            time.sleep(float(env["GS_DELAY_S"]))


    pipelined = {"auto": None, "off": False}[env["GS_PIPELINED"]]
    broker = RedisBroker(url=env["GS_REDIS"], namespace=env["GS_NAMESPACE"])
    broker.add_middleware(SlowEnqueue())
    broker.add_middleware(
        RecurringMiddleware(prefix=env["GS_PREFIX"], max_sleep_s=0.5, pipelined=pipelined)
    )
    dramatiq.set_broker(broker)


    @dramatiq.actor(queue_name=env["GS_QUEUE"], actor_name="noop")
    def noop():
        pass


    @dramatiq.actor(queue_name=env["GS_QUEUE"] + "-idle", actor_name="idle")
    def idle():
        pass
""")


@pytest.mark.parametrize(
    ("pipelined", "delay_s"), [("off", 0.03), ("auto", 0.002)], ids=["enqueue", "pipelined"]
)
def test_sigterm_to_a_worker_during_a_burst_leaves_nothing_leased_and_sends_each_id_once(
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    client: redis.Redis,
    pipelined: str,
    delay_s: float,
) -> None:
    token = uuid.uuid4().hex[:8]
    queue, namespace, module = f"{prefix}-q", f"ns{token}", f"gs_dramatiq_{token}"
    (tmp_path / f"{module}.py").write_text(APP)
    repeat = Repeat(client, prefix)
    # Due now, the next slot far off: a top of the hour mid-test would send the burst again.
    definition = define(every="1h", offset=quiet_offset(), template={"task": "noop"})
    now = repeat.server_time_ms()
    repeat.upsert_many([(queue, f"r{i:05d}", definition) for i in range(BURST)], now_ms=now - HOUR)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "GS_REDIS": redis_url,
        "GS_PREFIX": prefix,
        "GS_QUEUE": queue,
        "GS_NAMESPACE": namespace,
        "GS_PIPELINED": pipelined,
        "GS_DELAY_S": str(delay_s),
    }
    messages = f"{namespace}:{queue}.msgs"
    log = tmp_path / "worker.log"
    try:
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dramatiq", module, "--path", str(tmp_path)),
                    *("--processes", "1", "--threads", "1", "--queues", f"{queue}-idle"),
                ],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 60
            while client.hlen(messages) <= FIRST_BATCHES + 5:  # in the third batch
                assert worker.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, "the worker's pump sent nothing in 60 s"
                time.sleep(0.005)
            worker.send_signal(signal.SIGTERM)
            stopping = time.monotonic()
            worker.wait(timeout=60)
            took_s = time.monotonic() - stopping
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        output = log.read_text(errors="replace")
        assert "Traceback" not in output, output[-3000:]
        assert took_s < 8, f"the worker took {took_s:.1f}s to stop"
        sent_by_worker = client.hlen(messages)
        assert 0 < sent_by_worker < BURST, output[-3000:]
        path = {"auto": "(pipelined)", "off": "(one broker.enqueue per message)"}[pipelined]
        assert f"pump started in the worker on queues {queue}, {queue}-idle {path}" in output
        if pipelined == "auto":  # whole batches: the one in hand finished, no other claimed
            assert (sent_by_worker - FIRST_BATCHES) % 500 == 0, sent_by_worker
        left = [lease for lease in repeat.leases(queue) if lease[2] > repeat.server_time_ms()]
        assert left == [], f"{len(left)} occurrence(s) wait out their lease"

        broker = RedisBroker(url=redis_url, namespace=namespace)
        try:
            dramatiq.actor(broker=broker, queue_name=queue, actor_name="noop")(lambda: None)
            Pump(repeat, [queue], DramatiqDispatcher(broker), batch_size=BURST).run_once()
        finally:
            broker.close()
        assert repeat.leases(queue) == []
        ids = Counter(json.loads(raw)["message_id"] for raw in client.hvals(messages))
        twice = [i for i, n in ids.items() if n > 1]
        assert twice == [], f"{len(twice)} occurrence(s) sent twice"
        assert len(ids) == BURST
    finally:
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
