"""A celery-redbeat entry whose stored JSON is not what redbeat writes (a definition that is
no object, args that are no array, JSON nested 100,000 deep) is refused with its reason, and
the good entries beside it are imported. Before, one such entry ended the whole import in a
traceback (`AttributeError`, `TypeError`, `RecursionError`)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
import redis
from celery import Celery
from celery.schedules import schedule
from cli_run import Run
from redbeat import RedBeatSchedulerEntry

from emq_bridge import Repeat

DEEP = "[" * 100_000 + "]" * 100_000

BAD = {
    "deep": (DEEP, None, "nested too deep"),
    "defint": ("5", None, "'definition' is not a JSON object"),
    "metalist": (None, "[1]", "'meta' is not a JSON object"),
    "args": ({"args": 5}, None, "its args is not a JSON array"),
    "kwargs": ({"kwargs": [1, 2]}, None, "its kwargs is not a JSON object"),
    "opts": ({"options": [1]}, None, "its options is not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_entry_is_refused_and_the_good_one_imported(
    run: Run, repeat: Repeat, redis_url: str, case: str
) -> None:
    key_prefix = f"rb{uuid.uuid4().hex[:8]}:"
    app = Celery("rbt", broker=redis_url, set_as_current=False)
    app.conf.update(redbeat_redis_url=redis_url, redbeat_key_prefix=key_prefix)
    RedBeatSchedulerEntry("good", "rbt.record", schedule(timedelta(minutes=1)), app=app).save()
    client = redis.Redis.from_url(redis_url)
    definition, meta, reason = BAD[case]
    good_definition = {
        "name": "bad",
        "task": "rbt.record",
        "schedule": json.loads(client.hget(key_prefix + "good", "definition"))["schedule"],
    }
    if isinstance(definition, dict):
        definition = json.dumps({**good_definition, **definition})
    elif definition is None:
        definition = json.dumps(good_definition)
    client.hset(key_prefix + "bad", mapping={"definition": definition, "meta": meta or "{}"})
    client.zadd(key_prefix + ":schedule", {key_prefix + "bad": 0})
    try:
        result = run("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
        assert reason in result.output
        assert "1 created, 0 updated, 0 unchanged, 1 refused" in result.stderr
        assert repeat.names("celery") == ["good"]
    finally:
        client.delete(key_prefix + "bad", key_prefix + "good", key_prefix + ":schedule")
        client.close()


def test_a_key_of_another_type_in_redbeats_index_is_refused_and_the_good_one_imported(
    run: Run, repeat: Repeat, redis_url: str
) -> None:
    # Session 27's probe: a string key indexed in `<prefix>:schedule` ended the whole import
    # (exit 3, WRONGTYPE, the key not named), nothing imported.
    key_prefix = f"rb{uuid.uuid4().hex[:8]}:"
    app = Celery("rbt", broker=redis_url, set_as_current=False)
    app.conf.update(redbeat_redis_url=redis_url, redbeat_key_prefix=key_prefix)
    RedBeatSchedulerEntry("good", "rbt.record", schedule(timedelta(minutes=1)), app=app).save()
    client = redis.Redis.from_url(redis_url)
    client.set(key_prefix + "not_a_hash", "x")
    client.zadd(key_prefix + ":schedule", {key_prefix + "not_a_hash": 0})
    try:
        result = run("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
        assert f"redbeat {key_prefix}not_a_hash" in result.output
        assert "not a hash: not a redbeat entry" in result.output
        assert "1 created, 0 updated, 0 unchanged, 1 refused" in result.stderr
        assert repeat.names("celery") == ["good"]
    finally:
        client.delete(key_prefix + "not_a_hash", key_prefix + "good", key_prefix + ":schedule")
        client.close()
