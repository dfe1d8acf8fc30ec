"""Two Celery apps on one registry, each with its own `emq_bridge_source` and a schedule file
of the same base name (so the same default file source, `file:schedules.toml`): each app's
boot sync of its file removes only schedules of its own tasks. Before (session 27's probe),
each boot removed the other app's file schedules and the other's next boot created them
again: their slots were lost in between, their counters and history at every boot. An entry
dropped from an app's own file is still removed."""

from __future__ import annotations

from pathlib import Path

from celery import Celery

from emq_bridge import Repeat
from emq_bridge.celery.declare import boot_schedule


def project(tmp_path: Path, which: str, entries: list[str], redis_url: str, prefix: str) -> Celery:
    folder = tmp_path / which
    folder.mkdir(exist_ok=True)
    lines = [f'queue = "q_{which}"']
    for entry in entries:
        lines += ["[[schedule]]", f'name = "{entry}"', f'task = "proj_{which}.run"', 'every = "1h"']
    (folder / "schedules.toml").write_text("\n".join(lines) + "\n")
    app = Celery(f"proj_{which}", set_as_current=False)
    app.conf.update(
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        emq_bridge_source=f"celery.proj_{which}",
        emq_bridge_schedule_file=str(folder / "schedules.toml"),
    )

    @app.task(name=f"proj_{which}.run", shared=False)  # type: ignore[untyped-decorator]
    def run() -> None: ...

    return app


def test_two_apps_files_of_one_default_source_keep_each_others(
    tmp_path: Path, repeat: Repeat, redis_url: str, prefix: str
) -> None:
    a = project(tmp_path, "a", ["file_a", "gone_a"], redis_url, prefix)
    b = project(tmp_path, "b", ["file_b"], redis_url, prefix)
    boot_schedule(a, repeat)
    boot_schedule(b, repeat)
    for app in (a, b, a, b):
        boot_schedule(app, repeat)
        assert set(repeat.names("q_a")) == {"file_a", "gone_a"}
        assert repeat.names("q_b") == ["file_b"]
    registration = repeat.get("q_b", "file_b")
    assert registration is not None and registration.source == "file:schedules.toml"
    # Its own entries are still pruned when its file drops them.
    a = project(tmp_path, "a", ["file_a"], redis_url, prefix)
    boot_schedule(a, repeat)
    assert repeat.names("q_a") == ["file_a"] and repeat.names("q_b") == ["file_b"]
