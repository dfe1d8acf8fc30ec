"""Load the Lua moves from `emq_bridge/lua/` and register them once per client.

redis-py's `Script` runs EVALSHA and reloads the script on NOSCRIPT, so a server restart or
a failover to a replica that never saw the script is handled for us.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = ["MOVES", "Scripts", "lua_source"]

MOVES = (
    "register",
    "upsert",
    "cancel",
    "scan",
    "fetch",
    "claim",
    "ack",
    "extend",
    "pause",
    "resume",
    "trigger",
    "park",
    "report",
    "lost",
    "heartbeat",
    "backfill",
    "begin",
    "stamp",
)


# A move's line `-- #include NAME` stands for `lua/NAME.lib.lua`: what two moves share.
_INCLUDE = re.compile(r"^-- #include (\w+)$", re.MULTILINE)


def _read_sources() -> dict[str, str]:
    folder = resources.files("emq_bridge").joinpath("lua")
    files = {
        entry.name: entry.read_text("utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".lua")
    }
    libs = {n.removesuffix(".lib.lua"): t for n, t in files.items() if n.endswith(".lib.lua")}
    return {
        name.removesuffix(".lua"): _INCLUDE.sub(lambda m: libs[m.group(1)], text)
        for name, text in files.items()
        if not name.endswith(".lib.lua")
    }


# Read at import, in the importing thread: read lazily, the first read (which imports
# `importlib.readers`) could happen on a reporter thread while Celery's prefork pool forks,
# and the child would inherit that module half imported, failing every later read (its
# reports dropped for good) or deadlocking.
_SOURCES = _read_sources()


def lua_source(move: str) -> str:
    """Return the source of `lua/<move>.lua`."""
    try:
        return _SOURCES[move]
    except KeyError:
        raise ValueError(f"no Lua move {move!r}") from None


@dataclass(frozen=True, slots=True)
class Scripts:
    """The registered scripts of one Redis client, one attribute per move."""

    register: Any
    upsert: Any
    cancel: Any
    scan: Any
    fetch: Any
    claim: Any
    ack: Any
    extend: Any
    pause: Any
    resume: Any
    trigger: Any
    park: Any
    report: Any
    lost: Any
    heartbeat: Any
    backfill: Any
    begin: Any
    stamp: Any

    @classmethod
    def load(cls, client: Any) -> Scripts:
        return cls(**{move: client.register_script(lua_source(move)) for move in MOVES})
