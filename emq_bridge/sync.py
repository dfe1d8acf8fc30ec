"""Sync declared schedules (decorators, a config file) into the registry.

A sync is a plan (create / unchanged / update / remove), then an apply of upserts and
guarded cancels. Each source tags what it writes, so a sync removes only what the same
source declared before and no longer declares; schedules added at runtime are never
touched. Because every step is an idempotent upsert, concurrent syncs converge.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from .definition import Declaration
from .errors import ConfigError
from .keys import validate_name
from .registry import Repeat, Upserted, record_digest

__all__ = ["Declaration", "SyncPlan", "plan_sync", "sync"]  # Declaration lives in definition

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SyncPlan:
    """What a sync will do (or did), per change kind."""

    source: str
    create: list[Declaration] = field(default_factory=list)
    update: list[Declaration] = field(default_factory=list)
    unchanged: list[Declaration] = field(default_factory=list)
    remove: list[tuple[str, str]] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return len(self.create) + len(self.update) + len(self.remove)

    def lines(self) -> list[str]:
        """Return the plan as a diff: `+` create, `~` update, `-` remove, `=` unchanged."""
        out = [f"+ {d.queue}/{d.name}  {d.definition.cadence.describe()}" for d in self.create]
        out += [f"~ {d.queue}/{d.name}  {d.definition.cadence.describe()}" for d in self.update]
        out += [f"- {q}/{n}" for q, n in self.remove]
        out += [f"= {d.queue}/{d.name}" for d in self.unchanged]
        return out


def _check_unique(declarations: list[Declaration]) -> None:
    seen: set[tuple[str, str]] = set()
    for declaration in declarations:
        key = (declaration.queue, declaration.name)
        if key in seen:
            raise ConfigError(f"schedule {declaration.queue}/{declaration.name} is declared twice")
        seen.add(key)


def plan_sync(
    repeat: Repeat, declarations: Iterable[Declaration], source: str, *, prune: bool = True
) -> SyncPlan:
    """Compare `declarations` with the registry and return what a sync would change."""
    validate_name(source, "source")
    wanted = list(declarations)
    _check_unique(wanted)
    plan = SyncPlan(source)
    queues = {d.queue for d in wanted}
    if prune:
        queues.update(repeat.queues())
    # The stored digest covers the definition and its owner: comparing it is enough, and
    # nothing needs decoding (a boot sync of an unchanged registry stays cheap).
    current = {
        (q, name): stored for q in sorted(queues) for name, stored in repeat.digests(q).items()
    }
    for declaration in wanted:
        stored = current.get((declaration.queue, declaration.name))
        if stored is None:
            plan.create.append(declaration)
        elif stored[0] == record_digest(declaration.definition, source):
            plan.unchanged.append(declaration)
        else:
            plan.update.append(declaration)
    if prune:
        declared = {(d.queue, d.name) for d in wanted}
        plan.remove = sorted(
            key for key, (_, owner) in current.items() if owner == source and key not in declared
        )
    return plan


def sync(
    repeat: Repeat,
    declarations: Iterable[Declaration],
    source: str,
    *,
    prune: bool = True,
    dry_run: bool = False,
) -> SyncPlan:
    """Plan, then (unless `dry_run`) apply: upsert what is new or changed, cancel what is pruned.

    The plan returned reflects what the registry answered when applied, so under concurrent
    syncs an item planned as `create` may come back as `unchanged`.
    """
    plan = plan_sync(repeat, declarations, source, prune=prune)
    if dry_run:
        return plan
    applied = SyncPlan(source)
    buckets: dict[Upserted, list[Declaration]] = {
        "created": applied.create,
        "updated": applied.update,
        "unchanged": applied.unchanged,
    }
    applied.unchanged.extend(plan.unchanged)  # nothing to send: an upsert would write nothing
    # Each upsert is atomic and re-checks the digest, so concurrent syncs converge: an item
    # planned as `create` may come back `unchanged` when another sync got there first.
    todo = [*plan.create, *plan.update]
    results = repeat.upsert_many([(d.queue, d.name, d.definition) for d in todo], source=source)
    for declaration, result in zip(todo, results, strict=True):
        buckets[result].append(declaration)
    for queue, name in plan.remove:
        if repeat.cancel(queue, name, if_source=source):
            applied.remove.append((queue, name))
    log.info(
        "sync %s: %d created, %d updated, %d unchanged, %d removed",
        source,
        len(applied.create),
        len(applied.update),
        len(applied.unchanged),
        len(applied.remove),
    )
    return applied
