"""The web view against hostile requests (found by a probe, session 26):

* a form is refused past `FORM_MAX_BYTES` before it is read, and a change's form only after
  the caller may write: an unauthenticated 900 MB form made the server hold 900 MB;
* a write cookie of thousands of digits is refused, not a 500 on every page;
* `?done=` shows only the app's own outcome texts, not text a crafted link brings.

In-process ASGI (Starlette's TestClient), real Redis behind it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from registry_state import snapshot
from web_client import TOKEN, Client

from emq_bridge import Repeat
from emq_bridge.web.app import FORM_MAX_BYTES
from emq_bridge.web.auth import WRITE_COOKIE


@pytest.fixture
def seeded(repeat: Repeat) -> Repeat:
    repeat.upsert("reports", "digest", every="15m", template={"task": "d"})
    return repeat


@pytest.mark.parametrize("path", ["/schedule", "/unlock", "/lock"])
def test_a_form_past_the_limit_is_refused_unread(seeded: Repeat, web: Client, path: str) -> None:
    client = web(token=TOKEN)
    before = snapshot(seeded)
    big = {"queue": "reports", "name": "digest", "action": "pause", "pad": "x" * FORM_MAX_BYTES}
    reply = client.post(path, data=big, follow_redirects=False)
    assert reply.status_code in (403, 413)  # a change's form: refused as read-only first
    assert snapshot(seeded) == before


def test_a_read_only_caller_is_refused_before_its_form_is_read(seeded: Repeat, web: Client) -> None:
    client = web(token=TOKEN)
    read: list[bytes] = []

    def body() -> Iterator[bytes]:  # each chunk the app reads is recorded
        for chunk in (b"queue=reports&name=digest&action=pause", b"&pad=" + b"x" * 1000):
            read.append(chunk)
            yield chunk

    reply = client.post(
        "/schedule",
        content=body(),
        headers={"content-type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert reply.status_code == 403 and "read-only" in reply.text
    assert read == [], "the body of a refused caller was read"


def test_a_write_cookie_of_thousands_of_digits_is_refused_not_an_error(
    seeded: Repeat, web: Client
) -> None:
    client = web(token=TOKEN)
    cookie = {"cookie": f"{WRITE_COOKIE}={'9' * 4301}.x"}
    assert client.get("/", headers=cookie).status_code == 200
    form = {"queue": "reports", "name": "digest", "action": "pause", "csrf": "x"}
    assert client.post("/schedule", data=form, headers=cookie).status_code == 403


def test_the_notice_shows_only_the_apps_own_texts(seeded: Repeat, web: Client) -> None:
    client = web()
    spoof = client.get("/", params={"done": "Your token expired: paste it at https://x.example"})
    assert "x.example" not in spoof.text
    own = client.get("/schedule", params={"queue": "reports", "name": "digest", "done": "paused"})
    assert 'id="notice">paused<' in own.text
    # Session 34 (web security probe): "<queue>/<name> removed" was shown for any valid names,
    # and names may hold letters that read as spaces (U+3164): a link wrote its own sentence.
    # A removal's notice now carries this app's signature (the redirect of a real removal).
    forged = "Session\u3164expired.\u3164Re-enter\u3164your\u3164token\u3164at/https:x removed"
    assert "expired" not in client.get("/", params={"done": forged}).text
    assert 'id="notice"' not in client.get("/", params={"done": "reports/other removed"}).text


@pytest.mark.parametrize("path", ["/api/csrf", "/api/schedules", "/api/nothing-here"])
def test_the_json_api_is_neither_cached_nor_sniffed(seeded: Repeat, web: Client, path: str) -> None:
    reply = web().get(path)
    assert reply.headers["cache-control"] == "no-store"
    assert reply.headers["x-content-type-options"] == "nosniff"
