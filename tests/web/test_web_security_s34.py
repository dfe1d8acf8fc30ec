"""What a probe of the web view's security found (session 34), each fixed:

- a page on another port of the same host (the same *site*) could change schedules through
  an unlocked browser: it planted a CSRF pair of its own (cookies are kept by host, not by
  port) and bounced its post through a 307, whose `Origin: null` was waved through. Changes
  now follow the browser's `Sec-Fetch-Site` (only `same-origin`, or `none`), and without it
  an `Origin` of another host or `null` is refused; the real-browser attack is in
  test_web_browser.py;
- behind a proxy that rewrites `Host`, every browser change was refused (its `Origin` named
  the public host): a browser's `Sec-Fetch-Site: same-origin` now says what it must;
- two views on two ports of one host overwrote each other's cookies: their names carry the port;
- a `can_write` that raises failed every page with a 500: it now says no (read-only);
- the timeline and the queue list were read once per concurrent request at their expiry;
- a long `label` filter of many commas took quadratic time to cut.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient
from web_client import TOKEN, Client

from emq_bridge import Repeat
from emq_bridge.web import app
from emq_bridge.web.pages import QueueList, TimelineCache, label_pairs

PAUSE = {"queue": "reports", "name": "digest", "action": "pause"}


def _seeded(repeat: Repeat) -> Repeat:
    repeat.upsert("reports", "digest", every="15m", template={"task": "d"})
    return repeat


def _unlocked(client: TestClient) -> str:
    csrf = str(client.get("/api/csrf").json()["csrf"])
    form = {"csrf": csrf, "token": TOKEN}
    assert client.post("/unlock", data=form, follow_redirects=False).status_code == 303
    return csrf


def _post(client: TestClient, csrf: str, headers: dict[str, str]) -> int:
    reply = client.post(
        "/schedule", data={**PAUSE, "csrf": csrf}, headers=headers, follow_redirects=False
    )
    return int(reply.status_code)


def test_a_change_is_judged_by_the_browsers_fetch_site_then_by_origin(
    repeat: Repeat, web: Client
) -> None:
    _seeded(repeat)
    client = web(token=TOKEN)
    csrf = _unlocked(client)
    for refused in (
        {"sec-fetch-site": "same-site"},  # another port of the host, a sibling subdomain
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site", "origin": "http://emq.test"},  # the browser decides
        {"origin": "null"},  # after a cross-origin redirect
        {"origin": "http://emq.test:8001"},
    ):
        assert _post(client, csrf, refused) == 403, refused
        assert not repeat.get("reports", "digest").paused  # type: ignore[union-attr]
    # Behind a proxy that sends its own Host: the browser says same-origin, which stands.
    behind = {"sec-fetch-site": "same-origin", "origin": "https://ops.example.com"}
    assert _post(client, csrf, behind) == 303
    assert repeat.get("reports", "digest").paused  # type: ignore[union-attr]
    repeat.resume("reports", "digest")
    assert _post(client, csrf, {"origin": "http://emq.test"}) == 303  # an older browser
    repeat.resume("reports", "digest")
    assert _post(client, csrf, {}) == 303  # no browser: the CSRF pair is what counts


def test_views_on_two_ports_of_one_host_keep_their_own_cookies(repeat: Repeat) -> None:
    _seeded(repeat)
    view = app(repeat, token=TOKEN)
    with TestClient(view, base_url="http://127.0.0.1:8000") as first:
        csrf = _unlocked(first)
        assert {"emq_bridge_csrf_8000", "emq_bridge_write_8000"} <= set(first.cookies.keys())
        # The other view, on :8001, in the same browser: cookies are kept by host.
        other = first.get("http://127.0.0.1:8001/api/csrf")
        assert other.status_code == 200
        assert "emq_bridge_csrf_8001" in other.headers["set-cookie"]
        first.cookies.set("emq_bridge_csrf_8001", other.json()["csrf"], domain="127.0.0.1")
        assert _post(first, csrf, {}) == 303  # the first view's pair is still its own
    assert repeat.get("reports", "digest").paused  # type: ignore[union-attr]


def test_a_can_write_that_raises_leaves_the_pages_readable_and_writes_refused(
    repeat: Repeat,
) -> None:
    _seeded(repeat)

    def broken(request: Request) -> bool:
        raise RuntimeError("session store down: redis://user:secret@db")

    host = Starlette(routes=[Mount("/admin/emq", app=app(repeat, can_write=broken))])
    with TestClient(host) as client:
        for page in ("/admin/emq/", "/admin/emq/schedule?queue=reports&name=digest"):
            reply = client.get(page)
            assert reply.status_code == 200 and "read-only" in reply.text, page
            assert "secret" not in reply.text
        csrf = client.get("/admin/emq/api/csrf").json()["csrf"]
        refused = client.post("/admin/emq/schedule", data={**PAUSE, "csrf": csrf})
        assert refused.status_code == 403
    assert not repeat.get("reports", "digest").paused  # type: ignore[union-attr]


class _SlowRepeat:
    """Stands in for `Repeat` in the caches: counts and slows the reads they make."""

    def __init__(self, repeat: Repeat) -> None:
        self.repeat, self.reads = repeat, 0

    def queues(self) -> list[str]:
        self.reads += 1
        time.sleep(0.2)
        return ["reports"]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.repeat, name)


def _at_once(call: Any, n: int = 12) -> list[Any]:
    results: list[Any] = [None] * n

    def one(i: int) -> None:
        results[i] = call()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_the_queue_list_and_the_timeline_are_read_once_by_concurrent_requests(
    repeat: Repeat,
) -> None:
    _seeded(repeat)
    slow = _SlowRepeat(repeat)
    clock = [0.0]
    queues = QueueList(slow, ttl_s=5.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    assert _at_once(queues) == [["reports"]] * 12 and slow.reads == 1  # before: 12
    clock[0] = 10.0
    assert _at_once(queues) == [["reports"]] * 12 and slow.reads == 2

    timeline = TimelineCache(repeat, queues, ttl_s=30.0, clock=lambda: clock[0])
    first = _at_once(timeline)
    assert slow.reads == 2 and all(t is first[0] for t in first)  # one read, all wait for it
    clock[0] = 50.0  # both expired: one request reads afresh, the others get the old picture
    started = time.monotonic()
    again = _at_once(timeline)
    assert slow.reads == 3
    assert sum(t is first[0] for t in again) == 11 and time.monotonic() - started < 1.0


def test_a_long_label_filter_is_cut_in_linear_time() -> None:
    value = "k=a" + ",x" * 500_000
    started = time.process_time()
    assert label_pairs([value]) == [value]
    assert time.process_time() - started < 2.0  # 0.06 s; before, 7.5 s (quadratic)
