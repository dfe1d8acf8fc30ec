"""A pump's same-server check when the URL's user may not touch the app's keys (session 35's
"left alone").

`pump --celery` with `--redis-url` checks that the URL reaches the app's registry. Where
INFO is refused (the documented ACL, `-@dangerous`), it writes a throwaway key under the
app's prefix and reads it through the URL. A user refused that key (NOPERM) read as another
server: "--redis-url names the registry ..., but the app's beat or workers pump ...", exit 2,
blaming a URL that named the right server. It now says it cannot tell, and why: one line,
exit 3 (Redis refusing a command). A real server with real ACL users.
"""

from __future__ import annotations

from pathlib import Path

import redis
from processes import run_app_cli

from emq_bridge.embedded import EmbeddedServer

PREFIX = "acl"

APP = """
from celery import Celery

app = Celery("acls36", broker="amqp://guest:guest@127.0.0.1:5672//")
app.conf.update(
    result_backend=None,
    emq_bridge_redis_url="redis://app@127.0.0.1:{port}/0",
    emq_bridge_redis_password="pw",
    emq_bridge_prefix="{prefix}",
    beat_schedule={{"tick": {{"task": "celery.backend_cleanup", "schedule": 60.0}}}},
)
"""


def test_a_url_whose_user_may_not_read_the_apps_keys_is_told_so(tmp_path: Path) -> None:
    with EmbeddedServer() as server:
        admin = redis.Redis.from_url(server.url)
        for user, keys in (("app", f"{PREFIX}:"), ("other", "elsewhere:")):
            rules = [f"~{keys}*", f"&{keys}*", "+@all", "-@dangerous"]
            admin.execute_command("ACL", "SETUSER", user, "on", ">pw", *rules)
        (tmp_path / "acls36.py").write_text(APP.format(port=server.port, prefix=PREFIX))
        given = f"redis://other:pw@localhost:{server.port}/0"
        done = run_app_cli(tmp_path, "--redis-url", given, "pump", "--celery", "acls36", "--once")
        assert done.returncode == 3, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(
            "Error: cannot tell whether the Redis URL given reaches the app's registry"
        ), line
        assert f"under '{PREFIX}' (NOPERM)" in line and "pw" not in line, line
        assert admin.dbsize() == 0  # nothing synced, the throwaway key removed
        admin.close()
