"""A client that decodes replies (`decode_responses=True`) meeting bytes that are not UTF-8,
which only a hand edit puts in the registry (found by a probe of client variants, session
36): redis-py's own decoding raised `UnicodeDecodeError` out of the moves, which killed a
`Pump.run` thread (a Dramatiq worker's pump restarted every second, firing nothing). It is
a `RegistryError` now, naming the cause and the way out: the pump logs it and retries that
queue, and serves the others. A client without it (the default) parks such a record
instead (tests/faults/test_template_not_utf8_s36.py). A real server."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

from emq_bridge import Pump, RegistryError, Repeat
from emq_bridge.testing import RecordingDispatcher


def test_a_decoding_client_names_undecodable_bytes_and_the_pump_serves_the_other_queues(
    client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = dict(client.connection_pool.connection_kwargs)
    decoding = redis.Redis(
        connection_pool=redis.ConnectionPool(**{**options, "decode_responses": True})
    )
    repeat = Repeat(decoding, prefix)
    for queue in ("qa", "qb"):
        repeat.upsert(queue, "job", every="1s", template={"task": "t", "args": ["é"]})
    record = repeat.keys("qa").record("job")
    stored = client.hget(record, "template")
    assert stored is not None
    client.hset(record, "template", stored.replace("é".encode(), b"\xff", 1))

    with pytest.raises(RegistryError, match="decode_responses=True cannot read"):
        repeat.load_records("qa", ["job"])
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["qa", "qb"], dispatcher, max_sleep_s=0.2)
    halt = threading.Event()
    thread = threading.Thread(target=pump.run, args=(halt,), daemon=True)
    with caplog.at_level(logging.ERROR, logger="emq_bridge"):
        thread.start()
        time.sleep(2.5)
        assert thread.is_alive()
        halt.set()
        thread.join(5)
    assert {o.queue for o in dispatcher.occurrences} == {"qb"}
    assert any("not UTF-8" in m and "qa" in m for m in caplog.messages), caplog.messages
    decoding.close()
