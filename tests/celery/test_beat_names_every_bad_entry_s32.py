"""`celery beat -S emq` refusing a `beat_schedule` names every bad entry, in one line, as a
schedule file's refusal does (session 32's argument probe).

Before, the refusal named the first bad entry only (`ONLY=c_dt_naive,c_nan celery beat -S
emq` said nothing of `c_nan`): each fix and restart showed one more. Now every entry is
converted and each refusal listed: the first 20, then how many more. A lone bad entry's
refusal is as it was; the exception is the same `ConfigError`, and the beat exits as before,
having written nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from emq_bridge.celery.declare import app_schedule
from emq_bridge.errors import ConfigError

pytestmark = [pytest.mark.timeout(150)]

# Bad entries of the kinds Celery's own beat sends over json (or pickle), in order.
BAD: dict[str, Any] = {
    "a_datetime": {"args": [datetime(2025, 1, 2, 3, 4, 5)]},
    "b_nan": {"args": [float("nan")]},
    "c_uuid": {"kwargs": {"id": uuid.UUID(int=1)}},
    "d_int_key": {"args": [{1: "one"}]},
    "e_date": {"kwargs": {"day": date(2025, 1, 2)}},
}
REASONS = {
    "a_datetime": "Object of type datetime is not JSON serializable",
    "b_nan": "Out of range float values",
    "c_uuid": "Object of type UUID is not JSON serializable",
    "d_int_key": "template keys must be strings, got 1",
    "e_date": "Object of type date is not JSON serializable",
}


def noop(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery(f"every-bad-{prefix}", broker=redis_url, set_as_current=False)
    app.conf.update(
        timezone="UTC",
        task_default_queue=f"{prefix}-q",
        emq_bridge_prefix=prefix,
        result_backend=None,
        result_expires=None,
    )
    app.task(name="eb.noop", shared=False)(noop)
    yield app
    app.close()


def entries_of(message: str) -> list[str]:
    """The refusals a message lists (one may hold a "; " of its own)."""
    return re.split(r"; (?=beat_schedule\[|and \d+ more$)", message)


def entry(**values: Any) -> dict[str, Any]:
    return {"task": "eb.noop", "schedule": 60.0, **values}


def test_two_bad_entries_are_both_named_in_one_line(app: Celery) -> None:
    app.conf.beat_schedule = {
        "c_dt_naive": entry(args=[datetime(2025, 1, 2)]),
        "fine": entry(args=[1]),
        "c_nan": entry(args=[float("nan")]),
    }
    with pytest.raises(ConfigError) as raised:
        app_schedule(app)
    message = str(raised.value)
    assert "\n" not in message
    # Python's own reason is quoted; 3.12 added ": nan" to its end.
    assert message.removesuffix(": nan") == (
        "beat_schedule['c_dt_naive']: template is not JSON-serialisable: Object of type "
        "datetime is not JSON serializable; beat_schedule['c_nan']: template is not "
        "JSON-serialisable: Out of range float values are not JSON compliant"
    )


def test_every_kind_of_bad_entry_is_named_with_its_reason(app: Celery) -> None:
    app.conf.beat_schedule = {
        "ok_1": entry(),
        **{key: entry(**values) for key, values in BAD.items()},
        "ok_2": entry(kwargs={"x": 1}),
        "unknown": {"task": "eb.nope", "schedule": 60.0},  # not an argument: named too
        "not_a_schedule": {"task": "eb.noop", "schedule": "soon"},
    }
    with pytest.raises(ConfigError) as raised:
        app_schedule(app)
    parts = entries_of(str(raised.value))
    assert len(parts) == len(BAD) + 2, parts
    for part, (key, reason) in zip(parts, REASONS.items(), strict=False):
        assert part.startswith(f"beat_schedule[{key!r}]: ") and reason in part, part
    assert parts[-2].startswith("beat_schedule['unknown']: unknown task 'eb.nope'"), parts
    assert parts[-1].startswith("beat_schedule['not_a_schedule']: "), parts


def test_more_than_20_bad_entries_name_the_first_20_and_count_the_rest(app: Celery) -> None:
    app.conf.beat_schedule = {
        f"bad_{n:02}": entry(args=[float("inf")] if n % 2 else [date(2025, 1, n)])
        for n in range(1, 27)
    }
    with pytest.raises(ConfigError) as raised:
        app_schedule(app)
    parts = entries_of(str(raised.value))
    assert len(parts) == 21, parts
    assert [p.split(":", 1)[0] for p in parts[:20]] == [
        f"beat_schedule['bad_{n:02}']" for n in range(1, 21)
    ]
    assert parts[20] == "and 6 more"


def test_a_lone_bad_entry_is_refused_as_before(app: Celery) -> None:
    app.conf.beat_schedule = {"fine": entry(), "c_nan": entry(args=[float("nan")])}
    with pytest.raises(ConfigError) as raised:
        app_schedule(app)
    assert str(raised.value).removesuffix(": nan") == (  # 3.12 added ": nan"
        "beat_schedule['c_nan']: template is not JSON-serialisable: Out of range float "
        "values are not JSON compliant"
    )


APP = textwrap.dedent("""
    import datetime
    import os
    import uuid

    from celery import Celery

    env = os.environ
    app = Celery("everybad", broker=env["EB_BROKER"])
    app.conf.update(
        emq_bridge_prefix=env["EB_PREFIX"],
        task_default_queue=env["EB_QUEUE"],
        result_backend=None,
        result_expires=None,
        beat_schedule={
            "c_dt_naive": {
                "task": "everybad.rec",
                "schedule": 2.0,
                "args": [datetime.datetime(2025, 1, 2, 3, 4, 5)],
            },
            "fine": {"task": "everybad.rec", "schedule": 2.0, "args": [1]},
            "c_nan": {"task": "everybad.rec", "schedule": 2.0, "args": [float("nan")]},
            "c_uuid": {
                "task": "everybad.rec",
                "schedule": 2.0,
                "kwargs": {"id": uuid.UUID(int=7)},
            },
        },
    )


    @app.task(name="everybad.rec")
    def rec(*args, **kwargs):
        pass
""")


def test_celery_beat_refuses_naming_every_bad_entry_and_writes_nothing(
    tmp_path: Path, redis_url: str, prefix: str, client: redis.Redis
) -> None:
    (tmp_path / "eb_app.py").write_text(APP)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "EB_BROKER": redis_url,
        "EB_PREFIX": prefix,
        "EB_QUEUE": f"{prefix}-q",
        "C_FORCE_ROOT": "1",
    }
    done = subprocess.run(
        [
            *(sys.executable, "-m", "celery", "-A", "eb_app", "beat", "-S", "emq"),
            *("--pidfile=", f"--schedule={tmp_path / 'beat.db'}", "-l", "info"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    refusals = [line for line in output.splitlines() if "refuses to start" in line]
    assert len(refusals) == 1, output[-3000:]
    line = refusals[0]
    for key in ("c_dt_naive", "c_nan", "c_uuid"):
        assert f"beat_schedule[{key!r}]: template is not JSON-serialisable" in line, line
    assert "fine" not in line
    assert line.index("c_dt_naive") < line.index("c_nan") < line.index("c_uuid")
    assert not list(client.scan_iter(match=f"{prefix}:*", count=1000))
