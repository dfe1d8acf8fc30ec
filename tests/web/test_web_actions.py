"""Changes from the web view: read-only by default; a token or the host app's auth allows
pause, resume, trigger and remove through the registry's moves, each with its CSRF token;
every refusal leaves the registry exactly as it was."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable

import pytest
from registry_state import snapshot
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient
from web_client import TOKEN, Client

from emq_bridge import Repeat
from emq_bridge.web import app, auth
from emq_bridge.web.auth import CSRF_COOKIE, WRITE_COOKIE, WriteCheck

PAGE = "/schedule?queue=reports&name=digest"
TWELVE_HOURS_S = 12 * 3600


@pytest.fixture
def seeded(repeat: Repeat) -> Repeat:
    repeat.upsert("reports", "digest", every="15m", template={"task": "d"})
    repeat.upsert("reports", "other", every="1h", template={"task": "o"})
    return repeat


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def unlock(client: TestClient, token: str = TOKEN) -> None:
    csrf = csrf_of(client.get("/").text)
    reply = client.post("/unlock", data={"csrf": csrf, "token": token}, follow_redirects=False)
    assert reply.status_code == 303


def act(client: TestClient, action: str, name: str = "digest", **extra: str) -> object:
    csrf = csrf_of(client.get(PAGE).text)
    form = {"csrf": csrf, "queue": "reports", "name": name, "action": action, **extra}
    return client.post("/schedule", data=form, follow_redirects=False)


def test_by_default_the_view_is_read_only_and_a_forged_post_changes_nothing(
    seeded: Repeat, web: Client
) -> None:
    client = web()
    page = client.get(PAGE).text
    assert 'id="actions"' not in page and "read-only" in page and "Unlock" not in page
    before = snapshot(seeded)
    assert 'name="csrf"' not in client.get("/").text  # no form at all: no unlock, no lock
    csrf = client.get("/api/csrf").json()["csrf"]  # a valid token does not make a writer
    for action in ("pause", "trigger", "remove"):
        form = {"csrf": csrf, "queue": "reports", "name": "digest", "action": action}
        reply = client.post("/schedule", data=form, follow_redirects=False)
        assert reply.status_code == 403 and "read-only" in reply.text
    assert client.post("/api/schedule/pause?queue=reports&name=digest").status_code == 403
    assert snapshot(seeded) == before


def test_with_the_token_unlocked_each_action_goes_through_the_registrys_moves(
    seeded: Repeat, web: Client
) -> None:
    client = web(token=TOKEN)
    assert "Unlock" in client.get("/").text and 'id="actions"' not in client.get(PAGE).text
    unlock(client)
    page = client.get(PAGE).text
    assert 'id="actions"' in page and "writes allowed" in page
    assert TOKEN not in page and TOKEN not in str(client.cookies.get(WRITE_COOKIE))

    reply = act(client, "pause")
    assert reply.status_code == 303  # type: ignore[attr-defined]
    assert "done=paused" in reply.headers["location"]  # type: ignore[attr-defined]
    assert seeded.get("reports", "digest").paused  # type: ignore[union-attr]
    page = client.get(reply.headers["location"]).text  # type: ignore[attr-defined]
    assert 'id="state">paused' in page and 'id="action-resume"' in page
    assert 'id="action-pause"' not in page

    act(client, "resume")
    assert not seeded.get("reports", "digest").paused  # type: ignore[union-attr]
    act(client, "trigger")
    assert [lease[0] for lease in seeded.leases("reports")] == ["digest"]

    refused = act(client, "remove")  # without the box ticked
    assert refused.status_code == 400  # type: ignore[attr-defined]
    assert seeded.get("reports", "digest") is not None
    reply = act(client, "remove", confirm="yes")
    location = reply.headers["location"]  # type: ignore[attr-defined]
    assert "done=reports%2Fdigest+removed" in location
    assert 'id="notice">reports/digest removed<' in client.get(location).text  # signed: shown
    assert seeded.get("reports", "digest") is None and seeded.names("reports") == ["other"]
    assert act(client, "pause", name="gone").status_code == 404  # type: ignore[attr-defined]


def test_a_change_without_this_browsers_csrf_token_or_from_another_site_is_refused(
    seeded: Repeat, web: Client
) -> None:
    client = web(token=TOKEN)
    unlock(client)
    before = snapshot(seeded)
    form = {"queue": "reports", "name": "digest", "action": "pause"}
    assert client.post("/schedule", data=form).status_code == 403  # no token
    assert client.post("/schedule", data={**form, "csrf": "x.y"}).status_code == 403
    other = web(token=TOKEN)  # another browser's valid token is not this one's
    assert (
        client.post("/schedule", data={**form, "csrf": csrf_of(other.get("/").text)}).status_code
        == 403
    )
    csrf = csrf_of(client.get("/").text)
    evil = client.post(
        "/schedule", data={**form, "csrf": csrf}, headers={"origin": "https://evil.example"}
    )
    assert evil.status_code == 403
    assert "another origin (https://evil.example)" in evil.text  # it says why, not "CSRF"
    assert "CSRF" not in evil.text
    assert client.post("/api/schedule/pause", json=form).status_code == 403  # cookie, no header
    assert snapshot(seeded) == before
    ok = client.post("/api/schedule/pause", json=form, headers={"x-csrf-token": csrf})
    assert ok.json() == {"queue": "reports", "name": "digest", "action": "pause", "changed": True}


def test_the_api_takes_the_token_as_a_bearer_without_csrf(seeded: Repeat, web: Client) -> None:
    client = web(token=TOKEN)
    wrong = client.post(
        "/api/schedule/trigger",
        json={"queue": "reports", "name": "digest"},
        headers={"authorization": "Bearer not-the-token-at-all"},
    )
    assert wrong.status_code == 403 and seeded.leases("reports") == []
    bearer = {"authorization": f"Bearer {TOKEN}"}
    reply = client.post(
        "/api/schedule/trigger", json={"queue": "reports", "name": "digest"}, headers=bearer
    )
    assert reply.status_code == 200 and reply.json()["occurrence_id"]
    assert [lease[0] for lease in seeded.leases("reports")] == ["digest"]
    again = client.post("/api/schedule/resume?queue=reports&name=digest", headers=bearer)
    assert again.json()["changed"] is False  # it was not paused
    assert (
        client.post("/api/schedule/explode?queue=reports&name=digest", headers=bearer).status_code
        == 400
    )
    assert (
        client.post("/api/schedule/pause?queue=reports&name=nope", headers=bearer).status_code
        == 404
    )


def test_a_wrong_token_unlocks_nothing(seeded: Repeat, web: Client) -> None:
    client = web(token=TOKEN)
    unlock(client, token="guess-guess-guess-guess")
    assert WRITE_COOKIE not in client.cookies
    assert "wrong token" in client.get("/?done=wrong+token").text
    assert 'id="actions"' not in client.get(PAGE).text
    client.cookies.set(WRITE_COOKIE, "forged")
    assert act(client, "pause").status_code == 403  # type: ignore[attr-defined]
    assert not seeded.get("reports", "digest").paused  # type: ignore[union-attr]


def test_the_host_apps_auth_decides_writes_and_csrf_still_applies(seeded: Repeat) -> None:
    def staff(request: Request) -> bool:  # e.g. request.user.is_staff behind the host's auth
        return request.headers.get("x-staff") == "yes"

    host = Starlette(routes=[Mount("/admin/emq", app=app(seeded, can_write=staff))])
    with TestClient(host, headers={"x-staff": "yes"}) as client:
        page = client.get("/admin/emq/schedule?queue=reports&name=digest").text
        assert 'id="actions"' in page and "Unlock" not in page
        # Session 34 (web security probe): a Lock button that could not lock (the hook's
        # say, not an unlock cookie: the page still said "writes allowed" after it).
        assert ">Lock<" not in page
        csrf = csrf_of(page)
        form = {"queue": "reports", "name": "digest", "action": "pause"}
        assert client.post("/admin/emq/schedule", data=form).status_code == 403
        reply = client.post(
            "/admin/emq/schedule", data={**form, "csrf": csrf}, follow_redirects=False
        )
        assert reply.headers["location"].startswith("/admin/emq/schedule?")
        assert seeded.get("reports", "digest").paused  # type: ignore[union-attr]
    with TestClient(host) as outsider:
        page = outsider.get("/admin/emq/schedule?queue=reports&name=digest").text
        assert 'id="actions"' not in page
        # Session 34: no unlock form where no token is configured (it could only say "wrong
        # token"), so no form at all; a CSRF pair is anyone's for the asking.
        assert "Unlock" not in page and 'name="csrf"' not in page
        csrf = outsider.get("/admin/emq/api/csrf").json()["csrf"]
        form = {"queue": "reports", "name": "digest", "action": "resume", "csrf": csrf}
        assert outsider.post("/admin/emq/schedule", data=form).status_code == 403
    assert seeded.get("reports", "digest").paused  # type: ignore[union-attr]


def _writes(seeded: Repeat, can_write: WriteCheck, headers: dict[str, str]) -> int:
    """The status of a pause posted through a host app with `can_write` (CSRF given)."""
    host = Starlette(routes=[Mount("/admin/emq", app=app(seeded, can_write=can_write))])
    with TestClient(host, headers=headers) as client:
        page = client.get("/admin/emq/schedule?queue=reports&name=digest")
        assert page.status_code == 200, page.text
        csrf = client.get("/admin/emq/api/csrf").json()["csrf"]
        form = {"queue": "reports", "name": "digest", "action": "pause", "csrf": csrf}
        return client.post("/admin/emq/schedule", data=form, follow_redirects=False).status_code


def test_an_async_or_blocking_host_check_is_awaited_or_run_off_the_event_loop(
    seeded: Repeat,
) -> None:
    # Session 33 (a probe of the view mounted beside Django): an `async def can_write` was
    # called and not awaited, and its coroutine read as true, so any caller could write; a
    # plain one ran on the event loop, where Django refuses its ORM (a session read):
    # every page failed with a 500.
    async def staff(request: Request) -> bool:
        return request.headers.get("x-staff") == "yes"

    assert _writes(seeded, staff, {}) == 403
    assert not seeded.get("reports", "digest").paused  # type: ignore[union-attr]

    def wrapped(request: Request) -> Awaitable[bool]:  # what asgiref's sync_to_async gives
        return staff(request)

    assert _writes(seeded, wrapped, {}) == 403
    assert not seeded.get("reports", "digest").paused  # type: ignore[union-attr]

    def blocking(request: Request) -> bool:  # as Django's ORM, refused on a running loop
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return request.headers.get("x-staff") == "yes"
        raise RuntimeError("You cannot call this from an async context")

    assert _writes(seeded, blocking, {"x-staff": "yes"}) == 303
    assert seeded.get("reports", "digest").paused  # type: ignore[union-attr]


def test_locking_drops_the_write_cookie_and_pages_refuse_framing(
    seeded: Repeat, web: Client
) -> None:
    client = web(token=TOKEN)
    unlock(client)
    page = client.get("/")
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert CSRF_COOKIE in client.cookies
    client.post("/lock", data={"csrf": csrf_of(page.text)})
    assert WRITE_COOKIE not in client.cookies
    assert "read-only" in client.get("/").text


def test_a_short_token_is_refused_when_the_app_is_made() -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        app(Repeat.__new__(Repeat), token="short")


def test_cookies_holding_any_bytes_are_refused_not_a_server_error(
    seeded: Repeat, web: Client
) -> None:
    """A forged cookie may hold non-ASCII bytes (Starlette reads headers as Latin-1): the
    checks compare bytes, so the request is refused (403), never a 500."""
    client = web(token=TOKEN)
    form = {"queue": "reports", "name": "digest", "action": "pause", "csrf": "\xe9.\xe9"}
    forged = f"{WRITE_COOKIE}=\xe9\xe9; {CSRF_COOKIE}=\xe9.\xe9"
    reply = client.post("/schedule", data=form, headers={"cookie": forged.encode("latin-1")})
    assert reply.status_code == 403
    assert not seeded.get("reports", "digest").paused  # type: ignore[union-attr]


def test_the_unlock_form_drops_whitespace_around_the_token_as_the_bearer_header_does(
    seeded: Repeat, web: Client
) -> None:
    client = web(token=TOKEN)
    unlock(client, token=f"  {TOKEN}\n")  # pasted with a space and a line break
    assert WRITE_COOKIE in client.cookies
    assert 'id="actions"' in client.get(PAGE).text


def test_api_bodies_nested_too_deep_or_with_non_string_names_are_refused_with_400(
    seeded: Repeat, web: Client
) -> None:
    # Before: a deeply nested body was a 500 with a RecursionError traceback at every
    # request, read before the write check (so without the token too); a null or a list as
    # `queue` was looked up as the text "None" or "['reports']".
    client = web(token=TOKEN)
    before = snapshot(seeded)
    deep = "[" * 8_000 + "]" * 8_000  # within the body's 16 KiB, past the parser's depth
    anonymous = client.post(
        "/api/schedule/pause", content=deep, headers={"content-type": "application/json"}
    )
    assert anonymous.status_code == 403  # refused before its body is read
    bearer = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    reply = client.post("/api/schedule/pause", content=deep, headers=bearer)
    # Python 3.13's parser takes that depth: a list, which is no JSON object either.
    assert reply.status_code == 400
    assert reply.json()["error"] in (
        "the body is not JSON",
        "the body must be a JSON object of strings",
    ), reply.json()
    # Before: a body of any size was read (30 MB with the token: 200); now one past 16 KiB
    # is refused before it is read, as a form is.
    huge = json.dumps({"queue": "reports", "name": "digest", "pad": "x" * 20_000})
    reply = client.post("/api/schedule/pause", content=huge, headers=bearer)
    assert reply.status_code == 413 and "16384 bytes" in reply.json()["error"]
    for queue in (None, ["reports"], 5):
        body = {"queue": queue, "name": "digest"}
        refused = client.post("/api/schedule/pause", json=body, headers=bearer)
        assert refused.status_code == 400 and "queue must be a string" in refused.json()["error"]
    # Before: a body that is not an object was taken as {} and a value that is not a string
    # was left out, so the change was made from the query's queue and name (200).
    query = {"queue": "reports", "name": "digest"}
    for body in ([1, 2], None, "text", {"x": 1}, {**query, "extra": {"a": 1}}):
        sent = json.dumps(body)
        refused = client.post("/api/schedule/pause", params=query, content=sent, headers=bearer)
        assert refused.status_code == 400, body
        error = refused.json()["error"]
        assert "JSON object of strings" in error or "must be a string" in error
    assert snapshot(seeded) == before


def test_an_unlock_expires_and_a_copy_kept_past_lock_is_refused_after_that(
    seeded: Repeat, web: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unlock cookie was the same HMAC for as long as the process lived: a copy of it
    (kept past *Lock*, or stolen) wrote until a restart. Now the time it was issued is signed
    in it and it lasts `UNLOCK_MAX_AGE_S`, as the cookie's own Max-Age says."""
    issued = 1_900_000_000.0
    monkeypatch.setattr(auth, "_now", lambda: issued, raising=False)
    client = web(token=TOKEN)
    unlock(client)
    copy = client.cookies.get(WRITE_COOKIE)
    assert copy is not None and TOKEN not in copy
    client.post("/lock", data={"csrf": csrf_of(client.get("/").text)})
    assert WRITE_COOKIE not in client.cookies
    client.cookies.set(WRITE_COOKIE, copy)  # the copy, still within its time: it writes
    assert act(client, "pause").status_code == 303  # type: ignore[attr-defined]
    assert seeded.get("reports", "digest").paused  # type: ignore[union-attr]
    monkeypatch.setattr(auth, "_now", lambda: issued + TWELVE_HOURS_S + 1, raising=False)
    assert act(client, "resume").status_code == 403  # type: ignore[attr-defined]
    assert seeded.get("reports", "digest").paused  # type: ignore[union-attr]
    assert 'id="actions"' not in client.get(PAGE).text  # read-only again
    client.cookies.set(WRITE_COOKIE, f"{int(issued) + 10**6}.{copy.partition('.')[2]}")
    assert act(client, "resume").status_code == 403  # type: ignore[attr-defined]
    unlock(client)  # unlocking again gives a fresh one
    assert act(client, "resume").status_code == 303  # type: ignore[attr-defined]
    assert not seeded.get("reports", "digest").paused  # type: ignore[union-attr]


def test_the_unlock_cookie_says_how_long_it_lasts(seeded: Repeat, web: Client) -> None:
    assert auth.UNLOCK_MAX_AGE_S == TWELVE_HOURS_S  # what docs/web.md says
    client = web(token=TOKEN)
    page = client.get("/")
    reply = client.post(
        "/unlock", data={"token": TOKEN, "csrf": csrf_of(page.text)}, follow_redirects=False
    )
    (cookie,) = [
        v for k, v in reply.headers.multi_items() if k == "set-cookie" and WRITE_COOKIE in v
    ]
    assert f"Max-Age={auth.UNLOCK_MAX_AGE_S}" in cookie and "HttpOnly" in cookie
