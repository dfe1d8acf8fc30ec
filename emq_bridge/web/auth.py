"""Who may change schedules from the web view, and the CSRF check on every change.

Read-only unless writes are allowed, one of two ways:

- a token: `Authorization: Bearer <token>` on an API call, or the token typed once into the
  page's unlock form, which sets an HttpOnly cookie holding when it was issued and an HMAC of
  that time and the token (never the token), good for `UNLOCK_MAX_AGE_S`;
- the host application's own auth: `can_write(request)` returns True (Starlette's
  `request.user`, a Django session read through the ASGI scope, a header set by a proxy).

Every change made with a cookie (the unlock cookie, or the host's session) must carry the
CSRF token: the value of a signed random cookie, echoed in the form (`csrf`) or in the
`X-CSRF-Token` header (double submit). A bearer call needs none: browsers never add that
header by themselves. A change a browser did not make from the view's own origin is refused
too, as Go's `http.CrossOriginProtection` does: by its `Sec-Fetch-Site` (anything but
`same-origin` or `none`), or, from a browser that does not send it, by an `Origin` that names
another host or is `null` (what a browser sends after a cross-origin redirect). The double
submit alone cannot stop a page on another port of the same host (the same *site*, so a
`SameSite=Strict` cookie goes with its requests): cookies are not kept apart by port, so it
can plant a CSRF pair of its own in the browser.

Cookie names carry the port the request names (`emq_bridge_csrf_8001`), so views served on
two ports of one host (two SSH tunnels) keep their own cookies; a view mounted in a host app
keeps its own by its path.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

__all__ = [
    "CSRF_COOKIE",
    "UNLOCK_MAX_AGE_S",
    "WRITE_COOKIE",
    "Guard",
    "WriteCheck",
    "cookie_name",
]

WriteCheck = Callable[[Request], bool | Awaitable[bool]]
"""The host application's say on writes: True lets this request change schedules. A plain
function runs in a worker thread (it may block: a Django session read through the ORM); an
`async def` (or what returns an awaitable, `asgiref.sync.sync_to_async`) is awaited."""

log = logging.getLogger("emq_bridge.web")

CSRF_COOKIE = "emq_bridge_csrf"
WRITE_COOKIE = "emq_bridge_write"
# `Sec-Fetch-Site` values of a request the view's own page made (or the user typed).
SAME_ORIGIN_FETCH = frozenset({"same-origin", "none"})
CSRF_HEADER = "x-csrf-token"
# How long an unlock lasts: the cookie expires then, and a copy of it (a stolen cookie, or one
# kept past *Lock*) is refused after that too, since the time it was issued is signed in it.
UNLOCK_MAX_AGE_S = 12 * 3600


def _now() -> float:
    return time.time()


async def _host_allows(check: WriteCheck, request: Request) -> bool:
    """What the host's `can_write` says of `request`: an `async def` awaited, a plain function
    run in a worker thread (Django refuses its ORM on the event loop:
    `SynchronousOnlyOperation`, which failed every page), and what it returns awaited when
    it is awaitable (an unawaited coroutine is true: every caller could write)."""
    if inspect.iscoroutinefunction(check):
        said: object = await check(request)
    else:
        said = await run_in_threadpool(check, request)
    if inspect.isawaitable(said):
        said = await said
    return bool(said)


class Guard:
    """Decides writes and checks CSRF tokens for one app, with one signing secret."""

    def __init__(
        self, token: str | None, can_write: WriteCheck | None, secret: bytes | None
    ) -> None:
        if token is not None and len(token) < 16:
            raise ValueError("the write token must be at least 16 characters long")
        self._token = token
        self._can_write = can_write
        # A secret per process unless given: cookies then last as long as the process.
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    @property
    def writable(self) -> bool:
        """Whether any request could ever write (a token or a hook is configured)."""
        return self._token is not None or self._can_write is not None

    @property
    def has_token(self) -> bool:
        """Whether a write token is configured (the page's unlock form can work)."""
        return self._token is not None

    def _sign(self, value: str) -> str:
        return hmac.new(self._secret, value.encode(), hashlib.sha256).hexdigest()

    def _unlocked(self, issued: int) -> str:
        """The unlock cookie's value for one issued at `issued` (epoch s): that time and an
        HMAC of it and the token, so the token is never stored and the age is signed."""
        return f"{issued}.{self._sign(f'write:{issued}:{self._token}')}"

    def _unlock_valid(self, cookie: str) -> bool:
        """Whether `cookie` is an unlock this app issued less than `UNLOCK_MAX_AGE_S` ago."""
        issued, _, _ = cookie.partition(".")
        # Epoch seconds: a dozen digits at most (a longer string would not even parse).
        if self._token is None or not issued.isascii() or not issued.isdigit() or len(issued) > 12:
            return False
        age = _now() - int(issued)
        return -60 <= age <= UNLOCK_MAX_AGE_S and _same(cookie, self._unlocked(int(issued)))

    def bearer(self, request: Request) -> bool:
        """Whether the request carries the token in its Authorization header."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return (
            self._token is not None
            and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), self._token.encode())
        )

    def unlocked(self, request: Request) -> bool:
        """Whether the request carries a valid unlock cookie (the page's *Lock* undoes it)."""
        cookie = request.cookies.get(cookie_name(request, WRITE_COOKIE))
        return cookie is not None and self._unlock_valid(cookie)

    async def may_write(self, request: Request) -> bool:
        """Whether this request may change schedules (token, unlock cookie or host's auth).
        A host's `can_write` that raises says no (logged): pages stay readable."""
        if self.bearer(request) or self.unlocked(request):
            return True
        if self._can_write is None:
            return False
        try:
            return await _host_allows(self._can_write, request)
        except Exception as exc:  # the host's hook: read-only, never a failed page
            log.warning("emq-bridge web: can_write raised, read-only for this request: %r", exc)
            return False

    def check_token(self, given: str) -> bool:
        """Whether `given` is the write token (the unlock form), surrounding whitespace
        dropped as from a bearer header."""
        return self._token is not None and _same(given.strip(), self._token)

    def unlock(self, request: Request, response: Response) -> None:
        """Set the unlock cookie on `response` (after `check_token`), good for
        `UNLOCK_MAX_AGE_S`."""
        if self._token is not None:
            value = self._unlocked(int(_now()))
            _set_cookie(request, response, WRITE_COOKIE, value, max_age=UNLOCK_MAX_AGE_S)

    def lock(self, request: Request, response: Response) -> None:
        response.delete_cookie(cookie_name(request, WRITE_COOKIE), path=_path(request))

    def sign_notice(self, text: str) -> str:
        """The signature of a notice this app redirects with (`notice_signed` checks it)."""
        return self._sign("notice:" + text)[:32]

    def notice_signed(self, text: str, signature: str) -> bool:
        """Whether `signature` is this app's own for the notice `text`."""
        return _same(signature, self.sign_notice(text))

    # -- CSRF (double submit, the cookie signed) -------------------------------------------

    def csrf_token(self, request: Request) -> str:
        """Return this browser's CSRF token: its cookie's if valid, else a new one.

        A new one is kept in `request.state` for `remember_csrf` to set on the response.
        """
        cookie = request.cookies.get(cookie_name(request, CSRF_COOKIE))
        if cookie is not None and self._valid_csrf(cookie):
            return cookie
        fresh = getattr(request.state, "csrf_token", None)
        if fresh is None:
            nonce = secrets.token_urlsafe(24)
            fresh = f"{nonce}.{self._sign('csrf:' + nonce)}"
            request.state.csrf_token = fresh
        return str(fresh)

    def remember_csrf(self, request: Request, response: Response) -> None:
        """Set the CSRF cookie if `csrf_token` made a new one for this request."""
        fresh = getattr(request.state, "csrf_token", None)
        if fresh is not None:
            _set_cookie(request, response, CSRF_COOKIE, str(fresh))

    def _valid_csrf(self, value: str) -> bool:
        nonce, _, signature = value.rpartition(".")
        return bool(nonce) and _same(signature, self._sign("csrf:" + nonce))

    def csrf_refusal(self, request: Request, submitted: str | None) -> str | None:
        """Why a change is refused: a browser made it from another origin (`Sec-Fetch-Site`,
        else `Origin`), or it lacks this browser's CSRF token; None when it may go on."""
        refusal = _cross_origin(request)
        if refusal is not None:
            return refusal
        cookie = request.cookies.get(cookie_name(request, CSRF_COOKIE))
        given = submitted or request.headers.get(CSRF_HEADER)
        if (
            cookie is not None
            and given is not None
            and self._valid_csrf(cookie)
            and _same(cookie, given)
        ):
            return None
        return "the CSRF token is missing or wrong: reload the page"


def _cross_origin(request: Request) -> str | None:
    """Why the browser that sent `request` did not send it from this view's own origin, or
    None. `Sec-Fetch-Site` is the browser's own verdict (right behind a proxy that rewrites
    `Host`, too); a browser without it is judged by `Origin` against `Host`, where `null` (a
    cross-origin redirect, a sandboxed frame) is refused. A client that sends neither (curl,
    a script) is no browser a page could drive."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site.strip().lower() in SAME_ORIGIN_FETCH:
            return None
        return f"a change from another origin (Sec-Fetch-Site: {site}) is refused"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    if origin == "null" or origin.split("://", 1)[-1] != request.headers.get("host", ""):
        return f"a change from another origin ({origin}) is refused"
    return None


def cookie_name(request: Request, base: str) -> str:
    """`base`, with the port the request's `Host` names (`emq_bridge_csrf_8001`): browsers
    keep cookies by host, not by port, so two views on one host would overwrite each other's."""
    port = request.url.port
    return base if port is None else f"{base}_{port}"


def _same(a: str, b: str) -> bool:
    """Constant-time equality of two strings from a request (bytes: `compare_digest` refuses
    non-ASCII str, and a forged cookie may hold anything)."""
    return hmac.compare_digest(
        a.encode("utf-8", "surrogateescape"), b.encode("utf-8", "surrogateescape")
    )


def _path(request: Request) -> str:
    """The cookie path: where the app is mounted, so cookies stay with it."""
    root = str(request.scope.get("root_path") or "")
    return root.rstrip("/") + "/" if root else "/"


def _set_cookie(
    request: Request, response: Response, name: str, value: str, *, max_age: int | None = None
) -> None:
    response.set_cookie(
        cookie_name(request, name),
        value,
        max_age=max_age,
        path=_path(request),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
