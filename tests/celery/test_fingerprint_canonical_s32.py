"""The beat's boot fingerprint is the same in every process of the same app.

`app_fingerprint` digests a pickle of what the conversion reads. Two settings pickled as
they are gave a different digest per process, and so a full sync at every restart: a kombu
`Queue(bindings=[...])` in `task_queues` (or an entry's `queue` option) keeps its bindings
in a set, ordered by the objects' addresses (different even with one `PYTHONHASHSEED`), and
`emq_bridge_queues` given as a set of names iterates in the order the hash seed picks.
Each app is built in processes of its own, with the seeds given, against the suite's server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# argv: case, Redis URL, prefix. Prints the fingerprint, then starts the beat's scheduler and
# prints whether its boot found its stamp ("unchanged") or synced in full ("synced").
CHILD = textwrap.dedent("""
    import logging
    import sys

    from celery import Celery
    from kombu import Exchange, Queue, binding

    from emq_bridge.celery import RepeatScheduler
    from emq_bridge.celery.declare import _DECLARED, _beat_entries
    from emq_bridge.celery.fingerprint import app_fingerprint

    case, url, prefix = sys.argv[1:]
    app = Celery(f"app-{prefix}", broker=url, set_as_current=False)
    app.conf.update(
        timezone="Europe/Paris",
        task_default_queue=f"{prefix}-q",
        emq_bridge_prefix=prefix,
        result_backend=None,
        result_expires=None,
    )


    def record(*args, **kwargs):
        return None


    app.task(name="t.record", shared=False)(record)
    entry = {"task": "t.record", "schedule": 3600.0, "args": [1], "kwargs": {"k": "v"}}
    exchange = Exchange(f"{prefix}-x", type="topic")
    # Made once per process, in one order: the set kombu keeps them in orders them by address.
    bound = [binding(exchange, routing_key=f"{key}.*") for key in "abcdef"]
    if case == "task_queues":
        app.conf.task_queues = [Queue(f"{prefix}-q", exchange, f"{prefix}-q", bindings=bound)]
    elif case == "entry_queue":
        entry["options"] = {"queue": Queue(f"{prefix}-q", bindings=bound)}
    elif case == "queues_set":
        app.conf.emq_bridge_queues = {f"{prefix}-{name}" for name in "abcdefgh"}
    else:
        raise SystemExit(f"unknown case {case}")
    app.conf.beat_schedule = {"e": entry}

    print(app_fingerprint(app, _beat_entries(app), _DECLARED))
    found = []


    class Seen(logging.Handler):
        def emit(self, record):
            if "unchanged since its last sync" in record.getMessage():
                found.append(record.getMessage())


    logger = logging.getLogger("emq_bridge")
    logger.setLevel(logging.INFO)
    logger.addHandler(Seen())
    scheduler = RepeatScheduler(app)
    scheduler.close()
    print("unchanged" if found else "synced")
""")

CASES = ["task_queues", "entry_queue", "queues_set"]
# The same seed twice (the bindings' order is by address), then others (a set of names).
SEEDS = ("1", "1", "2", "12345")


def run(case: str, seed: str, url: str, prefix: str) -> tuple[str, str]:
    """(fingerprint, boot outcome) of the app of `case`, in a process with `seed`."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, case, url, prefix],
        env={**os.environ, "PYTHONHASHSEED": seed},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    digest, outcome = done.stdout.strip().splitlines()[-2:]
    return digest, outcome


@pytest.mark.parametrize("case", CASES)
def test_the_fingerprint_is_the_same_in_every_process_so_a_restart_finds_its_stamp(
    case: str, redis_url: str, prefix: str
) -> None:
    first_digest, first = run(case, "1", redis_url, prefix)
    later = [run(case, seed, redis_url, prefix) for seed in SEEDS]

    assert first_digest != "None" and first == "synced"
    digests = {seed: digest for seed, (digest, _) in zip(SEEDS, later, strict=True)}
    assert set(digests.values()) == {first_digest}, digests
    assert [outcome for _, outcome in later] == ["unchanged"] * len(SEEDS)
