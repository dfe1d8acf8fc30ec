"""Which Celery dispatch failures are permanent, and `add --celery SPEC` checking the task.

A template with no usable task can never be sent: `PermanentDispatchError`, and the pump
parks its registration. A task name the app does not know is NOT permanent by default:
Celery sends by name, and a worker of another service may define it (Celery's own beat does
the same); `CeleryDispatcher(app, known_tasks_only=True)` makes it permanent.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from emq_bridge import Occurrence, Pump, Repeat, occurrence_id
from emq_bridge.celery import CeleryDispatcher
from emq_bridge.cli import cli
from emq_bridge.errors import PermanentDispatchError


def occurrence(template: dict[str, object]) -> Occurrence:
    return Occurrence(
        queue="q",
        name="n",
        due_ms=0,
        id=occurrence_id("emq", "q", "n", 0),
        template=template,
        released_ms=0,
    )


@pytest.fixture
def app() -> Celery:
    app = Celery("pf", broker="memory://")
    app.conf.update(result_backend=None)

    @app.task(name="pf.known", shared=False)  # type: ignore[untyped-decorator]
    def known() -> None: ...

    return app


def test_a_template_without_a_task_is_a_permanent_failure(app: Celery) -> None:
    with pytest.raises(PermanentDispatchError, match="task"):
        CeleryDispatcher(app).dispatch(occurrence({"args": []}))


def test_an_unknown_task_is_sent_by_name_unless_known_tasks_only(app: Celery) -> None:
    CeleryDispatcher(app).dispatch(occurrence({"task": "other.service.task"}))  # no error
    with pytest.raises(PermanentDispatchError, match=r"'other\.service\.task' is not a task"):
        CeleryDispatcher(app, known_tasks_only=True).dispatch(
            occurrence({"task": "other.service.task"})
        )
    CeleryDispatcher(app, known_tasks_only=True).dispatch(occurrence({"task": "pf.known"}))


def test_the_pump_parks_a_registration_whose_template_has_no_task_and_sends_its_neighbour(
    app: Celery, repeat: Repeat, client: redis.Redis
) -> None:
    now = repeat.server_time_ms()
    repeat.register("q", "fine", every="1h", template={"task": "pf.known"}, now_ms=now - 3_600_000)
    repeat.register("q", "bad", every="1h", template={"task": "t"}, now_ms=now - 3_600_000)
    client.hset(repeat.keys("q").record("bad"), "template", '{"args": []}')  # edited by hand
    tick = Pump(repeat, ["q"], CeleryDispatcher(app)).run_once()
    assert [o.name for o in tick.dispatched] == ["fine"] and tick.parked == ["bad"]
    bad = repeat.get("q", "bad")
    assert bad is not None and bad.parked_reason is not None
    assert bad.parked_reason.startswith("its template cannot be sent")
    assert repeat.leases("q") == []


@pytest.mark.parametrize(
    "options", [{"queue": 5}, {"exchange": {"name": "x"}}, {"routing_key": 1.5}]
)
def test_a_routing_option_that_is_not_a_name_is_a_permanent_failure_and_is_parked(
    app: Celery, repeat: Repeat, options: dict[str, object]
) -> None:
    with pytest.raises(PermanentDispatchError, match="must be a name"):
        CeleryDispatcher(app).dispatch(occurrence({"task": "pf.known", "options": options}))
    now = repeat.server_time_ms()
    template = {"task": "pf.known", "options": options}
    repeat.register("q", "bad", every="1h", template=template, now_ms=now - 3_600_000)
    tick = Pump(repeat, ["q"], CeleryDispatcher(app)).run_once()
    assert tick.dispatched == [] and tick.parked == ["bad"]
    bad = repeat.get("q", "bad")
    assert bad is not None and bad.parked_reason is not None
    assert "must be a name" in bad.parked_reason
    assert repeat.leases("q") == []  # dropped once, not retried after every lease


APP = textwrap.dedent("""
    from celery import Celery

    app = Celery("pfcli", broker="memory://")
    app.conf.update(result_backend=None)


    @app.task(name="pfcli.known")
    def known():
        return None
""")


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    module = f"pf_celery_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module


def test_add_with_the_celery_app_refuses_an_unknown_task_and_writes_nothing(
    app_module: str, redis_url: str, prefix: str, repeat: Repeat
) -> None:
    base = ["--redis-url", redis_url, "--prefix", prefix, "add", "q"]
    runner = CliRunner()
    refused = runner.invoke(
        cli,
        [*base, "ghost", "--task", "pfcli.nope", "--every", "1m", "--celery", f"{app_module}:app"],
    )
    assert refused.exit_code == 1, refused.output
    [line] = refused.stderr.strip().splitlines()
    assert "'pfcli.nope' is not a task of the Celery app" in line
    assert "leave out --celery to add it unchecked" in line
    assert repeat.get("q", "ghost") is None

    added = runner.invoke(
        cli,
        [*base, "job", "--task", "pfcli.known", "--every", "1m", "--celery", f"{app_module}:app"],
    )
    assert added.exit_code == 0, added.output
    assert added.stderr == ""
    assert repeat.get("q", "job") is not None

    unroutable = runner.invoke(
        cli,
        [
            *base,
            "misrouted",
            *("--task", "pfcli.known", "--every", "1m", "--options", '{"queue": 5}'),
            *("--celery", f"{app_module}:app"),
        ],
    )
    assert unroutable.exit_code == 1, unroutable.output
    [line] = unroutable.stderr.strip().splitlines()
    assert "--options: options['queue'] must be a name (a string), got 5" in line
    assert repeat.get("q", "misrouted") is None

    both = runner.invoke(
        cli,
        [*base, "x", "--task", "t", "--every", "1m", "--celery", "a", "--dramatiq", "b"],
    )
    assert both.exit_code == 2 and "give one app" in both.stderr
