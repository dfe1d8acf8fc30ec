"""Sync declared schedules (decorators, a config file) into the registry.

A sync is a plan (create / unchanged / update / remove), then an apply of upserts and
guarded cancels. Each source tags what it writes, so a sync removes only what the same
source declared before and no longer declares; schedules added at runtime are never
touched. Because every step is an idempotent upsert, concurrent syncs converge.

A sync may carry the `generation` of its declarations, an int the deploy raises. The
registry keeps, per queue, the highest generation each source synced, and the scripts that
write refuse an older one atomically with their writes, so two versions of one app booting
in turn (a rolling deploy) cannot flip a schedule back and forth. Updates and removals are
logged at WARNING, creations at INFO, unchanged schedules at DEBUG.

A sync may also carry a `Stamp`: the fingerprint of everything its declarations were built
from. Once applied, it stamps the queues it read (stamps.py); a later boot with the same
fingerprint asks `stamped` and, while every stamp holds (nobody else wrote that source's
records since, and no queue of its schedules lost registry members: stamps.py), skips
building and syncing its declarations: the registry is what a full sync would leave.

A declared record whose registry member is missing (evicted, or removed by hand: nothing
fires it) is not among the registry's members the plan reads, so the plan creates it; the
upsert finds the record unchanged and puts its member back, at its next run under its
cadence (upsert.lua's digit 8). Such a schedule is `restored`: listed among the updates
(what an `emq-bridge sync` prints as `~ q/name ... (recreated)`) and named in one WARNING.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from .bounds import Bounds
from .bulk import without_gc
from .definition import DEFINITION_FIELDS, Declaration, Definition
from .errors import ConfigError, EmqError, RegistryRestarted
from .keys import validate_name
from .registry import Repeat, Seed, StaleGeneration, Synced, generation_arg, record_digest
from .stamps import code_versions

# Declaration lives in definition.
__all__ = [
    "IMPORT_SOURCE_PREFIX",
    "Declaration",
    "Stamp",
    "SyncPlan",
    "apply_plan",
    "check_not_emptied",
    "check_not_owned_by",
    "declarations_fingerprint",
    "moves_of",
    "plan_sync",
    "queues_of",
    "stamped",
    "sync",
    "tasks_of",
]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SyncPlan:
    """What a sync will do (or did), per change kind."""

    source: str
    create: list[Declaration] = field(default_factory=list)
    update: list[Declaration] = field(default_factory=list)
    unchanged: list[Declaration] = field(default_factory=list)
    remove: list[tuple[str, str]] = field(default_factory=list)
    generation: int | None = None
    # The newer generation of `source` the registry holds, when it refused this sync (or the
    # rest of it: what was applied before the refusal is listed above).
    refused_by: int | None = None
    # The source's write count per queue read, taken before the plan read the queues, when
    # the plan is to be stamped (`plan_sync(stamped=True)`, `apply_plan(stamp=...)`).
    counts: dict[str, int] | None = None
    # True when the sync found its stamp holding (`sync(stamp=True)`): nothing was read.
    by_stamp: bool = False
    # How many unchanged schedules a stamp vouches for when their declarations were not even
    # read (a schedule file whose stamp held): `unchanged` is then empty.
    vouched: int | None = None
    # The source's schedules it no longer declares but left, with their tasks: tasks outside
    # `prune_tasks`, which this process does not know (another process may declare them).
    kept: list[tuple[str, str, str]] = field(default_factory=list)
    # Created declarations that take over an import's registration of the same schedule in
    # another queue (`_imported_elsewhere`): (queue, name) -> (the import's queue, its owner).
    adopted: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # Of `update`, the declarations whose record was unchanged but whose registry member was
    # missing (evicted, or removed by hand), which the sync put back (an applied plan's).
    restored: list[Declaration] = field(default_factory=list)
    # The server the plan was read from (`Repeat.server_identity`), which `apply_plan`
    # checks: a Redis restarted since holds none of what the plan read.
    server: str | None = None
    # Of the declarations it updates or leaves unchanged, those a pump parked for a dispatch
    # that could not work (an actor or task that pump's code lacked): the sync resumes them
    # (`Repeat.resume_parked`), since the code that declares them is here. An applied plan's
    # are those it resumed.
    unpark: list[tuple[str, str]] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return len(self.create) + len(self.update) + len(self.remove)

    @property
    def unchanged_count(self) -> int:
        return len(self.unchanged) if self.vouched is None else self.vouched

    def lines(self) -> list[str]:
        """Return the plan as a diff: `+` create, `~` update, `-` remove, `=` unchanged."""
        out = [
            f"+ {d.queue}/{d.name}  {d.definition.cadence.describe()}{self.adopts(d)}"
            for d in self.create
        ]
        out += [f"~ {d.queue}/{d.name}  {d.definition.cadence.describe()}" for d in self.update]
        out += [f"- {q}/{n}" for q, n in self.remove]
        out += [f"= {d.queue}/{d.name}" for d in self.unchanged]
        return out

    def adopts(self, declaration: Declaration) -> str:
        """What the created `declaration` takes over, for its plan line ('' for nothing)."""
        found = self.adopted.get((declaration.queue, declaration.name))
        if found is None:
            return ""
        return f"  (takes over {found[0]}/{declaration.name} of {found[1]})"


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a sync stamps the queues it read with, once applied: `fingerprint`, a digest of
    everything its declarations were built from (the caller's: it must change whenever they
    would), and `summary`, what the caller wants back from `stamped` (JSON: the queues its
    pump serves, a count)."""

    fingerprint: str
    summary: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of_queues(cls, fingerprint: str, declarations: Sequence[Declaration]) -> Stamp:
        """The stamp of a boot's sync of `declarations`: its summary the queues they are in
        (what its pump serves of them) and how many they are (`queues_of` reads it back)."""
        queues = sorted({d.queue for d in declarations})
        return cls(fingerprint, {"queues": queues, "declared": len(declarations)})


def queues_of(summary: Mapping[str, Any] | None) -> tuple[tuple[str, ...], int] | None:
    """The queues and the count a `Stamp.of_queues` summary holds; None for no summary or one
    this version cannot read (the caller then syncs in full)."""
    if summary is None:
        return None
    queues, declared = summary.get("queues"), summary.get("declared")
    if not isinstance(queues, list) or type(declared) is not int:
        return None
    try:
        return tuple(validate_name(q, "queue") for q in queues), declared
    except EmqError:
        return None


# Raised when what a sync does with the same declarations changes without a release.
# 2: a record key of another type is left alone and named (upsert.lua's digit 7); 3: Dramatiq
# schedules refuse options Dramatiq or emq-bridge write on each message (`retries`, `emq_*`...),
# so the first boot of this release syncs in full (each path checks them before it looks for
# this stamp, but a stamp must not outlive a change of what is accepted: see file_stamp.FORMAT).
_FINGERPRINT_FORMAT = 3


def declarations_fingerprint(
    declarations: Sequence[Declaration],
    source: str,
    generation: int | None = None,
    prune_tasks: Collection[str] | None = None,
) -> str:
    """Return the fingerprint of a sync of `declarations` under `source` at `generation`
    pruning `prune_tasks` (None: all): the queue, name and stored digest of each (what a
    sync compares), in any order, the tasks it may prune and the version of the code. Exact:
    two syncs with one fingerprint would plan the same (two worker pools of one source that
    know other actors prune differently, so they do not share a stamp)."""
    digest = hashlib.blake2b(digest_size=16)
    head = (str(_FINGERPRINT_FORMAT), source, str(generation), *code_versions("emq-bridge"))
    digest.update(" ".join(head).encode())
    if prune_tasks is not None:
        # Task names hold no newline (actor and task names are identifiers).
        digest.update(("\tprune\n" + "\n".join(sorted(prune_tasks))).encode())
    # Names hold no whitespace: one line per declaration cannot be read two ways.
    lines = sorted(
        f"\n{d.queue} {d.name} {record_digest(d.definition, source)}" for d in declarations
    )
    digest.update("".join(lines).encode())
    return digest.hexdigest()


def stamped(repeat: Repeat, source: str, fingerprint: str) -> dict[str, Any] | None:
    """Return the summary of `source`'s last stamped sync when it was of `fingerprint` and
    nobody else has written that source's records since, in any queue, and each queue of
    its schedules still has at least as many registry members as that sync left of them (a
    registry sorted set evicted or deleted by hand loses members without a write): a sync
    of the same declarations would then write nothing, and the caller may skip it. Else
    None. Reads only (a SCAN of the queues and one round trip)."""
    validate_name(source, "source")
    return repeat.stamp_of(source, fingerprint)


def check_one_source(sources: Iterable[tuple[str, Iterable[Declaration]]]) -> None:
    """Raise `ConfigError` when two sources one process syncs (an app's code and its
    schedule file, say) declare the same schedule: each sync would take it from the other,
    so the registry would hold whichever was synced last, flipping at every boot."""
    owners: dict[tuple[str, str], str] = {}
    for source, declarations in sources:
        for declaration in declarations:
            key = (declaration.queue, declaration.name)
            other = owners.setdefault(key, source)
            if other != source:
                raise _declared_by_both(key, other, source)


def _declared_by_both(key: tuple[str, str], other: str, source: str) -> ConfigError:
    return ConfigError(
        f"schedule {key[0]}/{key[1]} is declared by both {other} and {source}: "
        "one name belongs to one source; rename or remove one of them"
    )


# Schedules a sync kept (tasks it does not know) it names at INFO; the rest at DEBUG.
KEPT_SHOWN = 20
# Schedules a sync created it names at INFO; the rest at DEBUG, counted in one INFO line. A
# boot may create thousands, and a worker whose log is a pipe nobody reads yet (Dramatiq's
# parent, until all its processes are ready) blocks once the pipe is full.
CREATED_SHOWN = 20
# Updates, and removals, a sync names at WARNING: rarer, and what an operator looks for
# after a deploy, so more of them; the rest at DEBUG, counted in one WARNING line each
# (`emq-bridge sync --dry-run` lists a plan in full).
CHANGED_SHOWN = 50

# Names whose owners one `check_not_owned_by` call reads.
OWNER_CHUNK = 5000


def check_not_owned_by(
    repeat: Repeat, declarations: Sequence[Declaration], source: str, others: Collection[str]
) -> None:
    """Raise `ConfigError` when one of `declarations` (of `source`) is a schedule that one of
    `others` owns in the registry. `others` are sources the same process syncs whose
    declarations it did not read this time, since their stamp held (an unchanged schedule
    file): a name such a source owns is one it still declares, so `check_one_source` would
    have refused the pair. One read of the declared names' owners, before any write."""
    if not others:
        return
    by_queue: dict[str, list[str]] = {}
    for declaration in declarations:
        by_queue.setdefault(declaration.queue, []).append(declaration.name)
    for queue, names in sorted(by_queue.items()):
        for start in range(0, len(names), OWNER_CHUNK):
            chunk = names[start : start + OWNER_CHUNK]
            for name, fields in repeat.load_records(queue, chunk, ("source",)).items():
                owner = fields.get("source")
                if owner is not None and owner != source and owner in others:
                    raise _declared_by_both((queue, name), owner, source)


# A declaration's (queue, name), and its name, read in C (a sync may hold a million).
_KEY = attrgetter("queue", "name")
_NAME = attrgetter("name")
_QUEUE = attrgetter("queue")


def _check_unique(declarations: list[Declaration]) -> None:
    count = len(declarations)
    # Most syncs: distinct names, so distinct (queue, name) (a set of strings is cheaper).
    if len(set(map(_NAME, declarations))) == count or len(set(map(_KEY, declarations))) == count:
        return
    seen: set[tuple[str, str]] = set()
    for declaration in declarations:  # the first declared twice, for the error
        key = (declaration.queue, declaration.name)
        if key in seen:
            raise ConfigError(f"schedule {declaration.queue}/{declaration.name} is declared twice")
        seen.add(key)


def _checked(
    declarations: Iterable[Declaration], source: str, generation: int | None
) -> list[Declaration]:
    validate_name(source, "source")
    generation_arg(generation, source)
    wanted = list(declarations)
    _check_unique(wanted)
    return wanted


def _queues(
    repeat: Repeat, wanted: list[Declaration], prune: bool, also: Collection[str] = ()
) -> list[str]:
    """Return the queues a sync reads: the declared ones, `also`, and every registry when
    pruning."""
    queues = {d.queue for d in wanted} | set(also)
    if prune:
        queues.update(repeat.queues())
    return sorted(queues)


@without_gc
def plan_sync(
    repeat: Repeat,
    declarations: Iterable[Declaration],
    source: str,
    *,
    prune: bool = True,
    generation: int | None = None,
    stamped: bool = False,
    prune_tasks: Collection[str] | None = None,
) -> SyncPlan:
    """Compare `declarations` with the registry and return what a sync would change.

    With `generation`, a registry that holds a newer generation of `source` in any of the
    queues read gives an empty plan whose `refused_by` is that generation. `stamped` (with
    `prune`) first reads the source's write counts, so that `apply_plan` can stamp the plan
    (it starts the counters where there are none: a write, once per queue).
    """
    if stamped and not prune:
        raise ValueError("a stamped sync prunes: its stamp vouches for every queue")
    wanted = _checked(declarations, source, generation)
    server = repeat.server_identity()
    queues = _queues(repeat, wanted, prune)
    if generation is not None:
        live = max((repeat.generations(q).get(source, -1) for q in queues), default=-1)
        if live > generation:
            return SyncPlan(source, generation=generation, refused_by=live)
    counts = repeat.begin_stamp(source, queues) if stamped else None
    plan = _plan(repeat, wanted, source, queues, prune, prune_tasks)
    plan.generation = generation
    plan.counts = counts
    plan.server = server
    return plan


def _plan(
    repeat: Repeat,
    wanted: list[Declaration],
    source: str,
    queues: list[str],
    prune: bool,
    prune_tasks: Collection[str] | None = None,
) -> SyncPlan:
    plan = SyncPlan(source)
    # The stored digest covers the definition and its owner: comparing it is enough, and
    # nothing needs decoding (a boot sync of an unchanged registry stays cheap).
    parked: dict[str, set[str]] = {q: set() for q in queues}
    current = {
        (q, name): stored
        for q in queues
        for name, stored in repeat.digests(q, parked=parked[q]).items()
    }
    if not current:  # an empty registry (a first boot): everything is created
        plan.create = list(wanted)
    else:
        for declaration, key in zip(wanted, map(_KEY, wanted), strict=True):
            stored = current.get(key)
            if stored is None:
                plan.create.append(declaration)
                continue
            if stored[0] == record_digest(declaration.definition, source):
                plan.unchanged.append(declaration)
            else:
                plan.update.append(declaration)
            if key[1] in parked[key[0]]:
                plan.unpark.append(key)
    if plan.create and current:
        plan.adopted = _imported_elsewhere(repeat, plan.create, current, set(map(_KEY, wanted)))
    owned = [key for key, (_, owner) in current.items() if owner == source] if prune else []
    if owned:
        declared = set(map(_KEY, wanted))
        plan.remove = sorted(key for key in owned if key not in declared)
        if prune_tasks is not None and plan.remove:
            plan.remove, plan.kept = _of_tasks(repeat, plan.remove, prune_tasks)
    return plan


# The sources the importers write under (`import:redbeat`, `import:django-celery-beat`).
IMPORT_SOURCE_PREFIX = "import:"


def _imported_elsewhere(
    repeat: Repeat,
    created: list[Declaration],
    current: Mapping[tuple[str, str], tuple[str | None, str | None]],
    declared: set[tuple[str, str]],
) -> dict[tuple[str, str], tuple[str, str]]:
    """Return, per declaration to create, the import's registration of the same schedule in
    another queue: the same name and task, owned by an `import:` source, in a queue this sync
    read and does not declare it in, the only such one. An importer cannot know the app: it
    puts an entry that names no queue in its `--queue` (`celery`), where the app routes it to
    its own default queue; left there, both would fire every slot once the import's queue is
    pumped. Taken over, it is one schedule, as an import in the declared queue is."""
    imported: dict[str, list[tuple[str, str]]] = {}
    for (queue, name), (_, owner) in current.items():
        if owner and owner.startswith(IMPORT_SOURCE_PREFIX) and (queue, name) not in declared:
            imported.setdefault(name, []).append((queue, owner))
    if not imported:
        return {}
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for declaration in created:
        there = imported.get(declaration.name, [])
        if len(there) == 1:  # two imports of one name elsewhere: which is it? left alone
            found[(declaration.queue, declaration.name)] = there[0]
    tasks = {
        (queue, name): task
        for queue, name, task in tasks_of(repeat, [(q, n) for (_, n), (q, _) in found.items()])
    }
    adopted: dict[tuple[str, str], tuple[str, str]] = {}
    for declaration in created:  # another task under the same name is another schedule
        key = (declaration.queue, declaration.name)
        copy = found.get(key)
        task = declaration.definition.template.get("task")
        if copy is not None and task is not None and tasks.get((copy[0], key[1])) == task:
            adopted[key] = copy
    return adopted


def tasks_of(repeat: Repeat, keys: list[tuple[str, str]]) -> list[tuple[str, str, object]]:
    """Return `(queue, name, task)` for the registrations of `keys` (those whose record cannot
    be read are left out): one round trip per queue."""
    out = []
    for queue in sorted({q for q, _ in keys}):
        names = [n for q, n in keys if q == queue]
        for name, fields in repeat.load_records(queue, names).items():
            try:
                out.append((queue, name, Definition.from_fields(fields).template.get("task")))
            except EmqError:
                continue
    return out


def _relocate(repeat: Repeat, declaration: Declaration, imported: tuple[str, str]) -> bool:
    """Move the import's registration `imported` (its queue, its owner) of `declaration`'s
    schedule to the declared queue, as it is (owner, next run, pause, counters), so that the
    upsert that follows takes it over there as it would have in its own queue: the not-sooner
    rule of an interval whose phase changes, the next run of an unchanged cadence. Cancelled
    first, then created as read: a pump serving the import's queue cannot send its slot
    between the two (the copy would send it again); a crash between leaves only the
    declaration, created at the next sync from its cadence alone. False (nothing moved) when
    it changed since the plan read it, or another sync moved it first."""
    queue, owner = imported
    name = declaration.name
    try:
        found = repeat.read(queue, name)
    except (KeyError, EmqError):  # gone, or corrupt, since the plan: nothing to take over
        return False
    if found.source != owner or found.completed:
        return False
    raw = repeat.load_records(queue, [name], (*_CARRIED, "paused_next_ms", "last_due_ms"))
    fields = raw.get(name, {})
    first = fields.get("paused_next_ms", "") if found.paused else str(found.next_run_ms or "")
    if not first.isdigit():
        return False
    seed = Seed(
        first_run_ms=int(first),
        paused=found.paused,
        fired=found.fired,
        last_fired_ms=found.last_fired_ms,
        carried={k: fields[k] for k in (*_CARRIED, "last_due_ms") if k in fields},
    )
    if not repeat.cancel(queue, name, if_source=owner):
        return False  # gone or taken since it was read: another sync's move, or not ours
    result = repeat.upsert_many(
        [(declaration.queue, name, found.definition)], source=owner, seeds=[seed], keep_owners=True
    )
    if result != ["created"]:  # the declared queue has it already (another sync made it)
        return False
    log.info(
        "sync: %s/%s takes over %s/%s of %s: the same schedule, imported into queue %r",
        declaration.queue,
        name,
        queue,
        name,
        owner,
        queue,
    )
    return True


def _of_tasks(
    repeat: Repeat, keys: list[tuple[str, str]], tasks: Collection[str]
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """The registrations of `keys` whose template names one of `tasks` (read: the few a
    sync would remove), and the others with their task. One whose task cannot be read is
    left alone, unlisted: it may be another process's, and the pump parks a record it
    cannot use."""
    out, kept = [], []
    for queue, name, task in tasks_of(repeat, keys):
        if task in tasks:
            out.append((queue, name))
        else:
            kept.append((queue, name, str(task)))
    return sorted(out), sorted(kept)


@without_gc
def sync(
    repeat: Repeat,
    declarations: Iterable[Declaration],
    source: str,
    *,
    prune: bool = True,
    dry_run: bool = False,
    generation: int | None = None,
    stamp: Stamp | bool | None = None,
    prune_tasks: Collection[str] | None = None,
    unread_sources: Collection[str] = (),
    read_queues: Collection[str] = (),
    generation_sources: Collection[str] = (),
    empty_prunes: bool = True,
) -> SyncPlan:
    """Plan, then (unless `dry_run`) apply: upsert what is new or changed, cancel what is pruned.

    `empty_prunes=False` (a schedule file's sync) refuses, with `ConfigError` and before any
    schedule is written, to prune when nothing is declared (`check_not_emptied`).

    `prune_tasks` (with `prune`) removes only the source's registrations whose task is one
    of these: a process that knows only some of its source's tasks (a Dramatiq worker pool
    that imports some of the actor modules) cannot tell the others were dropped.

    The plan returned reflects what the registry answered when applied, so under concurrent
    syncs an item planned as `create` may come back as `unchanged`.

    With `generation`, the queues read are first stamped with it (refused if one holds a
    newer generation of `source`), so that no older generation can write there after the
    plan is read; every write re-checks it atomically. A refused sync writes nothing more,
    logs one WARNING and returns a plan whose `refused_by` is the newer generation. Without
    one, the sync applies whatever the registry holds (as before generations existed).

    With `stamp` (and `prune`: a stamp vouches for every queue), the queues read are stamped
    once the plan is applied, unless another writer changed the source's records meanwhile
    (see `stamped`). `stamp=True` stamps with `declarations_fingerprint`, and first looks for
    that stamp: while it holds, the registry is what this sync would leave, so nothing is read
    or written and the plan returned has every declaration unchanged (`by_stamp`). A record
    deleted by hand with `DEL` (not `cancel`) is then not recreated, nor a registry member
    lost in a queue where other schedules outnumber the loss: see `stamped`. A full sync
    puts back the member of an unchanged declared record that lost it (`restored`).

    `unread_sources`: other sources this process syncs whose declarations it skipped, their
    stamp holding; a declaration naming a schedule one of them owns is refused before any
    write (`check_not_owned_by`), as `check_one_source` refuses it when both are read.

    `read_queues`: queues to read (and stamp) besides the declared ones, whether or not they
    hold a registry yet: those another sync of the same boot is about to write, so that this
    sync's stamp covers them (a stamp holds only while it is in every queue there is).

    `generation_sources`: other sources whose declarations are of the same deploy (an app's
    two: `beat_schedule` and its decorators). With `generation`, the sync raises theirs too
    in the queues it reads, and is refused when one of them holds a newer one: an older
    deploy must not write either source once a newer one wrote one of them.
    """
    if stamp and not prune:
        raise ValueError("a stamped sync prunes: its stamp vouches for every queue")
    wanted = _checked(declarations, source, generation)
    if dry_run:
        check_not_owned_by(repeat, wanted, source, unread_sources)
        return plan_sync(
            repeat, wanted, source, prune=prune, generation=generation, prune_tasks=prune_tasks
        )
    if stamp is True:
        stamp = Stamp(declarations_fingerprint(wanted, source, generation, prune_tasks))
        if stamped(repeat, source, stamp.fingerprint) is not None:
            found = SyncPlan(source, unchanged=wanted, generation=generation, by_stamp=True)
            _log(found, {})
            return found
    check_not_owned_by(repeat, wanted, source, unread_sources)
    for again in (False, True):
        # A Redis restarted empty between the plan's reads and its writes would leave the
        # schedules the plan found unchanged unwritten, and the rest half there: the sync is
        # done again, in full (from what it finds then), once.
        server = repeat.server_identity()
        queues = _queues(repeat, wanted, prune, read_queues)
        applied = SyncPlan(source, generation=generation)
        old: dict[tuple[str, str], dict[str, str]] = {}
        try:
            if generation is not None:
                for each in (source, *generation_sources):
                    repeat.upsert_declared([], source=each, generation=generation, queues=queues)
            # Read before the plan: a write after this read moves a count, so the stamp is
            # refused.
            counts = repeat.begin_stamp(source, queues) if isinstance(stamp, Stamp) else {}
            plan = _plan(repeat, wanted, source, queues, prune, prune_tasks)
            if not empty_prunes:
                check_not_emptied(plan, len(wanted))
            old = _old_records(repeat, plan)
            _apply(repeat, plan, applied)
            if isinstance(stamp, Stamp):
                _stamp(repeat, applied, counts, stamp)
        except StaleGeneration as exc:
            applied.refused_by = exc.live
            log.warning(
                "sync %s: generation %d refused, a newer generation (%d) of %s is live "
                "in queue %s; nothing more written (deploy the newer declarations, or raise "
                "the generation)",
                source,
                exc.generation,
                exc.live,
                "this source" if exc.source == source else exc.source,
                exc.queue,
            )
        if server is None or repeat.server_identity() == server:
            break
        if again:
            raise RegistryRestarted(_RESTARTED_TWICE.format(source=source))
        log.warning(
            "sync %s: the registry's Redis restarted during the sync (another run_id); "
            "syncing again",
            source,
        )
    _log(applied, old)
    return applied


# What a sync says of a registry that restarted during it twice in a row.
_RESTARTED_TWICE = (
    "restarted during the sync of {source}, and again during its second try (another run_id "
    "each time): what it wrote may be gone, so its counts are not known to hold; sync again"
)


def check_not_emptied(plan: SyncPlan, declared: int, hint: str = "") -> None:
    """Raise `ConfigError` when `plan` declares nothing (`declared` is 0) yet removes its
    source's schedules: a schedule file emptied or cut short by a deploy would otherwise
    remove every schedule it declared before. `hint` says how to do it on purpose."""
    if declared or not plan.remove:
        return
    raise ConfigError(
        f"the schedule file declares no schedule: its sync would remove all "
        f"{len(plan.remove)} schedule(s) of source {plan.source!r} (an emptied or truncated "
        f"file?); nothing written{hint or _ON_PURPOSE}"
    )


# How a boot's refusal of an emptied file says to remove its schedules on purpose.
_ON_PURPOSE = " (to remove them on purpose: emq-bridge sync FILE --allow-empty)"


def _stamp(repeat: Repeat, applied: SyncPlan, counts: dict[str, int], stamp: Stamp) -> None:
    """Stamp the queues read with `stamp`, expecting each count to have moved by this sync's
    own writes alone (upsert and cancel count one per record they write or remove)."""
    expected = dict(counts)
    for declaration in (*applied.create, *applied.update):
        expected[declaration.queue] += 1
    for queue, _ in applied.remove:
        expected[queue] += 1
    # What the sync left of the source's schedules per queue, each with its registry member:
    # a later boot's stamp holds only while the registry has at least as many (stamps.py).
    declared = Counter(
        map(_QUEUE, itertools.chain(applied.create, applied.update, applied.unchanged))
    )
    held = repeat.write_stamps(applied.source, stamp.fingerprint, expected, stamp.summary, declared)
    if not held:
        log.info(
            "sync %s: not stamped: another writer changed its schedules during the sync; "
            "the next boot syncs in full",
            applied.source,
        )


@without_gc
def apply_plan(repeat: Repeat, plan: SyncPlan, *, stamp: Stamp | None = None) -> SyncPlan:
    """Apply `plan` as `plan_sync` returned it (one made without a generation): upsert what it
    creates or updates, cancel what it removes, log it as `sync` does, and return what was
    done. Each write re-checks the digest or the owner it changes, so a registry that moved
    since the plan was read converges as after `sync`; what `plan_sync` read is not read
    again (`emq-bridge sync` shows a plan, then applies that one). `stamp` stamps it, as
    `sync` does, when the plan was made with `stamped=True`."""
    if plan.generation is not None or plan.refused_by is not None:
        raise ValueError("a plan with a generation is applied by sync(generation=...)")
    if stamp is not None and plan.counts is None:
        raise ValueError("a stamp needs a plan made with plan_sync(stamped=True)")
    applied = SyncPlan(plan.source)
    _same_server(repeat, plan, "since its plan was read: nothing was written")
    old = _old_records(repeat, plan)
    _apply(repeat, plan, applied)
    if stamp is not None and plan.counts is not None:
        _stamp(repeat, applied, plan.counts, stamp)
    _same_server(repeat, plan, "during the sync: what its plan read may be gone")
    _log(applied, old)
    return applied


def _same_server(repeat: Repeat, plan: SyncPlan, when: str) -> None:
    """Raise `RegistryRestarted` if the registry's server is no longer the one `plan` was
    read from (`SyncPlan.server`; not known: not checked)."""
    if plan.server is not None and repeat.server_identity() != plan.server:
        raise RegistryRestarted(f"restarted {when} (another run_id); sync again")


def _apply(repeat: Repeat, plan: SyncPlan, applied: SyncPlan) -> None:
    """Upsert what `plan` creates or updates, cancel what it removes; record it in `applied`.

    A declaration created in one queue while the plan removes its name from another (its
    task's route changed: `task_routes`, a default queue) is a move: the old record is frozen
    first (`_freeze`), so that from then on only one of the two can fire, and the new one is
    created as the old one stands (`_moved_seeds`) before the old one is cancelled."""
    applied.unchanged.extend(plan.unchanged)  # nothing to send: an upsert would write nothing
    applied.kept = list(plan.kept)
    # Each upsert is atomic and re-checks the digest, so concurrent syncs converge: an item
    # planned as `create` may come back `unchanged` when another sync got there first.
    for declaration in plan.create:
        imported = plan.adopted.get((declaration.queue, declaration.name))
        if imported is not None and _relocate(repeat, declaration, imported):
            applied.adopted[(declaration.queue, declaration.name)] = imported
    moves = moves_of(plan)
    if not moves:
        _write(repeat, plan, applied, {})
        return
    frozen = _freeze(repeat, plan, moves)
    try:
        _write(repeat, plan, applied, _moved_seeds(repeat, moves), frozen)
    except StaleGeneration:
        # A newer generation is live: this move is not to happen, so what it froze fires
        # again where it is (a crash here instead leaves it to the next sync's move).
        cancelled = set(applied.remove)
        _unfreeze(repeat, [key for key in frozen if key not in cancelled])
        raise


def _write(
    repeat: Repeat,
    plan: SyncPlan,
    applied: SyncPlan,
    seeds: Mapping[tuple[str, str], Seed],
    frozen: Collection[tuple[str, str]] = (),
) -> None:
    """Upsert the creates and updates of `plan` (a created one starting from its seed, if
    any), then cancel its removals; record what each did in `applied`."""
    source, generation = plan.source, applied.generation
    buckets: dict[Synced, list[Declaration]] = {
        "created": applied.create,
        "updated": applied.update,
        "unchanged": applied.unchanged,
    }
    todo = [*plan.create, *plan.update]
    results = repeat.upsert_declared(
        todo,
        source=source,
        generation=generation,
        seeds=[seeds.get((d.queue, d.name)) for d in todo] if seeds else (),
    )
    for declaration, result in zip(todo, results, strict=True):
        if result == "restored":  # an update to what reads a plan; named as such in the log
            applied.update.append(declaration)
            applied.restored.append(declaration)
        else:
            buckets[result].append(declaration)
    for queue, name in plan.remove:
        if repeat.cancel(queue, name, if_source=source, generation=generation):
            applied.remove.append((queue, name))
        elif (queue, name) in frozen:  # another source took it since the plan: not moved
            _unfreeze(repeat, [(queue, name)])
    for queue, name in plan.unpark:
        if repeat.resume_parked(queue, name, code=(source, generation)):
            applied.unpark.append((queue, name))


# Who pauses the old record of a registration that moves queue (its `paused_by`). A sync
# that stopped between that freeze and the cancel leaves it paused so: the next sync, which
# plans the same move, carries it as the move's (its next run), not as a pause.
MOVING_BY = "emq-bridge sync (moving queue)"

# What a paused registration that moves queue takes along as its pause (besides `paused`
# and its next run): the note, author and instant, and the reason it was parked.
_PAUSE_STATE = (
    *("paused_ms", "paused_note", "paused_by"),
    *("parked_reason", "parked_ms", "parked_dispatch"),
)
# Its counters and its last outcome. Not what names its occurrences (the last id, the one
# in flight): their history stays behind.
_RUN_STATE = (
    *("missed", "failures", "skipped", "lost"),
    *("last_status", "last_error", "last_started_ms", "last_finished_ms", "last_duration_ms"),
    *("last_success_ms", "last_success_due_ms", "last_failure_ms"),
)
# What an import's registration taken over in another queue carries (`_relocate`).
_CARRIED = (*_PAUSE_STATE, *_RUN_STATE)
# What every moved registration carries: its run state, the last slot it fired (no slot at
# or before it fires again) and the runs of slots fired live (a backfill skips them).
_MOVED_STATE = (*_RUN_STATE, "last_due_ms", "run", "runs")
_MOVE_FIELDS = (
    *("paused", "paused_next_ms", "cadence_digest", "fired", "last_fired_ms"),
    *_PAUSE_STATE,
    *_MOVED_STATE,
    *("limit", "remaining", "completed", "completed_ms"),
)


def moves_of(plan: SyncPlan) -> list[tuple[Declaration, str]]:
    """Return the created declarations whose name the plan removes from another queue, each
    with that queue (the first, should it be removed from several)."""
    if not (plan.remove and plan.create):
        return []
    removed: dict[str, str] = {}
    for queue, name in plan.remove:
        removed.setdefault(name, queue)
    return [(d, removed[d.name]) for d in plan.create if removed.get(d.name, d.queue) != d.queue]


def _freeze(
    repeat: Repeat, plan: SyncPlan, moves: list[tuple[Declaration, str]]
) -> set[tuple[str, str]]:
    """Pause (by `MOVING_BY`) every record `plan` removes whose name `moves` creates
    elsewhere, and return those that exist. The pause parks the next run in the record and
    the score at +inf, atomically, so a pump cannot claim a slot of the old record once its
    state is read for the new one; an occurrence already leased or in flight goes on. One
    paused by someone else stays paused by them (and moves paused)."""
    target = {d.name: d.queue for d, _ in moves}
    frozen: set[tuple[str, str]] = set()
    for queue, name in plan.remove:
        new_queue = target.get(name)
        if new_queue is None:
            continue
        try:
            repeat.pause(queue, name, note=f"moving to queue {new_queue}", by=MOVING_BY)
        except KeyError:  # gone since the plan: another sync moved it
            continue
        frozen.add((queue, name))
    return frozen


def _unfreeze(repeat: Repeat, keys: Sequence[tuple[str, str]]) -> None:
    """Resume those of `keys` that the move's own pause still holds, handing the slots that
    passed while frozen to their misfire policy (`resume(catchup=True)`)."""
    by_queue: dict[str, list[str]] = {}
    for queue, name in keys:
        by_queue.setdefault(queue, []).append(name)
    for queue, names in sorted(by_queue.items()):
        for name, record in repeat.load_records(queue, names, ("paused", "paused_by")).items():
            if record.get("paused") != "1" or record.get("paused_by") != MOVING_BY:
                continue
            try:
                repeat.resume(queue, name, catchup=True)
            except (KeyError, EmqError) as exc:
                log.warning(
                    "sync: %s/%s stays paused by its move, which did not happen (%s); "
                    "resume it by hand",
                    queue,
                    name,
                    exc,
                )


def _moved_seeds(
    repeat: Repeat, moves: list[tuple[Declaration, str]]
) -> dict[tuple[str, str], Seed]:
    """Return, per moved declaration, the seed of its new record: the old record as the
    freeze left it (read after it, so nothing fires from it any more). None for one whose
    old record is gone (another sync moved it: the upsert finds the new one)."""
    by_queue: dict[str, list[str]] = {}
    for declaration, old_queue in moves:
        by_queue.setdefault(old_queue, []).append(declaration.name)
    old = {
        (queue, name): record
        for queue, names in by_queue.items()
        for start in range(0, len(names), OWNER_CHUNK)
        for name, record in repeat.load_records(
            queue, names[start : start + OWNER_CHUNK], _MOVE_FIELDS
        ).items()
    }
    now_ms = repeat.server_time_ms()
    seeds: dict[tuple[str, str], Seed] = {}
    for declaration, old_queue in moves:
        record = old.get((old_queue, declaration.name))
        if record:
            seeds[(declaration.queue, declaration.name)] = _moved_seed(
                record, declaration.definition, now_ms
            )
    return seeds


def _moved_seed(record: Mapping[str, str], definition: Definition, now_ms: int) -> Seed:
    """The seed of a registration moved to `definition`'s queue from its frozen `record`.

    Its next run is the one the freeze kept when the cadence is the same, else the new
    cadence's first after now and after the last slot fired (`immediately` does not fire
    again); its pause only when someone else than the move paused it."""
    by_user = record.get("paused") == "1" and record.get("paused_by") != MOVING_BY
    same = record.get("cadence_digest") == definition.cadence_digest
    kept = _int_field(record, "paused_next_ms")  # None for +inf
    if same and kept is not None:
        first = kept
    else:  # a completed one parked +inf: its new cadence's run, which claim then completes
        last_due = _int_field(record, "last_due_ms")
        start = now_ms if last_due is None else max(now_ms, last_due + 1)
        first = definition.first_run(start, created=False)
    carried = {k: record[k] for k in _MOVED_STATE if k in record}
    if by_user:
        carried.update((k, record[k]) for k in _PAUSE_STATE if k in record)
    carried.update(_bounds_state(record, definition, same))
    return Seed(
        first_run_ms=first,
        paused=by_user,
        fired=_int_field(record, "fired") or 0,
        last_fired_ms=_int_field(record, "last_fired_ms"),
        carried=carried,
    )


def _bounds_state(record: Mapping[str, str], definition: Definition, same: bool) -> dict[str, str]:
    """The runs left and the completion a moved `record` keeps under `definition`, as an
    upsert of the edit would leave them: a changed limit moves `remaining` by the change
    (upsert.lua's `rebase_limit`); it stays completed while that still holds (no run left;
    an end or last instant unchanged, `same` cadence), else the new bounds decide."""
    out: dict[str, str] = {}
    limit, old_limit = definition.bounds.limit, _int_field(record, "limit")
    left = _int_field(record, "remaining")
    if limit is None or old_limit is None or left is None:
        left = None  # the created record's own: the new limit whole, or none
    else:
        left += limit - old_limit
        out["remaining"] = str(left)
    reason = record.get("completed")
    if reason and ((left is not None and left <= 0) if reason == "limit" else same):
        out["completed"] = reason
        if "completed_ms" in record:
            out["completed_ms"] = record["completed_ms"]
    return out


def _int_field(record: Mapping[str, str], key: str) -> int | None:
    """`record[key]` as an int, None when absent or not a whole number (edited by hand)."""
    value = record.get(key, "")
    digits = value[1:] if value.startswith("-") else value
    ok = digits.isascii() and digits.isdigit() and len(digits) <= 19  # int() caps digits
    return int(value) if ok else None


def _old_records(repeat: Repeat, plan: SyncPlan) -> dict[tuple[str, str], dict[str, str]]:
    """Read the records `plan` is about to update or remove, for the WARNING lines `_log`
    writes of them; nothing when those lines are not logged (`emq-bridge sync` shows its own
    diff)."""
    if not log.isEnabledFor(logging.WARNING):
        return {}
    by_queue: dict[str, list[str]] = {}
    for queue, name in [*((d.queue, d.name) for d in plan.update), *plan.remove]:
        by_queue.setdefault(queue, []).append(name)
    fields = (*DEFINITION_FIELDS, "source")
    old = {
        (queue, name): record
        for queue, names in by_queue.items()
        for name, record in repeat.load_records(queue, names, fields).items()
    }
    for (queue, name), (imported_queue, _) in plan.adopted.items():  # read where it is now
        record = repeat.load_records(imported_queue, [name], fields).get(name)
        if record:
            old[(queue, name)] = record
    return old


# (`cadence_label`: a Celery custom schedule, stored as a placeholder interval it names.)
_CADENCE_FIELDS = (
    "every_ms",
    "anchor",
    "cron",
    "tz",
    "day_and",
    "offset_ms",
    "at",
    "cadence_label",
)
_BOUNDS_FIELDS = ("start_ms", "end_ms", "limit", "immediately")


def _bounds_words(fields: Mapping[str, str]) -> str:
    try:
        return Bounds.from_fields(fields).describe() or "none"
    except EmqError:  # only for the log line
        return "unreadable"


def _described(record: dict[str, str]) -> str:
    try:
        return Definition.from_fields(record).describe_cadence()
    except (EmqError, ValueError, KeyError):  # only for the log line: say so, do not fail
        return "an unreadable cadence"


def _changes(record: dict[str, str], declaration: Declaration, source: str) -> str:
    """Say what an update changes: cadence (old -> new), template, misfire, policies, labels,
    owner."""
    new = declaration.definition.to_fields()
    changes = []
    if any(record.get(f) != new.get(f) for f in _CADENCE_FIELDS):
        described = declaration.definition.describe_cadence()
        changes.append(f"{_described(record)} -> {described}")
    if any(record.get(f) != new.get(f) for f in _BOUNDS_FIELDS):
        changes.append(f"bounds {_bounds_words(record)} -> {_bounds_words(new)}")
    if record.get("template") != new.get("template"):
        changes.append("template changed")
    if record.get("misfire") != new.get("misfire"):
        changes.append(f"misfire {record.get('misfire')} -> {new.get('misfire')}")
    for key in ("catchup_window", "catchup_max"):  # ms / a count; absent is the default
        if record.get(key) != new.get(key):
            changes.append(f"{key} {record.get(key) or '-'} -> {new.get(key) or '-'}")
    if record.get("overlap") != new.get("overlap"):
        changes.append(
            f"overlap {record.get('overlap') or 'allow'} -> {new.get('overlap') or 'allow'}"
        )
    if record.get("pause_after_failures") != new.get("pause_after_failures"):
        before = record.get("pause_after_failures") or "never"
        changes.append(
            f"pause after failures {before} -> {new.get('pause_after_failures') or 'never'}"
        )
    if record.get("labels") != new.get("labels"):
        changes.append(f"labels {record.get('labels') or '{}'} -> {new.get('labels') or '{}'}")
    if record.get("source") != source:
        changes.append(f"owner {record.get('source') or '(none)'} -> {source}")
    return ", ".join(changes) or "rewritten"


def _log(applied: SyncPlan, old: dict[tuple[str, str], dict[str, str]]) -> None:
    """Log a sync: updates and removals at WARNING, creations at INFO, the rest at DEBUG.

    Only what this sync wrote is logged as a change: of many workers booting at once, the
    one whose upsert changed a schedule logs it, the others see it unchanged. The first
    `CHANGED_SHOWN` updates and removals, and `CREATED_SHOWN` creations, are named at their
    level; the rest at DEBUG, with one line saying how many more.
    """
    source = applied.source
    debug = log.isEnabledFor(logging.DEBUG)
    # A queue move is one change, said as one: not a removal (which reads as a schedule lost)
    # and a creation.
    moves = moves_of(applied)
    moved_from = {(queue, d.name) for d, queue in moves}
    moved_to = {(d.queue, d.name) for d, _ in moves}
    for index, (d, queue) in enumerate(moves):
        level = logging.WARNING if index < CHANGED_SHOWN else logging.DEBUG
        log.log(level, "sync %s: > %s/%s moved to queue %s", source, queue, d.name, d.queue)
    _more(moves, CHANGED_SHOWN, logging.WARNING, source, "moved")
    removed = [key for key in applied.remove if key not in moved_from]
    created = [d for d in applied.create if (d.queue, d.name) not in moved_to]
    _log_restored(applied)
    _log_unparked(applied)
    updated = applied.update
    if applied.restored:  # named in their own line, not as updates
        restored = {(d.queue, d.name) for d in applied.restored}
        updated = [d for d in updated if (d.queue, d.name) not in restored]
    for index, d in enumerate(updated):
        level = logging.WARNING if index < CHANGED_SHOWN else logging.DEBUG
        if level == logging.WARNING or debug:
            record = old.get((d.queue, d.name), {})
            changes = _changes(record, d, source)
            log.log(level, "sync %s: ~ %s/%s  %s", source, d.queue, d.name, changes)
    _more(updated, CHANGED_SHOWN, logging.WARNING, source, "updated")
    for index, (queue, name) in enumerate(removed):
        level = logging.WARNING if index < CHANGED_SHOWN else logging.DEBUG
        if level == logging.WARNING or debug:
            gone = old.get((queue, name))
            was = f"  (was {_described(gone)})" if gone else ""
            log.log(level, "sync %s: - %s/%s%s", source, queue, name, was)
    _more(removed, CHANGED_SHOWN, logging.WARNING, source, "removed")
    if log.isEnabledFor(logging.INFO):  # a boot sync may create a million: describe few
        for index, d in enumerate(created if debug else created[:CREATED_SHOWN]):
            level = logging.INFO if index < CREATED_SHOWN else logging.DEBUG
            described = d.definition.cadence.describe()
            log.log(level, "sync %s: + %s/%s  %s", source, d.queue, d.name, described)
        _more(created, CREATED_SHOWN, logging.INFO, source, "created")
    if debug:
        for d in applied.unchanged:
            log.debug("sync %s: = %s/%s", source, d.queue, d.name)
    # Pools of one source that know other tasks keep each other's at every sync in full:
    # the first few said at INFO, the rest at DEBUG.
    for index, (queue, name, task) in enumerate(applied.kept):
        log.log(
            logging.INFO if index < KEPT_SHOWN else logging.DEBUG,
            "sync %s: kept %s/%s: its task %s is not one this process knows, so it cannot "
            "tell the schedule was dropped (`emq-bridge remove` takes one whose task is gone)",
            source,
            queue,
            name,
            task,
        )
    _more(applied.kept, KEPT_SHOWN, logging.INFO, source, "kept")
    log.info(
        "sync %s: %d created, %d updated%s, %d unchanged, %d removed%s%s%s",
        source,
        len(applied.create),
        len(applied.update),
        f" ({len(applied.restored)} of them restored)" if applied.restored else "",
        len(applied.unchanged),
        len(applied.remove),
        f" ({len(moves)} of each a queue move)" if moves else "",
        f", {len(applied.kept)} kept" if applied.kept else "",
        _generation_note(applied),
    )


def _log_unparked(applied: SyncPlan) -> None:
    """Say, in one WARNING line, which parked schedules the sync resumed (`SyncPlan.unpark`):
    the first `CHANGED_SHOWN` named, the rest counted."""
    if not applied.unpark:
        return
    names = [f"{q}/{n}" for q, n in applied.unpark[:CHANGED_SHOWN]]
    more = len(applied.unpark) - len(names)
    log.warning(
        "sync %s: %d parked schedule(s) resumed: %s%s (a pump whose code could not send them "
        "parked them; this code declares them)",
        applied.source,
        len(applied.unpark),
        ", ".join(names),
        f" and {more} more" if more else "",
    )


def _log_restored(applied: SyncPlan) -> None:
    """Say, in one WARNING line, which schedules the sync put back in their registry: their
    record was there (unchanged, or updated now) but their member was missing (evicted, or
    removed by hand), so nothing fired them. The first `CHANGED_SHOWN` are named, the rest
    counted."""
    if not applied.restored:
        return
    names = [f"{d.queue}/{d.name}" for d in applied.restored[:CHANGED_SHOWN]]
    more = len(applied.restored) - len(names)
    log.warning(
        "sync %s: %d schedule(s) restored: %s%s (their record was there, but their "
        "registry member was missing: evicted, or removed by hand, so nothing fired them; "
        "each runs at its cadence's next slot, the slots passed meanwhile unsent; a changed "
        "definition was written too)",
        applied.source,
        len(applied.restored),
        ", ".join(names),
        f" and {more} more" if more else "",
    )


def _more(items: Sequence[object], shown: int, level: int, source: str, what: str) -> None:
    """Say how many of `items` were logged at DEBUG only, past the first `shown`."""
    if len(items) > shown:
        log.log(level, "sync %s: %d more %s (listed at DEBUG)", source, len(items) - shown, what)


def _generation_note(applied: SyncPlan) -> str:
    if applied.by_stamp:
        return " (its stamp holds: nothing read)"
    if applied.generation is None:
        return ""
    if applied.refused_by is None:
        return f" (generation {applied.generation})"
    return f" (generation {applied.generation}, refused: {applied.refused_by} is live)"
