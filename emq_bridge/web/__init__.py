"""The web view of the registry: `app(repeat)`, a Starlette ASGI app, and `emq-bridge web`.

Install it with `pip install 'emq-bridge[web]'` (Starlette, Jinja2, uvicorn).
"""

from __future__ import annotations

from .app import ACTIONS, app
from .auth import WriteCheck

__all__ = ["ACTIONS", "WriteCheck", "app"]
