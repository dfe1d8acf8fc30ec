"""Who may change schedules from the web view, and the CSRF check on every change.

Read-only unless writes are allowed, one of two ways:

- a token: `Authorization: Bearer <token>` on an API call, or the token typed once into the
  page's unlock form, which sets an HttpOnly cookie holding an HMAC of it (never the token);
- the host application's own auth: `can_write(request)` returns True (Starlette's
  `request.user`, a Django session read through the ASGI scope, a header set by a proxy).

Every change made with a cookie (the unlock cookie, or the host's session) must carry the
CSRF token: the value of a signed random cookie, echoed in the form (`csrf`) or in the
`X-CSRF-Token` header (double submit). A bearer call needs none: browsers never add that
header by themselves. A request whose `Origin` names another host is refused too.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["CSRF_COOKIE", "WRITE_COOKIE", "Guard", "WriteCheck"]

WriteCheck = Callable[[Request], bool]
"""The host application's say on writes: True lets this request change schedules."""

CSRF_COOKIE = "emq_bridge_csrf"
WRITE_COOKIE = "emq_bridge_write"
CSRF_HEADER = "x-csrf-token"


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

    def _sign(self, value: str) -> str:
        return hmac.new(self._secret, value.encode(), hashlib.sha256).hexdigest()

    def _unlocked(self) -> str | None:
        """The unlock cookie's value: an HMAC of the token, so the token is never stored."""
        return None if self._token is None else self._sign("write:" + self._token)

    def bearer(self, request: Request) -> bool:
        """Whether the request carries the token in its Authorization header."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return (
            self._token is not None
            and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), self._token.encode())
        )

    def may_write(self, request: Request) -> bool:
        """Whether this request may change schedules (token, unlock cookie or host's auth)."""
        if self.bearer(request):
            return True
        unlocked, cookie = self._unlocked(), request.cookies.get(WRITE_COOKIE)
        if unlocked is not None and cookie is not None and _same(cookie, unlocked):
            return True
        return self._can_write is not None and bool(self._can_write(request))

    def check_token(self, given: str) -> bool:
        """Whether `given` is the write token (the unlock form), surrounding whitespace
        dropped as from a bearer header."""
        return self._token is not None and _same(given.strip(), self._token)

    def unlock(self, request: Request, response: Response) -> None:
        """Set the unlock cookie on `response` (after `check_token`)."""
        value = self._unlocked()
        if value is not None:
            _set_cookie(request, response, WRITE_COOKIE, value)

    def lock(self, request: Request, response: Response) -> None:
        response.delete_cookie(WRITE_COOKIE, path=_path(request))

    # -- CSRF (double submit, the cookie signed) -------------------------------------------

    def csrf_token(self, request: Request) -> str:
        """Return this browser's CSRF token: its cookie's if valid, else a new one.

        A new one is kept in `request.state` for `remember_csrf` to set on the response.
        """
        cookie = request.cookies.get(CSRF_COOKIE)
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
        """Why a change is refused: it comes from another site (`Origin`), or it lacks this
        browser's CSRF token; None when it may go on."""
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            host = request.headers.get("host", "")
            if origin.split("://", 1)[-1] != host:
                return f"a change from another site ({origin}) is refused"
        cookie = request.cookies.get(CSRF_COOKIE)
        given = submitted or request.headers.get(CSRF_HEADER)
        if (
            cookie is not None
            and given is not None
            and self._valid_csrf(cookie)
            and _same(cookie, given)
        ):
            return None
        return "the CSRF token is missing or wrong: reload the page"


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


def _set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    response.set_cookie(
        name,
        value,
        path=_path(request),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
