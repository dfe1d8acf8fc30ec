"""emq-bridge: recurring schedules in Redis, pumped into Celery or Dramatiq.

The store is EchoMQ's Repeat registry: one sorted-set member per registration, scored by
its next run in epoch ms, and one hash per registration holding `every_ms` and `template`.
"""

from .cadence import Cadence, Cron, Every, advance, next_runs, parse_every_ms
from .definition import MAX_TEMPLATE_BYTES, Definition, define
from .dispatch import Dispatcher, ListPushDispatcher
from .errors import (
    ConfigError,
    CorruptRecord,
    DispatchError,
    EmqError,
    InvalidName,
    RegistryError,
    RegistryUnavailable,
    ScheduleError,
)
from .keys import DEFAULT_PREFIX, QueueKeys, validate_name
from .pump import Pump, Tick
from .registry import Occurrence, Registered, Registration, Repeat, Upserted, occurrence_id
from .sync import Declaration, SyncPlan, plan_sync, sync

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_TEMPLATE_BYTES",
    "Cadence",
    "ConfigError",
    "CorruptRecord",
    "Cron",
    "Declaration",
    "Definition",
    "DispatchError",
    "Dispatcher",
    "EmqError",
    "Every",
    "InvalidName",
    "ListPushDispatcher",
    "Occurrence",
    "Pump",
    "QueueKeys",
    "Registered",
    "Registration",
    "RegistryError",
    "RegistryUnavailable",
    "Repeat",
    "ScheduleError",
    "SyncPlan",
    "Tick",
    "Upserted",
    "advance",
    "define",
    "next_runs",
    "occurrence_id",
    "parse_every_ms",
    "plan_sync",
    "sync",
    "validate_name",
]

__version__ = "0.1.0"
