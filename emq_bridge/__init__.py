"""emq-bridge: recurring schedules in Redis, pumped into Celery or Dramatiq.

The store is EchoMQ's Repeat registry: one sorted-set member per registration, scored by
its next run in epoch ms, and one hash per registration holding `every_ms` and `template`.
"""

from .backfill import Backfill
from .bounds import Bounds
from .cadence import (
    At,
    Cadence,
    CatchUp,
    Cron,
    Every,
    advance,
    catch_up,
    next_runs,
    parse_every,
    parse_every_ms,
)
from .calendars import Calendar
from .definition import Declaration, Definition, Schedule, define
from .dispatch import Dispatcher, ListPushDispatcher
from .errors import (
    BrokerUnreachable,
    ConfigError,
    CorruptRecord,
    DispatchError,
    EmqError,
    InvalidName,
    PermanentDispatchError,
    RegistryError,
    RegistryOutOfMemory,
    RegistryRestarted,
    RegistryUnavailable,
    ScheduleError,
    UnknownRegistration,
)
from .events import PumpEvents, Tick
from .heartbeat import PumpInfo
from .keys import DEFAULT_PREFIX, QueueKeys, validate_name
from .occurrence import Occurrence, occurrence_id
from .outcome import HistoryEntry, Report
from .pump import Pump
from .registry import Registered, Registration, Repeat, Upserted
from .reporting import Reporter
from .sync import SyncPlan, apply_plan, plan_sync, sync
from .template import MAX_TEMPLATE_BYTES, MAX_TEMPLATE_DEPTH, TaskTemplate

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_TEMPLATE_BYTES",
    "MAX_TEMPLATE_DEPTH",
    "At",
    "Backfill",
    "Bounds",
    "BrokerUnreachable",
    "Cadence",
    "Calendar",
    "CatchUp",
    "ConfigError",
    "CorruptRecord",
    "Cron",
    "Declaration",
    "Definition",
    "DispatchError",
    "Dispatcher",
    "EmqError",
    "Every",
    "HistoryEntry",
    "InvalidName",
    "ListPushDispatcher",
    "Occurrence",
    "PermanentDispatchError",
    "Pump",
    "PumpEvents",
    "PumpInfo",
    "QueueKeys",
    "Registered",
    "Registration",
    "RegistryError",
    "RegistryOutOfMemory",
    "RegistryRestarted",
    "RegistryUnavailable",
    "Repeat",
    "Report",
    "Reporter",
    "Schedule",
    "ScheduleError",
    "SyncPlan",
    "TaskTemplate",
    "Tick",
    "UnknownRegistration",
    "Upserted",
    "advance",
    "apply_plan",
    "catch_up",
    "define",
    "next_runs",
    "occurrence_id",
    "parse_every",
    "parse_every_ms",
    "plan_sync",
    "sync",
    "validate_name",
]

__version__ = "0.1.0"
