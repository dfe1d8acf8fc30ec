"""An import as data, and its application to the registry.

An importer (celery-redbeat, django-celery-beat) reads the schedules of the scheduler it
replaces and returns an `ImportPlan`: for each one it can carry, a `Declaration` and a
`Seed` (the slot it fires next, computed from its last run so that nothing fires early or
twice at the switch; paused if disabled; its run count and last run); for each one it
cannot, a `Refusal` with the reason. `apply_import` upserts the carried ones under the
importer's source: a created registration starts from its seed, an existing one keeps its
own score, state and counters, and an unchanged one is not written at all, so running the
same import again writes nothing. An import never removes anything, and never takes over a
registration another source owns (a beat's `beat_schedule` entry that celery-redbeat also
stored, Celery's own `celery.backend_cleanup`): it is listed with `!` and left alone. An
entry whose last run or next run is no time a run can have (outside 1970 to the end of 9999:
a last run stored as 9999-12-31 puts the next in year 10000) is refused too, unwritten.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace

from ..cadence import LATEST_MS
from ..definition import Declaration
from ..errors import ConfigError
from ..millis import utc_datetime
from ..registry import Repeat, Seed
from ..sync import IMPORT_SOURCE_PREFIX, plan_sync, tasks_of

__all__ = [
    "ImportPlan",
    "ImportResult",
    "Imported",
    "Refusal",
    "apply_import",
    "left_behind_notes",
    "queues_note",
    "result_lines",
]


@dataclass(frozen=True, slots=True)
class Imported:
    """One schedule an importer carries: where it came from, what it becomes, where it starts."""

    origin: str  # how the old scheduler names it, e.g. "redbeat:nightly"
    declaration: Declaration
    seed: Seed
    # What the registry holds, for one that existed: an import keeps its live state, so that
    # is what is shown, not the seed (`_as_stored`).
    stored: str | None = None

    def line(self) -> str:
        """Describe it on one line: registration, cadence, next run or paused, origin."""
        d = self.declaration
        seed = self.seed
        state = (
            f"paused (next {_utc(seed.resume_ms)})"
            if seed.paused
            else f"next {_utc(seed.first_run_ms)}"
        )
        if self.stored is not None:
            state = self.stored
        return f"{d.queue}/{d.name}  {d.definition.cadence.describe()}  {state}  <- {self.origin}"


@dataclass(frozen=True, slots=True)
class Refusal:
    """One schedule an importer cannot carry, and why; it is listed, never dropped silently."""

    origin: str
    reason: str

    def line(self) -> str:
        return f"{self.origin}: {self.reason}"


@dataclass(slots=True)
class ImportPlan:
    """What an importer read: the schedules it carries and those it refuses."""

    source: str
    entries: list[Imported] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    # The old scheduler stores a run before it sends it (celery-redbeat), so a slot after
    # its last stored run was never sent: the cut-over's `--resume` fires an overdue one at
    # once, as a switch without staging does (and the old scheduler on its restart). Else
    # (django-celery-beat saves its last runs every few minutes) a passed slot may have been
    # sent, and is not fired.
    records_before_send: bool = False


@dataclass(slots=True)
class ImportResult:
    """What `apply_import` did (or, with `dry_run`, would do), per change kind."""

    source: str
    dry_run: bool
    created: list[Imported] = field(default_factory=list)
    updated: list[Imported] = field(default_factory=list)
    unchanged: list[Imported] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    resumed: list[Imported] = field(default_factory=list)
    # Existing registrations that fired here, paused by `--paused` (`_stage`).
    staged: list[Imported] = field(default_factory=list)

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.resumed) + len(self.staged)

    def summary(self) -> str:
        note = " (dry run: nothing written)" if self.dry_run else ""
        resumed = f", {len(self.resumed)} resumed" if self.resumed else ""
        staged = f", {len(self.staged)} paused for the cut-over" if self.staged else ""
        return (
            f"import {self.source}: {len(self.created)} created, {len(self.updated)} updated, "
            f"{len(self.unchanged)} unchanged, {len(self.refused)} refused{resumed}{staged}{note}"
        )


def apply_import(
    repeat: Repeat,
    plan: ImportPlan,
    *,
    dry_run: bool = False,
    strict: bool = False,
    paused: bool = False,
    resume: bool = False,
) -> ImportResult:
    """Upsert what `plan` carries under `plan.source`; return what changed.

    Created registrations start from their seed (next slot, paused state, counters);
    existing ones keep their own. Unchanged ones are not written, so a second run of the
    same import writes nothing. With `strict`, a plan with refusals raises `ConfigError`
    and writes nothing. Redis failures raise `RegistryUnavailable` / `RegistryError`; what
    was written before one stays (running the import again completes it).

    The cut-over without double firing: `paused` creates every registration paused (the
    old scheduler still runs them); once it is stopped, `resume` resumes the paused
    registrations whose schedule is enabled there from the slot it would fire next, read
    from it again (`Repeat.resume(seed=...)`: its runs meanwhile moved its last run, so no
    slot it fired runs again, and none comes early; one already passed is fired, as the
    misfire policy says, when the old scheduler stores a run before sending it, else not:
    `ImportPlan.records_before_send`), with its run count and last run.
    """
    plan = _without_unusable_seeds(_without_collisions(plan))
    if strict and plan.refused:
        _refuse_all(plan.refused)
    by_key = {(e.declaration.queue, e.declaration.name): e for e in plan.entries}
    declarations = [e.declaration for e in plan.entries]
    planned = plan_sync(repeat, declarations, plan.source, prune=False)
    result = ImportResult(plan.source, dry_run, refused=list(plan.refused))
    owners = _owners(repeat, planned.update)
    theirs = [by_key[key] for key, owner in owners.items() if owner != plan.source]
    # A seed applies to what is created only; `paused` creates it paused.
    created, elsewhere, moved = _not_taken_over(repeat, [by_key[_key(d)] for d in planned.create])
    # What `resume` lifts, a registration a beat took over during the staging included: the
    # import leaves its definition to the beat, but resumes it, and that is what is said of
    # it (`> resumed`), not a `!`: neither listed nor refused by `strict` as left alone.
    lifting = (
        [e for e in plan.entries if not e.seed.paused and _owned(repeat, e, plan.source, moved)]
        if resume
        else []
    )
    lifted = {e.origin for e in lifting}
    left = [_left(e, owners) for e in theirs if e.origin not in lifted]
    if strict and left:  # (one that another source takes meanwhile is refused by the write)
        _refuse_all(left)
    planned.update = [d for d in planned.update if owners[(d.queue, d.name)] == plan.source]
    result.unchanged = [by_key[(d.queue, d.name)] for d in planned.unchanged]
    if strict and (refused := [r for r in elsewhere if r.origin not in lifted]):
        _refuse_all(refused)
    if paused:  # marked as the import's pause: `resume` lifts it whoever owns it by then
        created = [replace(e, seed=_paused_by(e.seed, plan.source)) for e in created]
    todo = [*created, *(by_key[(d.queue, d.name)] for d in planned.update)]
    if dry_run:
        result.created = created
        result.updated = [by_key[(d.queue, d.name)] for d in planned.update]
        result.updated = _as_stored(repeat, result.updated)
        result.unchanged = _as_stored(repeat, result.unchanged)
        result.resumed = [_where(e, moved) for e in lifting]
        result.refused += _not_resumed([*elsewhere, *left], result.resumed)
        if paused:
            result.staged = _stage(repeat, plan.entries, plan.source, moved, dry_run=True)
        return result
    todo += theirs  # sent too: the script decides who owns it at the time of the write
    answers = repeat.upsert_many(
        [(e.declaration.queue, e.declaration.name, e.declaration.definition) for e in todo],
        source=plan.source,
        seeds=[e.seed for e in todo],
        keep_owners=True,
    )
    buckets = {"created": result.created, "updated": result.updated, "unchanged": result.unchanged}
    owned: list[Refusal] = []
    for entry, answer in zip(todo, answers, strict=True):
        if answer == "owned":
            d = entry.declaration
            registration = repeat.get(d.queue, d.name)  # who, for the message only
            owners[(d.queue, d.name)] = registration.source if registration else None
            owned.append(_left(entry, owners))
        else:
            buckets[answer].append(entry)
    for entry in lifting:  # read again: the write may have changed who owns it, or its pause
        d = entry.declaration
        if _owned(repeat, entry, plan.source, moved):
            try:
                queue = moved.get(_key(d), d.queue)
                seed, catchup = entry.seed, plan.records_before_send
                if catchup:  # as a switch made now: an overdue slot fires at once
                    seed = replace(seed, rhythm_ms=None)
                if repeat.resume(queue, d.name, seed=seed, catchup=catchup):
                    result.resumed.append(_where(entry, moved))
            except KeyError:  # removed meanwhile: nothing to resume
                continue
    result.refused += _not_resumed([*elsewhere, *owned], result.resumed)
    if paused:
        result.staged = _stage(repeat, plan.entries, plan.source, moved, dry_run=False)
    result.updated = _as_stored(repeat, result.updated)
    result.unchanged = _as_stored(repeat, result.unchanged)
    return result


# The note of a pause an import's `--paused` makes (`show` prints it).
STAGED_NOTE = "imported --paused: the old scheduler runs it until the cut-over (--resume)"


def _stage(
    repeat: Repeat,
    entries: list[Imported],
    source: str,
    moved: dict[tuple[str, str], str],
    *,
    dry_run: bool,
) -> list[Imported]:
    """Pause, as the import's `--paused` (`paused_by` its source), the registrations of
    `entries` that exist already and fire here: an earlier import's (in its queue, or the
    app's, where a beat moved it: `moved`), after a switch back to the old scheduler. Else
    both schedulers would fire each slot until the cut-over, and the cut-over's `--resume`,
    which lifts only a pause, would leave their next runs where this registry last left
    them: a slot the old scheduler sent since would be sent again. Another source's
    registration is left alone, as the import says (`!`). Return those paused (with
    `dry_run`, those that would be)."""
    where = {
        _key(e.declaration): moved.get(_key(e.declaration), e.declaration.queue) for e in entries
    }
    stored = {
        (queue, name): registration
        for queue in set(where.values())
        for name, registration in repeat.get_many(
            queue, [name for (_, name), there in where.items() if there == queue]
        ).items()
    }
    staged = []
    for entry in entries:
        d = entry.declaration
        queue = where[_key(d)]
        found = stored.get((queue, d.name))
        if found is None or found.paused or found.completed is not None:
            continue  # created paused just now, paused already (by whoever), or done
        if found.source != source and _key(d) not in moved:
            continue  # another source's: left alone
        if dry_run or repeat.pause(queue, d.name, note=STAGED_NOTE, by=source):
            staged.append(_where(entry, moved))
    return staged


def _key(declaration: Declaration) -> tuple[str, str]:
    return (declaration.queue, declaration.name)


def _where(entry: Imported, moved: dict[tuple[str, str], str]) -> Imported:
    """`entry` in the queue its registration is in now (a beat moved it: `moved`)."""
    d = entry.declaration
    queue = moved.get(_key(d))
    return entry if queue is None else replace(entry, declaration=replace(d, queue=queue))


def _not_resumed(refused: list[Refusal], resumed: list[Imported]) -> list[Refusal]:
    """`refused` less the schedules `resumed`: one a beat took over during the staging is left
    to the beat (its definition), but resumed, and only that is said of it."""
    done = {e.origin for e in resumed}
    return [r for r in refused if r.origin not in done]


def _paused_by(seed: Seed, source: str) -> Seed:
    """`seed` created paused by an import's `--paused`, the pause marked as the import's
    (`paused_by`): a beat that takes the registration over meanwhile keeps the pause, and
    the cut-over's `--resume` still lifts it."""
    carried = {**seed.carried, "paused_by": source, "paused_note": STAGED_NOTE}
    return replace(seed, paused=True, carried=carried)


def _not_taken_over(
    repeat: Repeat, entries: list[Imported]
) -> tuple[list[Imported], list[Refusal], dict[tuple[str, str], str]]:
    """`entries` (to create) less those whose schedule another source holds in another queue,
    with the same name and task: one a beat's sync took over from an earlier import of it
    into this queue, and moved to the queue the app sends it to (`sync._relocate`).
    Imported here again, it would fire twice; each is refused, naming where it is. Also
    returns where each of them is: (its queue here, name) -> the queue it moved to."""
    if not entries:
        return entries, [], {}
    names = sorted({e.declaration.name for e in entries})
    held: dict[str, list[tuple[str, str]]] = {}
    for queue in repeat.queues():
        for name, fields in repeat.load_records(queue, names, ("source",)).items():
            owner = fields.get("source")
            if owner and not owner.startswith(IMPORT_SOURCE_PREFIX):
                held.setdefault(name, []).append((queue, owner))
    if not held:
        return entries, [], {}
    tasks = {
        (queue, name): task
        for queue, name, task in tasks_of(repeat, [(q, n) for n, at in held.items() for q, _ in at])
    }
    kept, refused, moved = [], [], {}
    for entry in entries:
        d = entry.declaration
        task = d.definition.template.get("task")
        found = [
            (q, o)
            for q, o in held.get(d.name, [])
            if q != d.queue and tasks.get((q, d.name)) == task
        ]
        if not found:
            kept.append(entry)
            continue
        queue, owner = found[0]
        moved[_key(d)] = queue
        refused.append(
            Refusal(
                entry.origin,
                f"{queue}/{d.name} of the source {owner!r} is this schedule, taken over in the "
                f"queue the app sends it to: left alone (in {d.queue} too, it would fire twice)",
            )
        )
    return kept, refused, moved


def _as_stored(repeat: Repeat, entries: list[Imported]) -> list[Imported]:
    """`entries` described by the state the registry keeps (next run, paused), not by their
    seed, which applies to a created registration only."""
    stored = {
        (queue, name): registration
        for queue in {e.declaration.queue for e in entries}
        for name, registration in repeat.get_many(
            queue, [e.declaration.name for e in entries if e.declaration.queue == queue]
        ).items()
    }
    out = []
    for entry in entries:
        live = stored.get((entry.declaration.queue, entry.declaration.name))
        if live is None:
            out.append(entry)
            continue
        if live.no_run_left:  # scored past 9999 (what an older import wrote), or all excluded
            when = "no run left"
        elif live.next_run_ms is None:
            when = "no next run"
        else:
            when = f"next {_utc(live.next_run_ms)}"
        state = f"paused ({when}, as stored)" if live.paused else f"{when} (as stored)"
        d = entry.declaration
        if entry.seed.paused and not live.paused:  # disabled there since it was imported
            pause = shlex.join(["emq-bridge", "pause", d.queue, d.name])
            state += (
                "; disabled in the old scheduler but active here (an import leaves a "
                f"registration's pause as it is): {pause}"
            )
        elif live.paused and not entry.seed.paused and not _staged(live.paused_by):
            # Enabled there again (django-celery-beat's admin): an import's `--paused`
            # staging is lifted by `--resume` at the cut-over, not named here.
            resume = shlex.join(["emq-bridge", "resume", d.queue, d.name])
            state += (
                "; enabled in the old scheduler but paused here (an import leaves a "
                f"registration's pause as it is): {resume}"
            )
        out.append(replace(entry, stored=state))
    return out


def _staged(paused_by: str | None) -> bool:
    """Whether a pause is an import's own `--paused` staging (`paused_by` its source)."""
    return paused_by is not None and paused_by.startswith(IMPORT_SOURCE_PREFIX)


def _owners(repeat: Repeat, existing: list[Declaration]) -> dict[tuple[str, str], str | None]:
    """The owner of each existing registration (read to sort the plan and word the output;
    the write itself re-checks it in the script)."""
    out: dict[tuple[str, str], str | None] = {}
    for queue in sorted({d.queue for d in existing}):
        names = [d.name for d in existing if d.queue == queue]
        records = repeat.load_records(queue, names, ("source",))  # these only, one round trip
        out.update(((queue, n), records.get(n, {}).get("source")) for n in names)
    return out


def _refuse_all(refused: list[Refusal]) -> None:
    reasons = "; ".join(r.line() for r in refused)
    raise ConfigError(f"{len(refused)} schedule(s) cannot be imported: {reasons}")


def _without_collisions(plan: ImportPlan) -> ImportPlan:
    """`plan` less the entries that would be one registration (names the old scheduler keeps
    apart, such as 'report a' and 'report_a', read as one): each of them is refused, naming
    the others, and the rest is imported."""
    groups: dict[tuple[str, str], list[Imported]] = {}
    for entry in plan.entries:
        groups.setdefault((entry.declaration.queue, entry.declaration.name), []).append(entry)
    if len(groups) == len(plan.entries):
        return plan
    refused = list(plan.refused)
    for (queue, name), entries in groups.items():
        if len(entries) > 1:
            for entry in entries:
                others = ", ".join(e.origin for e in entries if e is not entry)
                refused.append(
                    Refusal(
                        entry.origin,
                        f"{queue}/{name} would also be the registration of {others}; "
                        "rename one of them",
                    )
                )
    kept = [group[0] for group in groups.values() if len(group) == 1]
    return replace(plan, entries=kept, refused=refused)


def _without_unusable_seeds(plan: ImportPlan) -> ImportPlan:
    """`plan` less the entries whose last run or next run is not epoch ms from 1970 to the end
    of 9999, as every time the registry keeps is (a last run stored as 9999-12-31 puts the
    next one in year 10000): each is refused with why, and the rest is imported."""
    kept: list[Imported] = []
    refused = list(plan.refused)
    for entry in plan.entries:
        reason = _unusable_seed(entry.seed)
        if reason is None:
            kept.append(entry)
        else:
            refused.append(Refusal(entry.origin, reason))
    if len(kept) == len(plan.entries):
        return plan
    return replace(plan, entries=kept, refused=refused)


def _unusable_seed(seed: Seed) -> str | None:
    """Why `seed` cannot be written (a time outside 1970 to the end of 9999), or None."""
    last, first = seed.last_fired_ms, seed.first_run_ms
    if last is not None and not 0 <= last <= LATEST_MS:
        return f"its last run is {_utc(last)}: correct or clear it in the old scheduler"
    if not 0 <= first <= LATEST_MS:
        after = "" if last is None else f" after its last run at {_utc(last)}"
        return (
            f"its next run{after} would be {_utc(first)}: "
            "correct or clear its last run in the old scheduler"
        )
    return None


def _left(entry: Imported, owners: dict[tuple[str, str], str | None]) -> Refusal:
    d = entry.declaration
    owner = owners.get((d.queue, d.name))
    who = f"the source {owner!r}" if owner else "no source (added at runtime)"
    return Refusal(
        entry.origin,
        f"{d.queue}/{d.name} is owned by {who}: left alone (an import never takes over "
        "another source's schedule)",
    )


def _owned(repeat: Repeat, entry: Imported, source: str, moved: dict[tuple[str, str], str]) -> bool:
    """True if the registration is paused by a pause the import may lift: its own `--paused`
    (`paused_by` its source), whether the source still owns the registration or a beat took
    it over meanwhile (in its queue, or moved to the app's: `moved`); and it is not parked (a
    dispatch that can never work, a failure streak: resume it by name). A pause an operator
    set by hand (`emq-bridge pause`), or another source's, is not the import's to lift."""
    d = entry.declaration
    registration = repeat.get(moved.get(_key(d), d.queue), d.name)
    return (
        registration is not None
        and registration.paused
        and registration.parked_reason is None
        and registration.paused_by == source
    )


def result_lines(result: ImportResult) -> list[str]:
    """Return what an import did as a diff: `+` created, `~` updated, `=` unchanged (nothing
    written), `!` refused, with the reason."""
    lines = [f"+ {e.line()}" for e in result.created]
    lines += [f"~ {e.line()}" for e in result.updated]
    lines += [f"= {e.line()}" for e in result.unchanged]
    lines += [f"! {r.line()}" for r in result.refused]
    lines += [f"> resumed {e.declaration.queue}/{e.declaration.name}" for e in result.resumed]
    lines += [
        f"> paused {e.declaration.queue}/{e.declaration.name} (it fired here: --resume lifts it)"
        for e in result.staged
    ]
    return lines


# Registrations `left_behind_notes` names one by one at most; the others are counted.
LEFT_BEHIND_SHOWN = 20


def left_behind_notes(repeat: Repeat, plan: ImportPlan) -> list[str]:
    """Return `note:` lines for the registrations of the import's source that this import
    did not read (an import never removes anything): one whose entry moved to another queue
    in the old scheduler (or an import run again with another `--queue`) fires under both
    queues; one whose entry was deleted or renamed there still fires here. Each line gives
    the command that removes it. (Not removed here: two deployments of one old scheduler
    imported under one source would remove each other's.)"""
    read = {(e.declaration.queue, e.declaration.name) for e in plan.entries}
    queue_of = {e.declaration.name: e.declaration.queue for e in plan.entries}
    lines: list[str] = []
    left = 0
    for queue in repeat.queues():
        for registration in repeat.iter_list(queue):
            if registration.source != plan.source or (queue, registration.name) in read:
                continue
            left += 1
            if len(lines) >= LEFT_BEHIND_SHOWN:
                continue
            remove = shlex.join(["emq-bridge", "remove", queue, registration.name])
            now_in = queue_of.get(registration.name)
            why = (
                f"its entry is in queue {now_in!r} now, where it fires too"
                if now_in is not None
                else "no entry this import read is it (deleted or renamed there, or refused above)"
            )
            lines.append(
                f"note: {queue}/{registration.name} of {plan.source} was not read by this "
                f"import: {why}; it still fires here unless removed: {remove}"
            )
    if left > len(lines):
        lines.append(
            f"note: {left - len(lines)} more registration(s) of {plan.source} were not read "
            f"by this import either (the first {LEFT_BEHIND_SHOWN} are named above)"
        )
    return lines


def queues_note(result: ImportResult) -> str | None:
    """Return the `note:` line naming the queues the imported schedules are in, or None.

    A `celery beat -S emq` pumps only the app's queues (its declared schedules', its
    `task_default_queue`, its `task_queues`) and those its `emq_bridge_queues` setting
    lists; an import cannot know the app, so it names the queues for the operator to check.
    """
    entries = [*result.created, *result.updated, *result.unchanged]
    queues = sorted({e.declaration.queue for e in entries})
    if not queues:
        return None
    named = ", ".join(repr(q) for q in queues)
    verb = "would be" if result.dry_run else "are"
    return (
        f"note: the imported schedules {verb} in queue(s) {named}: a celery beat -S emq "
        "pumps a queue only if it is one of the app's (its schedules' queues, "
        "task_default_queue, task_queues) or listed in its emq_bridge_queues setting"
    )


def _utc(ms: int) -> str:
    """Return epoch ms `ms` as UTC wall time; one no `datetime` holds (past year 9999, a
    registration an import wrote before such seeds were refused) as its epoch ms."""
    if not 0 <= ms <= LATEST_MS:
        return f"epoch ms {ms} ({'before 1970' if ms < 0 else 'past the end of 9999'})"
    return utc_datetime(ms).strftime("%Y-%m-%d %H:%M:%S UTC")
