"""The web view in a real browser: Debian's chromium, driven by Selenium through
chromedriver, against a real `emq-bridge web` process and a real `emq-bridge pump` process on
the test server, with a worker thread reporting each occurrence it takes off the pump's list.

It filters and pages the table, opens a schedule, sees it fire and its outcome appear,
unlocks with the token, pauses it (and `emq-bridge show` agrees), resumes it, triggers it
and sees the triggered run succeed, and finds the pump on the pumps page.

Set `EMQ_BRIDGE_SCREENSHOTS=docs` to write the table's and the schedule page's screenshots
(docs/web-table.png, docs/web-schedule.png) while it runs.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from web_client import TOKEN

from emq_bridge import Repeat, define

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
WAIT_S = 15.0

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


def _missing() -> list[str]:
    return [path for path in (CHROMIUM, CHROMEDRIVER) if shutil.which(path) is None]


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    missing = _missing()
    if missing:
        message = f"no {', '.join(missing)}: apt-get install chromium chromium-driver"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: the browser test must run)")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI containers run as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(redis_url: str, prefix: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "--prefix", prefix, *args]


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.1)


def wait_until_served(web: subprocess.Popen[bytes], base: str, log: Path) -> None:
    """Wait until `emq-bridge web` (the process `web`) answers at `base`."""

    def up() -> bool:
        assert web.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(base + "/api/schedules?limit=1", timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    wait_for(up, "emq-bridge web to answer")


@pytest.fixture
def served(repeat: Repeat, redis_url: str, tmp_path: Path) -> Iterator[str]:
    """Seed the registry, start `emq-bridge web` and `emq-bridge pump`, and a worker thread
    that reports each occurrence the pump pushes; yield the view's base URL."""
    now = repeat.server_time_ms()
    for i in range(60):
        template = {"task": "sync.job", "args": [i]}
        if i % 3 == 0:
            definition = define(cron=f"{i} 9 * * 1-5", tz="Europe/Paris", template=template)
        else:
            definition = define(every=f"{5 * (i % 6 + 1)}m", template=template)
        source = "app" if i % 4 else None
        repeat.upsert("sync", f"job-{i:02d}", definition=definition, source=source, now_ms=now)
    repeat.pause("sync", "job-07")
    repeat.upsert("reports", "tick", every="2s", template={"task": "reports.tick"})
    repeat.upsert("reports", "nightly", cron="0 9 * * *", tz="Europe/Paris", template={"task": "n"})
    port, out = free_port(), f"{repeat.prefix}:out"
    logs = (tmp_path / "web.log").open("w"), (tmp_path / "pump.log").open("w")
    env = {**os.environ, "EMQ_BRIDGE_WEB_TOKEN": TOKEN}
    web = subprocess.Popen(
        command(redis_url, repeat.prefix, "web", "--bind", f"127.0.0.1:{port}"),
        stdout=logs[0],
        stderr=subprocess.STDOUT,
        env=env,
    )
    pump = subprocess.Popen(
        command(
            redis_url, repeat.prefix, "pump", "reports", "--list-key", out, "--max-sleep", "0.2"
        ),
        stdout=logs[1],
        stderr=subprocess.STDOUT,
    )
    stop = threading.Event()

    def work() -> None:  # a worker: takes each occurrence, runs it for 50 ms, reports
        while not stop.is_set():
            popped = repeat.client.blpop([out], timeout=0.2)
            if popped is None:
                continue
            message = json.loads(popped[1])
            repeat.started(message)
            time.sleep(0.05)
            repeat.finished(message, ok=True)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_served(web, base, tmp_path / "web.log")
        yield base
    finally:
        stop.set()
        for process in (web, pump):
            process.terminate()
        for process in (web, pump):
            process.wait(timeout=10)
        worker.join(timeout=5)
        for log in logs:
            log.close()


def rows(browser: WebDriver, table: str = "schedules") -> list[list[str]]:
    found = []
    for row in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr"):
        found.append([cell.text for cell in row.find_elements(By.TAG_NAME, "td")])
    return found


def text_of(browser: WebDriver, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def history(browser: WebDriver) -> list[list[str]]:
    return [row for row in rows(browser, "history") if len(row) == 7]


def click(browser: WebDriver, by: str, value: str) -> None:
    """Click what loads a new page, and wait for that page (a form's submit, a link).

    The old document is marked; the new one has no mark and has loaded. (Waiting for the
    old element to go stale instead trips over chromium's "node does not belong to the
    document" while the page changes.)"""
    browser.execute_script("window.emqOldPage = true")
    browser.find_element(by, value).click()
    WebDriverWait(browser, WAIT_S, ignored_exceptions=[WebDriverException]).until(
        lambda b: b.execute_script(
            "return window.emqOldPage === undefined && document.readyState === 'complete'"
        )
    )


def shoot(browser: WebDriver, name: str) -> None:
    folder = os.environ.get("EMQ_BRIDGE_SCREENSHOTS")
    if folder:
        browser.save_screenshot(str(Path(folder) / name))


@pytest.mark.slow
def test_filter_page_open_see_it_fire_pause_resume_and_trigger_from_the_browser(
    browser: WebDriver, served: str, repeat: Repeat, redis_url: str
) -> None:
    browser.get(served + "/")
    assert len(rows(browser)) == 50
    assert text_of(browser, "#position") == "1-50 of 62"
    assert text_of(browser, "#mode") == "read-only"

    Select(browser.find_element(By.ID, "filter-queue")).select_by_visible_text("sync")
    click(browser, By.ID, "apply")
    first = rows(browser)
    assert {row[0] for row in first} == {"sync"} and len(first) == 50
    click(browser, By.ID, "next")
    assert text_of(browser, "#position") == "51-60 of 60"
    second = rows(browser)
    assert sorted(row[1] for row in first + second) == [f"job-{i:02d}" for i in range(60)]
    assert second[-1][1] == "job-07" and second[-1][5] == "paused"  # paused last

    Select(browser.find_element(By.ID, "filter-queue")).select_by_visible_text("all queues")
    browser.find_element(By.ID, "filter-q").send_keys("tick")
    click(browser, By.ID, "apply")
    [row] = rows(browser)
    assert row[:3] == ["reports", "tick", "every 2s"]
    click(browser, By.LINK_TEXT, "tick")
    assert text_of(browser, "#schedule-title").startswith("reports/tick")

    def fired_and_reported() -> bool:
        # The page as loaded: its last status is the newest occurrence's (every 2 s, the
        # next one may be running already), so wait for a load that shows a success there.
        browser.refresh()
        return text_of(browser, "#last-status").startswith("succeeded") and any(
            r[1] == "succeeded" for r in history(browser)
        )

    wait_for(fired_and_reported, "an occurrence of reports/tick to succeed")
    shoot(browser, "web-schedule.png")

    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    click(browser, By.XPATH, "//button[text()='Unlock']")
    assert text_of(browser, "#mode") == "writes allowed"
    browser.back()
    browser.refresh()
    click(browser, By.ID, "action-pause")
    assert text_of(browser, "#notice") == "paused"
    assert text_of(browser, "#state") == "paused"
    shown = subprocess.run(
        command(redis_url, repeat.prefix, "show", "reports", "tick"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "  state     paused" in shown

    click(browser, By.ID, "action-resume")
    assert text_of(browser, "#notice") == "resumed"
    assert not repeat.get("reports", "tick").paused  # type: ignore[union-attr]

    click(browser, By.ID, "action-trigger")
    assert text_of(browser, "#notice").startswith("triggered")

    def triggered_run_succeeded() -> bool:
        browser.refresh()
        return any(r[1] == "succeeded" and "triggered" in r[5] for r in history(browser))

    wait_for(triggered_run_succeeded, "the triggered occurrence to succeed")

    click(browser, By.LINK_TEXT, "Pumps")
    [pump] = rows(browser, "pumps")
    assert pump[3:5] == ["pump", "reports"]
    assert "No live pump serves: sync" in browser.page_source
    browser.get(served + "/")
    shoot(browser, "web-table.png")


@pytest.fixture
def long_names(repeat: Repeat, redis_url: str, tmp_path: Path) -> Iterator[str]:
    """`emq-bridge web` on a registry whose names (and owner) are as long as the rules allow,
    without a break; yield its base URL."""
    repeat.upsert("q", "n" * 200, every="1h", template={"task": "t"}, source="s" * 200)
    repeat.upsert("q", "short", every="2h", template={"task": "t"})
    port = free_port()
    with (tmp_path / "web.log").open("w") as log:
        env = {k: v for k, v in os.environ.items() if k != "EMQ_BRIDGE_WEB_TOKEN"}
        web = subprocess.Popen(
            command(redis_url, repeat.prefix, "web", "--bind", f"127.0.0.1:{port}"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_served(web, base, tmp_path / "web.log")
            yield base
        finally:
            web.terminate()
            web.wait(timeout=10)


@pytest.mark.slow
def test_a_200_character_name_wraps_and_leaves_every_column_on_screen(
    browser: WebDriver, long_names: str
) -> None:
    browser.set_window_size(1400, 1000)
    try:
        browser.get(long_names + "/")
        width = browser.execute_script("return document.documentElement.clientWidth")
        for row in browser.find_elements(By.CSS_SELECTOR, "#schedules tbody tr"):
            cells = row.find_elements(By.TAG_NAME, "td")
            assert cells[2].text.startswith("every "), [c.text for c in cells]
            for cell in cells:  # the cadence, the next run and every column after them
                right = browser.execute_script(
                    "return arguments[0].getBoundingClientRect().right", cell
                )
                assert right <= width, (cell.text[:40], right, width)
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )
        click(browser, By.CSS_SELECTOR, "a.schedule-link")  # the long one sorts first
        title = browser.find_element(By.ID, "schedule-title")
        assert title.text.startswith("q/nnnn")
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )
    finally:
        browser.set_window_size(1280, 1000)


class _SameHostAttacker(http.server.BaseHTTPRequestHandler):
    """A page on another port of the view's host (the same *site*): it plants a CSRF pair it
    fetched from the view, as anyone can, in the browser (cookies are kept by host, not by
    port), then makes the browser post a pause with that pair, straight to the view or bounced
    through its own 307 (which makes the post's `Origin` `null`)."""

    view = ""  # the view's base URL, set by the test

    def do_GET(self) -> None:
        with urllib.request.urlopen(self.view + "/api/csrf", timeout=5) as reply:
            pair = reply.headers["set-cookie"].split(";")[0]  # emq_bridge_csrf_<port>=<pair>
        target = "/bounce" if self.path.startswith("/bounce") else self.view + "/schedule"
        page = (
            f'<form id="f" method="post" action="{target}">'
            '<input name="queue" value="reports"><input name="name" value="tick">'
            '<input name="action" value="pause">'
            f'<input name="csrf" value="{pair.split("=", 1)[1]}"></form>'
            "<script>document.getElementById('f').submit()</script>"
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Set-Cookie", f"{pair}; Path=/; SameSite=Lax")
        self.end_headers()
        self.wfile.write(page.encode())

    def do_POST(self) -> None:
        self.send_response(307)
        self.send_header("Location", self.view + "/schedule")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.mark.slow
def test_a_page_on_another_port_of_the_host_cannot_change_a_schedule_through_an_unlocked_browser(
    browser: WebDriver, served: str, repeat: Repeat
) -> None:
    # Session 34 (web security probe): the double submit alone let such a page pause or
    # remove schedules (a planted pair; `Origin: null` after its 307 was waved through).
    browser.get(served + "/")
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    click(browser, By.XPATH, "//button[text()='Unlock']")
    assert text_of(browser, "#mode") == "writes allowed"
    handler = type("Attacker", (_SameHostAttacker,), {"view": served})
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    try:
        for path in ("/direct", "/bounce"):
            browser.get(f"http://127.0.0.1:{attacker.server_address[1]}{path}")
            wait_for(
                lambda: "is refused" in browser.page_source or "done=" in browser.current_url,
                f"the view's answer ({path})",
            )
            assert not repeat.get("reports", "tick").paused, path  # type: ignore[union-attr]
            assert "a change from another origin" in browser.page_source
    finally:
        attacker.shutdown()
        attacker.server_close()
    browser.get(served + "/schedule?queue=reports&name=tick")  # the view's own form still works
    click(browser, By.ID, "action-pause")
    wait_for(lambda: repeat.get("reports", "tick").paused, "the view's own pause")  # type: ignore[union-attr]
