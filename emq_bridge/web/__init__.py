"""The web view of the registry: `app(repeat)`, a Starlette ASGI app, and `emq-bridge web`.

Install it with `pip install 'emq-bridge[web]'` (Starlette, Jinja2, uvicorn, python-multipart).
"""

from __future__ import annotations

from importlib.util import find_spec

try:
    import jinja2 as _jinja2  # noqa: F401  # only to say which extra is missing
    import starlette as _starlette  # noqa: F401

    # Starlette parses the action forms with python-multipart (`python_multipart`, or
    # `multipart` before 0.0.13): without it every form post is a 500, pages load fine.
    if find_spec("python_multipart") is None and find_spec("multipart") is None:
        raise ImportError("No module named 'python_multipart'")
except ImportError as exc:
    raise ImportError(
        "emq_bridge.web needs Starlette, Jinja2 and python-multipart: pip install 'emq-bridge[web]'"
    ) from exc

from .app import ACTIONS, app
from .auth import WriteCheck

__all__ = ["ACTIONS", "WriteCheck", "app"]
