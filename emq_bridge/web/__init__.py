"""The web view of the registry: `app(repeat)`, a Starlette ASGI app, and `emq-bridge web`.

Install it with `pip install 'emq-bridge[web]'` (Starlette, Jinja2, uvicorn).
"""

from __future__ import annotations

try:
    import jinja2 as _jinja2  # noqa: F401  # only to say which extra is missing
    import starlette as _starlette  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "emq_bridge.web needs Starlette and Jinja2: pip install 'emq-bridge[web]'"
    ) from exc

from .app import ACTIONS, app
from .auth import WriteCheck

__all__ = ["ACTIONS", "WriteCheck", "app"]
