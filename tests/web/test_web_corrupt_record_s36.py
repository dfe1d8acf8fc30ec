"""The web view says a corrupt record is corrupt, not that it does not exist (found by a probe
of damaged registries, session 36).

A record edited by hand past decoding (`every_ms abc`) was answered 404 "no registration
'a3' in queue 'qa'" by `/api/schedule` and its page, where `emq-bridge show` says it is
corrupt and names the field. It is a 500 with that reason now (no retry mends it; a 503
would say "try again"); an unknown one is still a 404. A real server behind the app.
"""

from __future__ import annotations

import redis
from web_client import Client

from emq_bridge import Repeat


def test_a_corrupt_record_is_a_500_naming_the_field(
    repeat: Repeat, client: redis.Redis, web: Client
) -> None:
    repeat.upsert("qa", "a3", every="1h", template={"task": "t"})
    client.hset(repeat.keys("qa").record("a3"), "every_ms", "abc")
    browser = web()
    reply = browser.get("/api/schedule", params={"queue": "qa", "name": "a3"})
    assert reply.status_code == 500, reply.text
    error = reply.json()["error"]
    assert "qa/a3 is corrupt" in error and "every_ms" in error, error
    page = browser.get("/schedule", params={"queue": "qa", "name": "a3"})
    assert page.status_code == 500 and "is corrupt" in page.text
    missing = browser.get("/api/schedule", params={"queue": "qa", "name": "nope"})
    assert missing.status_code == 404
