"""A sync whose registry Redis restarts empty between its reads and its writes is done again,
or refused, never reported done (probe: interrupted operations, session 31).

The plan of a sync reads the registry, then writes what changed. A Redis restarted without
persistence in between holds none of what the plan found unchanged: before, `emq-bridge
sync v2.toml` exited 0 saying "25000 unchanged" over a registry that held 25,000 of its
50,000 schedules (or none), and a beat booting then pumped that half. Now `sync()` reads the
server's `run_id` before and after: when it changed, the sync is done again in full once (a
second restart raises `RegistryRestarted`); `apply_plan` (the CLI's plan, then apply) raises
it, before writing anything if the restart came before the writes, and the CLI exits 3.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cli_runs import cli_runner, one_error_line

from emq_bridge import Declaration, Repeat, apply_plan, define, plan_sync, sync
from emq_bridge.cli import operations
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import RegistryRestarted

from .conftest import free_port

QUEUE = "rq"
N = 200


def declarations(n: int, changed: int = 0) -> list[Declaration]:
    """`n` hourly schedules; the first `changed` of them with another task."""
    return [
        Declaration(
            QUEUE, f"job-{i}", define(every="1h", template={"task": "new" if i < changed else "t"})
        )
        for i in range(n)
    ]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A server of this test's own, without persistence: a restart comes back empty."""
    (tmp_path / "server").mkdir()
    found = EmbeddedServer(port=free_port(), directory=str(tmp_path / "server")).start()
    try:
        yield found
    finally:
        found.stop()


def restart(server: EmbeddedServer) -> None:
    server.kill()
    server.start()


def restarting_before(
    target: Any, name: str, server: EmbeddedServer, times: int, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Make `target.name` restart `server` before its first `times` calls; return the count."""
    original: Callable[..., Any] = getattr(target, name)
    calls: list[int] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            restart(server)
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapped)
    return calls


def names(repeat: Repeat) -> dict[str, str]:
    return {r.name: r.definition.template["task"] for r in repeat.list(QUEUE)}


def test_a_sync_whose_registry_restarted_empty_before_its_writes_syncs_again(
    server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with Repeat(redis.Redis.from_url(server.url), "rs") as repeat:
        sync(repeat, declarations(N), "app")
        # The next deploy drops half and changes a quarter: its plan has writes to make.
        wanted = declarations(N // 2, changed=N // 4)
        restarting_before(repeat, "upsert_declared", server, 1, monkeypatch)
        with caplog.at_level(logging.WARNING, logger="emq_bridge.sync"):
            applied = sync(repeat, wanted, "app")
        # Done again on the restarted server: every schedule is there, and the counts are the
        # second try's (the first try's writes reached the new server: found unchanged).
        assert names(repeat) == {d.name: d.definition.template["task"] for d in wanted}
        assert len(applied.create) + len(applied.unchanged) == N // 2
        assert applied.create and not applied.update and not applied.remove
        assert "restarted during the sync" in caplog.text


def test_a_registry_that_restarts_during_both_tries_is_refused(
    server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Repeat(redis.Redis.from_url(server.url), "rs") as repeat:
        sync(repeat, declarations(N), "app")
        restarting_before(repeat, "upsert_declared", server, 2, monkeypatch)
        with pytest.raises(RegistryRestarted, match="and again during its second try"):
            sync(repeat, declarations(N // 2, changed=N // 4), "app")


def test_a_plan_applied_after_a_restart_writes_nothing(server: EmbeddedServer) -> None:
    with Repeat(redis.Redis.from_url(server.url), "rs") as repeat:
        sync(repeat, declarations(N), "app")
        plan = plan_sync(repeat, declarations(N // 2, changed=N // 4), "app")
        restart(server)
        with pytest.raises(RegistryRestarted, match="since its plan was read: nothing was written"):
            apply_plan(repeat, plan)
        assert repeat.client.dbsize() == 0


def test_the_cli_sync_exits_3_and_its_next_run_converges(
    server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "schedules.toml"
    entries = [f'[[schedule]]\nname = "job-{i}"\nevery = "1h"\ntask = "t"\n' for i in range(N)]
    file.write_text(f'source = "app"\nqueue = "{QUEUE}"\n\n' + "\n".join(entries))
    run = cli_runner(server.url, "rs")
    assert run("sync", str(file)).exit_code == 0
    file.write_text(f'source = "app"\nqueue = "{QUEUE}"\n\n' + "\n".join(entries[: N // 2]))
    restarting_before(operations, "apply_plan", server, 1, monkeypatch)
    line = one_error_line(run("sync", str(file)), 3)
    assert "restarted since its plan was read: nothing was written" in line, line
    monkeypatch.undo()
    assert run("sync", str(file)).exit_code == 0
    with Repeat(redis.Redis.from_url(server.url), "rs") as repeat:
        assert sorted(names(repeat)) == sorted(f"job-{i}" for i in range(N // 2))
