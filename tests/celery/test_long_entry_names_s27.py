"""Long `beat_schedule` keys. Celery keys an unnamed `add_periodic_task` by the signature's
repr, which long args make longer than a registration name may be (200 bytes): such a key
gets a name cut short with a digest of the whole key, the same at every start (Celery's beat
takes any key; `-S emq` refused to start, session 27's Celery idioms probe). An error about an
entry quotes its key clipped: a 100,000-character key gave a 100 KB line (the fuzz probe)."""

from __future__ import annotations

import pytest
from celery import Celery

from emq_bridge.celery import app_schedule
from emq_bridge.errors import ConfigError
from emq_bridge.keys import MAX_NAME_BYTES


def unchecked_app(name: str) -> Celery:
    app = Celery(name, set_as_current=False)
    app.conf.update(emq_bridge_check_tasks=False)
    return app


def test_an_unnamed_add_periodic_task_with_long_args_gets_a_stable_short_name() -> None:
    def names() -> list[str]:
        app = unchecked_app("long")

        @app.task(name="proj.process", shared=False)  # type: ignore[untyped-decorator]
        def process(items: list[int]) -> None: ...

        @app.on_after_configure.connect  # type: ignore[untyped-decorator]
        def schedule(sender: Celery, **_: object) -> None:
            sender.add_periodic_task(60.0, process.s(list(range(60))))  # no name: its repr
            sender.add_periodic_task(60.0, process.s(list(range(61))))

        app.loader.import_default_modules()
        return sorted(d.name for d in app_schedule(app).entries if d.name.startswith("proj."))

    first = names()
    assert len(first) == 2 and first == names()  # the same names at every start
    for name in first:
        assert len(name.encode()) <= MAX_NAME_BYTES
        assert name.startswith("proj.process([0,_1,_2,") and "~" in name


def test_an_error_names_a_long_key_clipped() -> None:
    app = unchecked_app("clipped")
    key = "k" * 100_000
    app.conf.beat_schedule = {key: {"task": "proj.run", "schedule": "every minute"}}
    with pytest.raises(ConfigError) as caught:
        app_schedule(app)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message[:500]
    assert message.startswith("beat_schedule['kkkk") and "(100000 characters)" in message


def test_a_key_that_is_no_string_is_named_by_its_type() -> None:
    app = unchecked_app("typed")
    app.conf.beat_schedule = {None: {"task": "proj.run", "schedule": 60.0}}
    with pytest.raises(ConfigError, match=r"^beat_schedule keys must be non-empty strings, got"):
        app_schedule(app)
