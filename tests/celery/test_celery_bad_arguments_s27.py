"""A schedule whose args or kwargs its Celery task refuses (`Task.typing`, Celery's check in
`apply_async` before any broker I/O) can never be sent: the pump parks it, saying why, and
sends its neighbours; on the pipelined path too. Before (session 27's probe), each slot kept
its lease and was sent again every lease for ever, and a fixed deploy then sent every slot
held meanwhile at once (67 of 134 messages were stale)."""

from __future__ import annotations

import pytest
from celery import Celery

from emq_bridge import Pump, Repeat
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher


@pytest.fixture
def app(redis_url: str) -> Celery:
    app = Celery("badargs", broker=redis_url.rsplit("/", 1)[0] + "/1", set_as_current=False)
    app.conf.update(result_backend=None)

    @app.task(name="badargs.add", shared=False)  # type: ignore[untyped-decorator]
    def add(x: int, y: int) -> int:
        return x + y

    return app


@pytest.mark.parametrize("dispatcher", [CeleryDispatcher, PipelinedCeleryDispatcher])
def test_arguments_the_task_refuses_park_the_registration(
    app: Celery, repeat: Repeat, dispatcher: type[CeleryDispatcher]
) -> None:
    now = repeat.server_time_ms()
    hour_ago = now - 3_600_000
    repeat.register(
        "q", "fine", every="1h", template={"task": "badargs.add", "args": [1, 2]}, now_ms=hour_ago
    )
    repeat.register(
        "q", "bad", every="1h", template={"task": "badargs.add", "args": [1]}, now_ms=hour_ago
    )
    repeat.register(
        "q",
        "typo",
        every="1h",
        template={"task": "badargs.add", "args": [1, 2], "kwargs": {"z": 3}},
        now_ms=hour_ago,
    )
    with app.connection_for_write() as connection:
        before = connection.default_channel.client.llen("q")
    tick = Pump(repeat, ["q"], dispatcher(app)).run_once()
    assert [o.name for o in tick.dispatched] == ["fine"]
    assert sorted(tick.parked) == ["bad", "typo"]
    for name, why in (
        ("bad", "missing 1 required positional argument"),
        ("typo", "unexpected keyword argument"),
    ):
        registration = repeat.get("q", name)
        assert registration is not None and registration.paused
        reason = registration.parked_reason or ""
        assert reason.startswith("its args and kwargs do not fit task 'badargs.add': "), reason
        assert why in reason
    assert repeat.leases("q") == []  # no lease kept: nothing is sent again
    with app.connection_for_write() as connection:
        assert connection.default_channel.client.llen("q") == before + 1  # "fine" alone
