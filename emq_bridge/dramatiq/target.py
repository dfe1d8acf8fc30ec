"""The Dramatiq target of `emq-bridge pump --dramatiq SPEC`: the broker, its queues, registry."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import dramatiq
from dramatiq import broker as dramatiq_broker
from dramatiq.brokers.redis import RedisBroker

from ..definition import Declaration
from ..dispatch import PumpTarget
from ..errors import ConfigError, EmqError
from ..registry import Repeat
from ..targets import app_failed, declared_at
from .dispatch import dramatiq_dispatcher
from .middleware import DEFAULT_SOURCE, RecurringMiddleware
from .schedule import broker_declarations, check_actors

__all__ = ["import_broker", "load_target"]


def import_broker(spec: str) -> dramatiq.Broker:
    """Import `module` or `module:attr` the way the `dramatiq` command does; return its broker.

    `attr` may be a dotted path to a `Broker`, or a callable that sets the global broker.
    With `module` alone, the broker is the one the module set with `dramatiq.set_broker`.
    The current directory is put on `sys.path` first, as `dramatiq` does.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ConfigError(f"--dramatiq {spec!r}: give module or module:broker")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except EmqError as exc:  # an actor's recurring option, say: its reason, and where
        raise declared_at(exc) from exc
    except ImportError as exc:
        raise ConfigError(f"cannot import Dramatiq app {module_name!r}: {exc}") from exc
    except Exception as exc:  # the app's own code failed
        raise app_failed(f"cannot import Dramatiq app {module_name!r}", exc) from exc
    if attr:
        found: Any = module
        for part in attr.split("."):
            if not hasattr(found, part):
                raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
            found = getattr(found, part)
        if isinstance(found, dramatiq.Broker):
            return found
        if not callable(found):
            raise ConfigError(f"{spec!r} is neither a Dramatiq broker nor a callable that sets one")
        found()
    if dramatiq_broker.global_broker is None:
        raise ConfigError(
            f"{spec!r} set no Dramatiq broker: name it (module:broker) or call dramatiq.set_broker"
        )
    return dramatiq.get_broker()


def _middleware(broker: dramatiq.Broker) -> RecurringMiddleware | None:
    return next((m for m in broker.middleware if isinstance(m, RecurringMiddleware)), None)


def load_target(spec: str, *, pipelined: bool = False) -> PumpTarget:
    """Import a Dramatiq app (`module:broker` or `module`) and return what a pump needs.

    `pipelined=True` sends through `PipelinedDramatiqDispatcher` (a `RedisBroker` only);
    otherwise the dispatcher is the one the app's workers use: `RecurringMiddleware(pipelined=
    ...)`, automatic by default (`dramatiq_dispatcher`: pipelined on a `RedisBroker`).

    The module is imported so its decorators run. The declarations are the schedules on
    the broker's actors; the source, queues, registry and pump settings follow the broker's
    `RecurringMiddleware` when it has one (so the standalone pump and the workers agree on
    ownership and pump the same registry), else the source is `"dramatiq"`, the queues are
    every queue the broker declares, and the app names no registry.
    """
    broker = import_broker(spec)
    declarations = broker_declarations(broker)
    middleware = _middleware(broker)

    def check(repeat: Repeat, files: Sequence[tuple[str, Sequence[Declaration]]]) -> None:
        """What the workers' boot refuses, refused before the command writes anything: a
        file's schedule for no actor of the broker (or on another queue), overlap=replace;
        the middleware's own schedule file, checked as the workers' boot checks it."""
        for path, declared in files:
            check_actors(broker, declared, path)
        if middleware is not None:
            middleware.sync_declared(broker, repeat, apply=False)

    if middleware is None:
        queues = tuple(sorted({d.queue for d in declarations} | set(broker.get_declared_queues())))
        if not queues:
            raise ConfigError(f"{spec!r} declares no actor, so there is no queue to pump")
        # `--pipelined` asks for the fast path; without it the choice is automatic (None).
        dispatcher = dramatiq_dispatcher(broker, True if pipelined else None)
        return PumpTarget(dispatcher, queues, declarations, DEFAULT_SOURCE, check=check)
    queues = middleware.queues(broker, declarations)
    if not queues:
        raise ConfigError(f"{spec!r} declares no actor, so there is no queue to pump")
    generation = middleware.generation
    return PumpTarget(
        # `--pipelined` asks for the fast path; without it the pump sends as the workers do.
        dramatiq_dispatcher(broker, True if pipelined else middleware.pipelined),
        queues,
        declarations,
        middleware.source,
        repeat=_worker_registry(middleware, broker),
        lease_ms=middleware.lease_ms,
        max_sleep_s=middleware.max_sleep_s,
        history_size=middleware.history_size,
        # The workers' own sync: their generation, schedule file and prune setting.
        sync=lambda repeat: middleware.sync_declared(broker, repeat),
        code=(middleware.source, generation),
        check=check,
    )


def _worker_registry(middleware: RecurringMiddleware, broker: dramatiq.Broker) -> Repeat | None:
    """Return the registry the workers' pumps use (`repeat=`, the RedisBroker's, `$REDIS_URL`).

    None when the middleware names none (not a RedisBroker, no `repeat=`, no `$REDIS_URL`):
    then no worker can boot, and the command's registry is the only one.
    """
    named = (
        middleware._registry_spec is not None
        or isinstance(broker, RedisBroker)
        or os.environ.get("REDIS_URL") is not None
    )
    # A named registry that is malformed raises here, as it stops the workers' boot.
    return middleware.registry(broker) if named else None
