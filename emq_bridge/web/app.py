"""The web view: a Starlette app of server-rendered pages and the JSON API behind them.

Every read goes through `Repeat`'s reads (`pages.py`), every change through its moves
(`pause`, `resume`, `trigger`, `cancel`), run in Starlette's thread pool since redis-py is
blocking. No Redis command is written here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from ..cli.render import (
    absolute,
    cadence_text,
    duration_text,
    last_error_text,
    next_run_text,
    registration_json,
    relative,
    state,
    state_text,
    status_text,
    upcoming,
    utc_iso,
    zone_of,
)
from ..errors import (
    CorruptRecord,
    EmqError,
    RegistryError,
    RegistryOutOfMemory,
    RegistryUnavailable,
    UnknownRegistration,
)
from ..health import served, unserved
from ..registry import Registration, Repeat
from .auth import Guard, WriteCheck
from .pages import (
    PAGE_SIZE,
    STATES,
    BadQuery,
    Filters,
    Page,
    QueueList,
    TimelineCache,
    read_page,
    schedule_json,
)

__all__ = ["ACTIONS", "app"]

ACTIONS = ("pause", "resume", "trigger", "remove")
NEXT_RUNS = 10
HISTORY_ROWS = 50
# A parked schedule's reason on its own page: whole (the table cuts it to 48 characters).
MAX_REASON_CHARS = 10_000

_DONE = {
    "pause": "paused",
    "resume": "resumed",
    "trigger": "triggered: a running pump sends it on its next tick",
    "remove": "removed",
}
_UNCHANGED = {"pause": "was already paused", "resume": "was not paused"}
# The JSON API's answers (a CSRF token among them) are no more cached or sniffed than pages.
API_HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}
_NOTICES = frozenset([*_DONE.values(), *_UNCHANGED.values(), "wrong token"])
# The largest form this app takes (its forms hold a few short fields): a bigger body is
# refused before it is read, so a caller, allowed to write or not, cannot make it hold much.
FORM_MAX_BYTES = 16 * 1024
# No script runs in these pages, no other site may frame them (the action buttons), and
# forms post only here.
SECURITY_HEADERS = {
    "cache-control": "no-store",
    "content-security-policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
}


class _View:
    """The state an app's endpoints share: the registry, the guard, the templates."""

    def __init__(self, repeat: Repeat, guard: Guard, title: str) -> None:
        self.repeat, self.guard, self.title = repeat, guard, title
        self.queues = QueueList(repeat)
        self.timeline = TimelineCache(repeat, self.queues)
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("emq_bridge.web", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates = Jinja2Templates(env=env)

    async def render(
        self, request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> Response:
        may_write = await self.guard.may_write(request)
        page = {
            "title": self.title,
            "prefix": self.repeat.prefix,
            "may_write": may_write,
            # Unlock only where a token can (a `can_write` hook alone has no form to fill),
            # lock only what an unlock opened (the hook's say is not the page's to undo).
            "can_unlock": self.guard.has_token and not may_write,
            "can_lock": self.guard.unlocked(request),
            "csrf": self.guard.csrf_token(request),
            "link": lambda route, **query: _link(request, route, query),
            "done": None,
            **context,
        }
        response = self.templates.TemplateResponse(request, name, page, status_code=status_code)
        self.guard.remember_csrf(request, response)
        response.headers.update(SECURITY_HEADERS)
        return response


def _link(request: Request, route: str, query: Mapping[str, Any]) -> str:
    """Return the path of `route` (mount-aware) with `query`, empty values left out."""
    pairs = {k: v for k, v in query.items() if v not in (None, "")}
    path = str(request.url_for(route).path)
    return path + ("?" + urlencode(pairs) if pairs else "")


def _int(query: Mapping[str, str], key: str, default: int) -> int:
    raw = query.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadQuery(f"{key} must be a whole number, not {raw!r}") from None


def _row(registration: Registration, now_ms: int, pumped: set[str]) -> dict[str, Any]:
    """A table row; `unserved` (as `list` flags it): overdue, and no live pump serves it."""
    return {
        "queue": registration.queue,
        "name": registration.name,
        "cadence": cadence_text(registration),
        "next_run": next_run_text(registration, now_ms),
        "unserved": unserved(registration, now_ms, pumped),
        "last_status": status_text(registration),
        "status_class": registration.last_status or "none",
        "state": state(registration),
        "state_text": state_text(registration, 48),  # the table's, cut
        "state_full": state_text(registration, MAX_REASON_CHARS),  # the schedule page's
        "owner": registration.source or "(runtime)",
        "labels": ", ".join(f"{k}={v}" for k, v in sorted(registration.definition.labels.items())),
    }


def _page_json(page: Page, now_ms: int, pumped: set[str]) -> dict[str, Any]:
    return {
        "now_ms": now_ms,
        "start": page.start,
        "limit": page.limit,
        "total": page.total,
        "next_start": page.next_start,
        "previous_start": page.previous_start,
        "examined": page.examined,
        "budget_spent": page.budget_spent,
        "items": [_item_json(r, now_ms, pumped) for r in page.registrations],
    }


def _item_json(registration: Registration, now_ms: int, pumped: set[str]) -> dict[str, Any]:
    """`list --json`'s item: `show --json`'s data and the `unserved` flag."""
    return {
        **registration_json(registration, now_ms),
        "unserved": unserved(registration, now_ms, pumped),
    }


def _schedule_view(registration: Registration, now_ms: int, pumped: set[str]) -> dict[str, Any]:
    """What the schedule page shows beside `show --json`'s data: times in words."""
    zone = zone_of(registration.definition.cadence)

    def when(ms: int | None) -> str:
        return "-" if ms is None else f"{absolute(ms, zone)} ({relative(ms, now_ms)})"

    return {
        "row": _row(registration, now_ms, pumped),
        "zone": str(zone),
        "when": when,
        "runs": [
            (absolute(ms, zone), relative(ms, now_ms)) for ms in upcoming(registration, NEXT_RUNS)
        ],
        "last_fired": when(registration.last_fired_ms),
        "last_success": when(registration.last_success_ms),
        "last_duration": duration_text(registration.last_duration_ms),
        "parked_since": when(registration.parked_ms),
        "paused_since": when(registration.paused_ms),
        "last_error": last_error_text(registration),
    }


def app(
    repeat: Repeat,
    *,
    token: str | None = None,
    can_write: WriteCheck | None = None,
    secret: bytes | None = None,
    title: str = "emq-bridge",
    debug: bool = False,
) -> Starlette:
    """Return the web view of `repeat`'s registry as an ASGI app (Starlette).

    Mount it in any ASGI host: `Mount("/schedules", app=emq_bridge.web.app(repeat))` in
    Starlette, `fastapi_app.mount("/schedules", ...)` in FastAPI, or a path router in front
    of Django's ASGI handler. It is read-only unless `token` (at least 16 characters) or
    `can_write(request)` allows a request to pause, resume, trigger or remove; every change
    through a cookie needs the CSRF token the pages carry. `secret` signs the cookies:
    give the same one to every process serving the view (default: random per process).
    The pumps page lists the live pumps from their heartbeats (`Repeat.pumps`). Redis
    errors answer 503 in one line.
    """
    view = _View(repeat, Guard(token, can_write, secret), title)

    def now() -> int:
        return repeat.server_time_ms()

    def table_data(request: Request) -> tuple[Filters, Page, int, list[str], set[str]]:
        query = request.query_params
        filters = Filters.from_query(query)
        start, limit = _int(query, "start", 0), _int(query, "limit", PAGE_SIZE)
        queues = view.queues()
        page = read_page(repeat, queues, filters, start, limit)
        pumped = served(repeat, sorted({r.queue for r in page.registrations}))
        return filters, page, now(), queues, pumped

    async def index(request: Request) -> Response:
        filters, page, now_ms, queues, pumped = await run_in_threadpool(table_data, request)
        return await view.render(
            request,
            "index.html",
            {
                "filters": filters,
                "query": filters.query(),
                "page": page,
                "rows": [_row(r, now_ms, pumped) for r in page.registrations],
                "queues": queues,
                "states": STATES,
                "page_size": page.limit,
                "done": _notice(request, view.guard),
            },
        )

    async def api_schedules(request: Request) -> Response:
        _, page, now_ms, _, pumped = await run_in_threadpool(table_data, request)
        return _api_json(_page_json(page, now_ms, pumped))

    def find(request: Request) -> tuple[Registration, int]:
        queue = request.query_params.get("queue") or ""
        name = request.query_params.get("name") or ""
        if not queue or not name:
            raise BadQuery("queue and name are both required")
        try:  # `read`, not `get`: a corrupt record is said so (500), not "no registration"
            registration = repeat.read(queue, name)
        except UnknownRegistration:
            raise HTTPException(404, f"no registration {name!r} in queue {queue!r}") from None
        return registration, now()

    def schedule_data(request: Request) -> dict[str, Any]:
        registration, now_ms = find(request)
        key = (registration.queue, registration.name)
        return {
            "registration": registration,
            "now_ms": now_ms,
            "runs_ms": upcoming(registration, NEXT_RUNS),
            "history": repeat.history(*key, HISTORY_ROWS),
            "pumped": served(repeat, [registration.queue]),
        }

    async def schedule(request: Request) -> Response:
        data = await run_in_threadpool(schedule_data, request)
        registration, now_ms = data["registration"], data["now_ms"]
        zone = zone_of(registration.definition.cadence)
        return await view.render(
            request,
            "schedule.html",
            {
                **data,
                **_schedule_view(registration, now_ms, data["pumped"]),
                "data": registration_json(registration, now_ms),
                # As `show` prints it: in its stored order (a reorder is a change), as text.
                "template_json": json.dumps(
                    dict(registration.definition.template), indent=2, ensure_ascii=False
                ),
                "history_rows": [
                    {
                        "due": absolute(entry.due_ms, zone),
                        "status": entry.status,
                        "attempt": entry.attempt,
                        "started": utc_iso(entry.started_ms),
                        "duration": duration_text(entry.duration_ms),
                        "redelivered": entry.redelivered,
                        "triggered": entry.triggered,
                        "error": entry.error or "",
                    }
                    for entry in data["history"]
                ],
                "done": _notice(request, view.guard),
            },
        )

    async def api_schedule(request: Request) -> Response:
        data = await run_in_threadpool(schedule_data, request)
        registration, now_ms = data["registration"], data["now_ms"]
        body = schedule_json(registration, now_ms, data["runs_ms"], data["history"])
        body["unserved"] = unserved(registration, now_ms, data["pumped"])
        return _api_json(body)

    def timeline_data(request: Request) -> dict[str, Any]:
        registration, _ = find(request)
        timeline = view.timeline()
        zone = zone_of(registration.definition.cadence)
        return {
            "timeline": timeline,
            "mine": timeline.share(registration),
            "labels": [(i, absolute(ms, zone)[11:16]) for i, ms in timeline.labels()],
            "zone": str(zone),
        }

    async def timeline_svg(request: Request) -> Response:
        data = await run_in_threadpool(timeline_data, request)
        response = view.templates.TemplateResponse(
            request, "timeline.svg", data, media_type="image/svg+xml"
        )
        response.headers.update(SECURITY_HEADERS)
        return response

    def act(action: str, queue: str, name: str) -> dict[str, Any]:
        if action not in ACTIONS:
            raise BadQuery(f"action must be one of {', '.join(ACTIONS)}, not {action!r}")
        if not queue or not name:
            raise BadQuery("queue and name are both required")
        result: dict[str, Any] = {"queue": queue, "name": name, "action": action}
        try:
            if action == "pause":
                result["changed"] = repeat.pause(queue, name)
            elif action == "resume":
                result["changed"] = repeat.resume(queue, name)
            elif action == "trigger":
                result["occurrence_id"], result["changed"] = repeat.trigger(queue, name), True
            elif not repeat.cancel(queue, name):
                raise UnknownRegistration(f"no registration {name!r} in queue {queue!r}")
            else:
                result["changed"] = True
                view.queues.forget()
        except KeyError as exc:
            raise HTTPException(
                404, str(exc.args[0]) if exc.args else "no such registration"
            ) from exc
        return result

    async def refuse_write(request: Request, csrf: str | None, *, csrf_later: bool = False) -> None:
        if not await view.guard.may_write(request):
            raise HTTPException(
                403, "read-only: writes need the token or the host app's permission"
            )
        if not csrf_later and not view.guard.bearer(request):
            refuse_csrf(request, csrf)

    def refuse_csrf(request: Request, csrf: str | None) -> None:
        refusal = view.guard.csrf_refusal(request, csrf)
        if refusal is not None:
            raise HTTPException(403, refusal)

    async def action(request: Request) -> Response:
        await refuse_write(request, None, csrf_later=True)  # before the body is read
        form = await _small_form(request)
        fields = {
            key: str(form.get(key) or "") for key in ("queue", "name", "action", "csrf", "confirm")
        }
        await refuse_write(request, fields["csrf"] or None)
        if fields["action"] == "remove" and fields["confirm"] != "yes":
            raise BadQuery("tick the box to confirm the removal")
        result = await run_in_threadpool(act, fields["action"], fields["queue"], fields["name"])
        verb = fields["action"]
        done = _DONE[verb] if result["changed"] else _UNCHANGED.get(verb, _DONE[verb])
        if verb == "remove":
            notice = f"{fields['queue']}/{fields['name']} {done}"
            signed = {"done": notice, "sig": view.guard.sign_notice(notice)}
            target = _link(request, "index", signed)
        else:
            target = _link(
                request,
                "schedule",
                {"queue": fields["queue"], "name": fields["name"], "done": done},
            )
        return RedirectResponse(target, status_code=303)

    async def api_action(request: Request) -> Response:
        await refuse_write(request, None)  # before the body is read: a refused caller costs nothing
        body: dict[str, Any] = {}
        if request.headers.get("content-type", "").startswith("application/json"):
            _check_length(request, "a JSON body")
            try:
                loaded = await request.json()
            except (ValueError, RecursionError):  # (nested past the parser's depth)
                raise BadQuery("the body is not JSON") from None
            if not isinstance(loaded, dict):
                raise BadQuery("the body must be a JSON object of strings")
            body = loaded
        for key, value in body.items():
            if not isinstance(value, str):
                named = key if key in ("queue", "name") else "every value of the body"
                raise BadQuery(f"{named} must be a string")
        query = {**request.query_params, **body}
        verb = request.path_params["action"]
        result = await run_in_threadpool(act, verb, query.get("queue", ""), query.get("name", ""))
        return _api_json(result)

    async def unlock(request: Request) -> Response:
        form = await _small_form(request)
        refuse_csrf(request, str(form.get("csrf") or "") or None)
        back = _link(request, "index", {})
        if not view.guard.check_token(str(form.get("token") or "")):
            return RedirectResponse(_link(request, "index", {"done": "wrong token"}), 303)
        response = RedirectResponse(back, status_code=303)
        view.guard.unlock(request, response)
        return response

    async def lock(request: Request) -> Response:
        form = await _small_form(request)
        refuse_csrf(request, str(form.get("csrf") or "") or None)
        response = RedirectResponse(_link(request, "index", {}), status_code=303)
        view.guard.lock(request, response)
        return response

    def pump_rows() -> tuple[list[dict[str, Any]], list[str], int]:
        """The live pumps of the registry's queues (by id), and the queues none serves."""
        by_queue = repeat.pumps_by_queue(view.queues())
        live = {p.id: p.to_dict() for infos in by_queue.values() for p in infos}
        alone = [queue for queue, infos in by_queue.items() if not infos]
        return [live[key] for key in sorted(live)], alone, now()

    async def pumps_page(request: Request) -> Response:
        rows, alone, now_ms = await run_in_threadpool(pump_rows)
        return await view.render(
            request,
            "pumps.html",
            {
                "pumps": rows,
                "unserved_queues": alone,
                "since": lambda ms: "-" if ms is None else relative(int(ms), now_ms),
            },
        )

    async def api_pumps(request: Request) -> Response:
        rows, alone, now_ms = await run_in_threadpool(pump_rows)
        return _api_json({"now_ms": now_ms, "pumps": rows, "unserved_queues": alone})

    async def api_csrf(request: Request) -> Response:
        response = _api_json({"csrf": view.guard.csrf_token(request)})
        view.guard.remember_csrf(request, response)
        return response

    async def error(request: Request, exc: Exception) -> Response:
        status, reason = _status_of(exc)
        root = str(request.scope.get("root_path") or "")
        if request.url.path.removeprefix(root).startswith("/api/"):
            return _api_json({"error": reason}, status_code=status)
        return await view.render(
            request, "error.html", {"status": status, "reason": reason}, status
        )

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: error,
        BadQuery: error,
        EmqError: error,
    }
    routes = [
        Route("/", index, name="index"),
        Route("/schedule", schedule, name="schedule"),
        Route("/schedule", action, methods=["POST"], name="action"),
        Route("/timeline.svg", timeline_svg, name="timeline"),
        Route("/pumps", pumps_page, name="pumps"),
        Route("/unlock", unlock, methods=["POST"], name="unlock"),
        Route("/lock", lock, methods=["POST"], name="lock"),
        Route("/api/schedules", api_schedules, name="api_schedules"),
        Route("/api/schedule", api_schedule, name="api_schedule"),
        Route("/api/schedule/{action}", api_action, methods=["POST"], name="api_action"),
        Route("/api/pumps", api_pumps, name="api_pumps"),
        Route("/api/csrf", api_csrf, name="api_csrf"),
    ]
    return Starlette(debug=debug, routes=routes, exception_handlers=handlers)


def _status_of(exc: Exception) -> tuple[int, str]:
    """Return the HTTP status and the one-line reason of an error (never a URL or secret)."""
    if isinstance(exc, HTTPException):
        return exc.status_code, str(exc.detail)
    if isinstance(exc, RegistryOutOfMemory):  # it answers, and refuses writes
        return 503, "Redis is out of memory and refuses writes; try again once it has room"
    if isinstance(exc, RegistryUnavailable):
        return 503, "cannot reach Redis; try again"
    if isinstance(exc, CorruptRecord):  # edited by hand: no retry mends it
        return 500, " ".join(str(exc).split())
    if isinstance(exc, RegistryError):
        return 503, f"Redis refused: {' '.join(str(exc).split())}"
    return 400, " ".join(str(exc).split())


async def _small_form(request: Request) -> Any:
    """The request's form, refused (413, or 411 without a length) past `FORM_MAX_BYTES`
    before a byte of it is read."""
    _check_length(request, "a form")
    return await request.form(max_files=0, max_fields=16, max_part_size=FORM_MAX_BYTES)


def _check_length(request: Request, what: str) -> None:
    """Refuse a body past `FORM_MAX_BYTES` (413), or of no stated length (411), before a
    byte of it is read."""
    length = request.headers.get("content-length")
    if length is None or not length.isascii() or not length.isdigit():
        raise HTTPException(411, f"{what} needs its Content-Length")
    if int(length) > FORM_MAX_BYTES:
        raise HTTPException(413, f"{what} of this app is at most {FORM_MAX_BYTES} bytes")


def _notice(request: Request, guard: Guard) -> str | None:
    """The outcome a change redirected with (`?done=`): one of this app's own texts, or a
    removal's "<queue>/<name> removed" signed by this app (`sig`): a link cannot bring text
    of its own (names may hold letters that read as spaces)."""
    done = request.query_params.get("done")
    if done is None or done in _NOTICES:
        return done
    if guard.notice_signed(done, request.query_params.get("sig") or ""):
        return done
    return None


def _api_json(content: Any, status_code: int = 200) -> JSONResponse:
    """A JSON API answer, with `API_HEADERS`."""
    return JSONResponse(content, status_code=status_code, headers=API_HEADERS)
