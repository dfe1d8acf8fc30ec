"""Celery integration: a drop-in `celery beat` scheduler, a dispatcher, a decorator, boot sync.

```python
app.conf.beat_scheduler = "emq_bridge.celery:RepeatScheduler"   # or: celery beat -S emq
app.conf.emq_bridge_redis_url = "redis://localhost:6379/0"       # default: the Redis broker

@recurring(cron="0 9 * * *", tz="Europe/Paris")
@app.task
def digest() -> None: ...
```

Settings (all optional, in `app.conf`):

* `emq_bridge_redis_url`: where the registry lives; default the broker URL when the broker
  is Redis (`redis://`, `rediss://`, `redis+socket://`), else required.
* `emq_bridge_prefix`: key prefix, default `"emq"`.
* `emq_bridge_source`: owner tag of this app's schedules, default `"celery.<app.main>"`.
* `emq_bridge_queues`: extra queues to pump (registrations added at runtime elsewhere).
* `emq_bridge_schedule_file`: a TOML schedule file (`emq_bridge.config`) synced at boot.
* `emq_bridge_check_tasks`: refuse unknown task names at boot, default True.
* `emq_bridge_pipelined`: send through `PipelinedCeleryDispatcher` (the opt-in fast path
  on a Redis broker), default False.
* `emq_bridge_report`: workers report what became of each task emq-bridge sent (started,
  succeeded, failed, retrying, revoked) to the registry, default True. The overlap
  policies and `pause_after_failures` rely on it.
* `emq_bridge_history_size`: occurrences each registration's history keeps, default 50.
* `emq_bridge_heartbeat_s`: how often a worker heartbeats its running occurrences, default
  10; one silent for 3 heartbeats (its worker killed) is marked lost.
* `emq_bridge_boot_stamp`: an unchanged beat restart skips converting and syncing its
  schedules (the registry holds a stamp of the last sync), default True.

Each occurrence is sent as a real task: `task_id` is the occurrence id, the headers carry
`celery_beat_task` (as Celery's beat sets), `emq_due_ms` (the nominal time, read it with
`nominal_time(self.request)`), `emq_schedule` (`"<queue>/<name>"`), and the previous-run
context (`previous_nominal_time(self.request)`, `last_success_time(self.request)`).

Reporting is done by Celery signal receivers connected when this package is imported (the
app module does when it uses `@recurring` or any name of it; otherwise add
`"emq_bridge.celery"` to `app.conf.imports`); see `emq_bridge.celery.reporting`. In a test
whose tasks run eagerly (`task_always_eager`), `report_to(app, repeat)` sends their reports
to the test's registry.
"""

from __future__ import annotations

try:
    import celery as _celery  # noqa: F401  # only to say which extra is missing
except ImportError as exc:  # pragma: no cover - exercised without celery installed
    raise ImportError("emq_bridge.celery needs Celery: pip install 'emq-bridge[celery]'") from exc

from . import worker_beat  # noqa: F401  # connects its `worker -B -S emq` warning
from .beat import BeatRefused, RepeatScheduler
from .declare import AppSchedule, app_schedule, recurring, registry_url, repeat_for, sync_app
from .dispatch import (
    CeleryDispatcher,
    last_success_time,
    nominal_due_ms,
    nominal_time,
    previous_nominal_time,
)
from .pipelined import PipelinedCeleryDispatcher
from .reporting import report_to, reporter_for
from .target import load_target

__all__ = [
    "AppSchedule",
    "BeatRefused",
    "CeleryDispatcher",
    "PipelinedCeleryDispatcher",
    "RepeatScheduler",
    "app_schedule",
    "last_success_time",
    "load_target",
    "nominal_due_ms",
    "nominal_time",
    "previous_nominal_time",
    "recurring",
    "registry_url",
    "repeat_for",
    "report_to",
    "reporter_for",
    "sync_app",
]
