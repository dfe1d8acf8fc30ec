"""The names of emq-bridge's Celery settings: as messages give them (`setting_name`,
`setting_hint`), and the keys an app holds that no one reads (`warn_unread_settings`)."""

from __future__ import annotations

import difflib
import logging
import threading
import weakref
from typing import Any

from celery import Celery

from ..urls import url_has_password

__all__ = [
    "SETTINGS",
    "exposed_password",
    "setting_hint",
    "setting_name",
    "unread_settings",
    "warn_unread_settings",
]

log = logging.getLogger("emq_bridge.celery")

# Every setting emq-bridge reads (docs/celery.md's table).
SETTINGS = frozenset(
    {
        "emq_bridge_redis_url",
        "emq_bridge_redis_password",
        "emq_bridge_redis_use_ssl",
        "emq_bridge_prefix",
        "emq_bridge_source",
        "emq_bridge_generation",
        "emq_bridge_queues",
        "emq_bridge_schedule_file",
        "emq_bridge_check_tasks",
        "emq_bridge_pipelined",
        "emq_bridge_report",
        "emq_bridge_history_size",
        "emq_bridge_heartbeat_s",
        "emq_bridge_boot_stamp",
    }
)
_PREFIX = "emq_bridge_"


def _namespace(app: Celery) -> str | None:
    namespace = getattr(app, "namespace", None)
    return namespace if isinstance(namespace, str) and namespace else None


def setting_name(app: Celery, name: str) -> str:
    """`name` as messages give it: with the name it has in the settings module too when the
    app reads one under a namespace (`config_from_object(..., namespace="CELERY")`, a Django
    project: `CELERY_EMQ_BRIDGE_REPORT`)."""
    namespace = _namespace(app)
    if namespace:
        return f"{name} ({namespace}_{name.upper()} in the settings)"
    return name


def setting_hint(app: Celery, name: str, value: str) -> str:
    """ "set <the setting> = <value>", as this app is configured: the settings module's name
    under a namespace (`CELERY_EMQ_BRIDGE_REDIS_URL = ... in the settings`), else `app.conf`."""
    namespace = _namespace(app)
    if namespace:
        return f"set {namespace}_{name.upper()} = {value} in the settings"
    return f"set app.conf.{name} = {value}"


def unread_settings(app: Celery) -> list[str]:
    """What is wrong with the app's configuration keys that look like emq-bridge's and that
    emq-bridge never reads, one sentence each: an unknown `emq_bridge_*` name (a misspelling,
    its likely meaning named), or a known one under a key the app does not read it from (a
    Django project's `EMQ_BRIDGE_PREFIX` beside `namespace="CELERY"`, which reads
    `CELERY_EMQ_BRIDGE_PREFIX`)."""
    conf = app.conf
    namespace = _namespace(app)
    spelled = f"{namespace}_{_PREFIX}".upper() if namespace else None
    found = []
    for key in list(conf.keys()):
        if not isinstance(key, str):
            continue
        if spelled is not None and key.upper().startswith(spelled):
            name, ours = key[len(namespace or "") + 1 :].lower(), True
        elif key.startswith(_PREFIX):  # app.conf's own spelling
            name, ours = key, True
        elif key.upper().startswith(_PREFIX.upper()):
            # Another program's variable may start so (`EMQ_BRIDGE_WEB_TOKEN`, which the
            # `web` command reads): named only when it is one of these settings, misplaced.
            name, ours = key.lower(), False
        else:
            continue
        if name not in SETTINGS:
            if ours:
                close = difflib.get_close_matches(name, SETTINGS, n=1)
                meant = f" (did you mean {setting_name(app, close[0])}?)" if close else ""
                found.append(f"{key} is not a setting of emq-bridge's, and is ignored{meant}")
            continue
        try:
            value, given = conf.get(name), _given(conf, key)
            read = value is given or value == given
        except Exception:  # a value that cannot be compared: not ours to judge
            continue
        if read:
            continue
        if spelled is not None and key == f"{namespace}_{name.upper()}":
            # The settings module's own spelling, overridden (`app.conf.update`,
            # `add_defaults`): the value itself is not shown (it may be a password).
            found.append(
                f"{key} does not apply: this app's {name} is set elsewhere too "
                "(app.conf.update, add_defaults), and that one applies"
            )
            continue
        found.append(
            f"{key} is not read: this app reads {setting_name(app, name)}, which "
            + ("is not set" if value is None else "is set as well (that one applies)")
        )
    return found


def _given(conf: Any, key: str) -> Any:
    """The value `key` holds where it was given (Celery's `conf[key]` may answer another
    key's: under a namespace, `EMQ_BRIDGE_PREFIX` reads `CELERY_EMQ_BRIDGE_PREFIX`)."""
    for layer in conf.maps:
        if key in layer:
            return layer[key]
    return conf[key]


# The apps warned about already (a beat and a worker's hooks both ask).
_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()
_LOCK = threading.Lock()


def exposed_password(app: Celery) -> str | None:
    """A sentence when `emq_bridge_redis_url` holds a password: Celery shows that setting in
    clear (`celery report`, `inspect conf`, Flower), not `emq_bridge_redis_password`."""
    url = app.conf.get("emq_bridge_redis_url")
    if not isinstance(url, str) or not url_has_password(url):
        return None
    return (
        f"{setting_name(app, 'emq_bridge_redis_url')} holds a password, which celery report, "
        "celery inspect conf and Flower show in clear: give it in "
        f"{setting_name(app, 'emq_bridge_redis_password')} instead (masked)"
    )


def warn_unread_settings(app: Celery) -> None:
    """Log a WARNING, once per app, for each key `unread_settings` finds (a misspelt or
    misplaced setting is otherwise silently ignored: the default applies), and for a
    password in the registry's URL (`exposed_password`)."""
    with _LOCK:
        if app in _WARNED:
            return
        _WARNED.add(app)
    try:
        found = unread_settings(app)
        exposed = exposed_password(app)
    except Exception as exc:  # a configuration that cannot be listed: never stop a start
        log.debug("emq-bridge: the settings could not be listed: %s", exc)
        return
    for sentence in [*found, *([exposed] if exposed else [])]:
        log.warning("emq-bridge: %s", sentence)
