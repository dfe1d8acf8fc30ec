"""A WARNING for `celery worker -B -S emq`: on `celery worker`, `-S` is `--statedb`.

Such a worker runs Celery's own scheduler (the `beat_scheduler` default, `PersistentScheduler`)
from the app's `beat_schedule`, with a state file named `emq`, and nothing says so: the
schedules look like emq-bridge's, but every beat that runs `-S emq` elsewhere fires them too.
Connected when `emq_bridge.celery` is imported; it reads the worker only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import signals
from celery.utils.imports import load_extension_class_names, symbol_by_name

from .beat import RepeatScheduler

__all__ = ["mistyped_scheduler"]

log = logging.getLogger("emq_bridge.celery")

# The names `-S` would be given for emq-bridge's scheduler: the alias and its paths.
_OURS = {"emq", "emq_bridge.celery:RepeatScheduler", "emq_bridge.celery.RepeatScheduler"}
_OURS |= {"emq_bridge.celery.beat:RepeatScheduler", "emq_bridge.celery.beat.RepeatScheduler"}


def mistyped_scheduler(statedb: Any, scheduler: Any) -> str | None:
    """Return the warning for an embedded beat whose state file `statedb` is named as
    emq-bridge's scheduler while its `scheduler` is another one; None otherwise."""
    if not isinstance(statedb, str) or os.path.basename(statedb) not in _OURS:
        return None
    if _is_ours(scheduler):
        return None
    return (
        f"emq-bridge: this worker's embedded beat (-B) runs {_name(scheduler)}, not "
        f"emq-bridge's, with a state file named {statedb!r}: on `celery worker`, -S is "
        "--statedb. Its schedules fire besides any emq-bridge beat's. Spell it "
        "`--scheduler emq` (or set beat_scheduler)"
    )


def _is_ours(scheduler: Any) -> bool:
    try:
        aliases = dict(load_extension_class_names("celery.beat_schedulers") or ())
        found = symbol_by_name(scheduler, aliases=aliases)
    except Exception:  # Celery's embedded beat says why it cannot load it
        return False
    return isinstance(found, type) and issubclass(found, RepeatScheduler)


def _name(scheduler: Any) -> str:
    return scheduler.__qualname__ if isinstance(scheduler, type) else str(scheduler)


def _on_worker_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """`celeryd_after_setup`: warn of `-B -S emq` (never raises into the worker)."""
    try:
        if getattr(instance, "beat", None) is None:  # no embedded beat
            return
        warning = mistyped_scheduler(
            getattr(instance, "statedb", None), getattr(instance, "scheduler", None)
        )
        if warning is not None:
            log.warning(warning)
    except Exception as exc:  # a hint must never stop a worker
        log.debug("emq-bridge: the embedded beat's scheduler was not checked: %s", exc)


signals.celeryd_after_setup.connect(
    _on_worker_setup, weak=False, dispatch_uid="emq_bridge.celery.worker_beat"
)
