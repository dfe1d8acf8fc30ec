"""The pipelined Celery path with distinct arguments per registration: one plan per queue,
task and options, each message still byte for byte what `apply_async` writes; whatever the
arguments could shape beyond the body and reprs gets a plan per template; what Celery
refuses is refused the same way."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, Task
from celery.utils.saferepr import saferepr

from emq_bridge import DispatchError, Occurrence, occurrence_id
from emq_bridge.celery import CeleryDispatcher, PipelinedCeleryDispatcher
from emq_bridge.celery import pipelined as pipelined_module
from emq_bridge.celery.envelope import args_saferepr
from emq_bridge.template import freeze

T0 = 1_899_936_000_000
TASK = "emqa.record"

# Arguments of every shape the skeleton must reproduce; each is its own registration.
ARGUMENTS: list[tuple[list[Any], dict[str, Any]]] = [
    ([1, 2], {"report": "daily", "limit": 100}),
    ([2, 2], {"report": "daily", "limit": 100}),
    ([], {}),
    ([0], {}),
    ([], {"only": "kwargs"}),
    (["ünïcødé ✓", "日本語"], {"naïve": "café", "emoji": "🎉"}),
    (["quote ' and \" and \\ backslash", "tab\tnew\nline"], {"k'ey": 'v"al'}),
    ([1.5, -0.0, 1e300, True, False, None], {"f": 2.25, "b": True, "n": None}),
    ([[1, [2, [3, [4, [5]]]]], {"a": {"b": {"c": {"d": 1}}}}], {"deep": [[[[[1]]]]]}),
    (["x" * 3000], {"big": "y" * 3000}),
    ([list(range(600))], {f"k{i}": i for i in range(300)}),
    ([10**30, -(10**30)], {"zero": 0}),
    (["\x00\x1f\x7f"], {"ctl": "\x1b[0m"}),
    (["a" * 1017], {}),  # its repr is 1024 characters long: the limit exactly
    (["a" * 1018], {}),  # one past it
]


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("emqa-test", broker=redis_url)
    app.conf.update(result_backend=None)

    @app.task(name=TASK, shared=False)
    def record(*args: Any, **kwargs: Any) -> None:
        """Takes anything."""

    @app.task(name="emqa.typed", shared=False)
    def typed(a: int, b: int) -> None:
        """Takes exactly two arguments."""

    yield app
    app.close()


def occurrence(
    queue: str, name: str, template: dict[str, Any], *, frozen: bool = True
) -> Occurrence:
    return Occurrence(
        queue=queue,
        name=name,
        due_ms=T0,
        id=occurrence_id("emq", queue, name, T0),
        template=freeze(template) if frozen else template,
        released_ms=T0,
    )


def template(args: list[Any], kwargs: dict[str, Any], **options: Any) -> dict[str, Any]:
    return {"task": TASK, "args": args, "kwargs": kwargs, "options": options}


def drain(client: redis.Redis, queue: str) -> list[tuple[bytes, bytes]]:
    """Return (key, payload) of every message on the lists of `queue` (its priority lists
    and any queue named after it too), key by key, oldest first; and empty them."""
    out = []
    for key in sorted(client.keys(f"{queue}*")):
        out.extend((key, payload) for payload in reversed(client.lrange(key, 0, -1)))
        client.delete(key)
    return out


def same_bytes(expected: bytes, got: bytes) -> bool:
    """True when `got` is `expected` byte for byte, its random delivery tag set equal."""
    tag = json.loads(expected)["properties"]["delivery_tag"]
    other = json.loads(got)["properties"]["delivery_tag"]
    return got.replace(other.encode(), tag.encode()) == expected


def compare(
    app: Celery, client: redis.Redis, occurrences: list[Occurrence], queue: str
) -> PipelinedCeleryDispatcher:
    """Send `occurrences` both ways and check every message is byte for byte the same."""
    drain(client, queue)
    for occ in occurrences:
        CeleryDispatcher(app).dispatch(occ)
    normal = drain(client, queue)
    fast = PipelinedCeleryDispatcher(app)
    try:
        for _ in range(2):  # the first builds the plans, the second uses them
            assert fast.dispatch_batch(occurrences) == [None] * len(occurrences)
            got = drain(client, queue)
            assert len(got) == len(normal) == len(occurrences)
            for (key, expected), (key2, payload) in zip(normal, got, strict=True):
                assert key == key2
                assert same_bytes(expected, payload), (expected[:300], payload[:300])
    finally:
        fast.close()
    return fast


def plans(fast: PipelinedCeleryDispatcher) -> list[Any]:
    return [entry for entry in fast._plans.values() if entry is not None]


@pytest.mark.parametrize("frozen", [True, False], ids=["shared-template", "plain-dict"])
def test_distinct_args_share_one_plan_and_write_exactly_what_apply_async_writes(
    app: Celery, redis_url: str, frozen: bool
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    batch = [
        occurrence(queue, f"job-{i}", template(args, kwargs, queue=queue), frozen=frozen)
        for i, (args, kwargs) in enumerate(ARGUMENTS)
    ]
    fast = compare(app, client, batch, queue)
    built = plans(fast)
    assert len(built) == 1 and built[0].codec is not None  # one skeleton for them all


def test_the_reprs_are_celerys_saferepr_with_its_limits(app: Celery, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    app.amqp.argsrepr_maxsize = 40
    app.amqp.kwargsrepr_maxsize = 30
    app.conf.task_repr_maxlevels = 2
    batch = [
        occurrence(queue, f"job-{i}", template(args, kwargs, queue=queue))
        for i, (args, kwargs) in enumerate(ARGUMENTS)
    ]
    fast = PipelinedCeleryDispatcher(app)
    try:
        assert fast.dispatch_batch(batch) == [None] * len(batch)
    finally:
        fast.close()
    for occ, (_, payload) in zip(batch, drain(client, queue), strict=True):
        headers = json.loads(payload)["headers"]
        args, kwargs = list(occ.template["args"]), dict(occ.template["kwargs"])
        assert headers["argsrepr"] == saferepr(args or (), 40, maxlevels=2)
        assert headers["kwargsrepr"] == saferepr(kwargs, 30, maxlevels=2)
    # And against apply_async itself, with these limits.
    compare(app, client, batch, queue)


def test_options_that_differ_get_their_own_plan(app: Celery, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    other = f"{queue}-other"
    batch = []
    for i in range(12):
        options: dict[str, Any] = [
            {"queue": queue},
            {"queue": queue, "priority": 5},
            {"queue": other, "headers": {"tenant": f"t{i // 4 % 2}"}},
            {},  # the registry's queue
        ][i % 4]
        batch.append(occurrence(queue, f"job-{i}", template([i], {"n": i}, **options)))
    fast = compare(app, client, batch, queue)
    # Four options, the headers of two tenants: five skeletons, not twelve plans.
    assert len(plans(fast)) == 5


def test_serializers_and_explicit_reprs_are_reproduced(app: Celery, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    batch = []
    for i, (args, kwargs) in enumerate(ARGUMENTS[:9]):
        options: dict[str, Any] = {"queue": queue}
        if i % 3 == 1:
            options["serializer"] = "pickle"
        if i % 3 == 2:
            options.update(argsrepr="(hidden)", kwargsrepr="{hidden}")
        batch.append(occurrence(queue, f"job-{i}", template(args, kwargs, **options)))
    app.conf.accept_content = ["json", "pickle"]
    fast = compare(app, client, batch, queue)
    assert all(plan.codec is not None for plan in plans(fast))


def anything(*args: Any, **kwargs: Any) -> None:
    """A task body that takes anything."""


class Custom(Task):  # type: ignore[misc]
    """A task class whose `apply_async` adds a header made from the arguments."""

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        headers = dict(options.pop("headers", None) or {}, first=repr(list(args or [])[:1]))
        return super().apply_async(args, kwargs, headers=headers, **options)


def by_tenant(name: str, args: Any, kwargs: Any, options: Any, **_: Any) -> Any:
    """A router function: the first argument picks the queue."""
    if args and args[0] == "vip":
        return {"queue": f"{options['queue'].name}-vip"}
    return None


@pytest.mark.parametrize("shape", ["router", "apply_async", "shadow_name", "compression"])
def test_what_the_arguments_could_shape_gets_a_plan_per_template(
    app: Celery, redis_url: str, shape: str
) -> None:
    """The whole message is then captured per template, and is still what apply_async
    writes; nothing is shared between registrations."""
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {"queue": queue}
    task = TASK
    if shape == "router":
        app.conf.task_routes = [by_tenant]
    elif shape == "apply_async":
        task = "emqa.custom"
        app.task(name=task, base=Custom, shared=False)(anything)
    elif shape == "shadow_name":
        task = "emqa.shadowed"
        app.task(
            name=task, shared=False, shadow_name=lambda self, args, kwargs, opts: f"s-{args[0]}"
        )(anything)
    else:
        options["compression"] = "zlib"
    batch = [
        occurrence(queue, f"job-{i}", {"task": task, "args": [first, i], "options": options})
        for i, first in enumerate(["vip", "std", "vip", "std"])
    ]
    fast = compare(app, client, batch, queue)
    entries = list(fast._plans.values())
    assert entries.count(pipelined_module._PER_TEMPLATE) == 1
    whole = [entry for entry in entries if entry is not pipelined_module._PER_TEMPLATE]
    assert len(whole) == len(batch) and all(plan.codec is None for plan in whole)


def test_arguments_celery_refuses_fail_alone_as_on_the_default_path(
    app: Celery, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    good = occurrence(queue, "good", template([1], {}, queue=queue))
    wrong_arity = occurrence(queue, "arity", {"task": "emqa.typed", "args": [1, 2, 3]})
    typed_ok = occurrence(queue, "typed", {"task": "emqa.typed", "args": [1, 2]})
    # Not JSON: a template built in code, not read from the registry.
    not_json = occurrence(queue, "set", template([{1, 2}], {}, queue=queue), frozen=False)
    unknown_type = occurrence(
        queue, "object", template([], {"o": object()}, queue=queue), frozen=False
    )
    batch = [good, wrong_arity, typed_ok, not_json, unknown_type, good]

    def default_error(occ: Occurrence) -> str | None:
        try:
            CeleryDispatcher(app).dispatch(occ)
        except DispatchError as exc:
            return str(exc)
        return None

    expected = [default_error(occ) for occ in batch]
    normal = drain(client, queue)
    assert [e is None for e in expected] == [True, False, True, False, False, True]
    fast = PipelinedCeleryDispatcher(app)
    try:
        errors = fast.dispatch_batch(batch)
    finally:
        fast.close()
    assert [None if e is None else str(e) for e in errors] == expected
    assert all(isinstance(e, DispatchError) for e in errors if e is not None)
    got = drain(client, queue)
    assert len(got) == len(normal) == 3
    for (_, want), (_, payload) in zip(normal, got, strict=True):
        assert same_bytes(want, payload)


def test_protocol_1_is_never_pipelined(app: Celery, redis_url: str) -> None:
    """Its task id is inside the body: the whole message goes through apply_async."""
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    app.conf.task_protocol = 1
    batch = [occurrence(queue, f"job-{i}", template([i], {}, queue=queue)) for i in range(3)]
    fast = PipelinedCeleryDispatcher(app)
    try:
        assert fast.dispatch_batch(batch) == [None, None, None]
    finally:
        fast.close()
    assert plans(fast) == []
    for occ, (_, payload) in zip(batch, drain(client, queue), strict=True):
        body = json.loads(payload)
        assert body["properties"]["correlation_id"] == occ.id


def test_the_caches_stay_bounded(
    app: Celery, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"q{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(pipelined_module, "PLAN_CACHE_SIZE", 4)
    monkeypatch.setattr(pipelined_module, "PARTS_CACHE_SIZE", 5)
    fast = PipelinedCeleryDispatcher(app)
    try:
        for _ in range(3):
            batch = [
                occurrence(queue, f"job-{i}", template([i], {}, queue=queue, priority=i % 7))
                for i in range(20)
            ]
            assert fast.dispatch_batch(batch) == [None] * 20
            assert len(fast._plans) <= 4 and len(fast._parts) <= 5
            assert len(drain(client, queue)) == 20
    finally:
        fast.close()


# -- the reprs: the shortcut for flat arguments is Celery's saferepr ---------------------


def _scalar(rng: random.Random) -> Any:
    pick = rng.randrange(9)
    if pick == 0:
        return rng.randrange(-(10**6), 10**6)
    if pick == 1:
        return rng.random() * 10 ** rng.randrange(-5, 20)
    if pick == 2:
        return rng.choice([True, False, None])
    if pick == 3:
        return rng.choice([float("inf"), float("-inf"), float("nan"), -0.0, 10**40])
    alphabet = "abc xyz'\"\\\n\t\x00é✓🎉日"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    if depth < 3 and rng.random() < 0.15:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    if depth < 3 and rng.random() < 0.1:
        return {str(_scalar(rng)): _value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    if rng.random() < 0.03:
        return (1, 2)
    return _scalar(rng)


@pytest.mark.parametrize("seed", range(3))
def test_the_repr_shortcut_equals_saferepr_on_many_values(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values of every shape and limits around their length: the same text either way, and
    both the shortcut and saferepr itself are taken often."""
    from emq_bridge.celery import envelope

    slow = [0]
    celery_saferepr = envelope._celery_saferepr

    def counted(value: Any, maxlen: int | None, levels: int | None) -> str:
        slow[0] += 1
        return celery_saferepr(value, maxlen, levels)

    monkeypatch.setattr(envelope, "_celery_saferepr", counted)
    rng = random.Random(seed)
    checked = 0
    for _ in range(250):
        args = [_value(rng) for _ in range(rng.randrange(0, 6))]
        kwargs = {str(_scalar(rng)): _value(rng) for _ in range(rng.randrange(0, 5))}
        if rng.random() < 0.3:
            kwargs[rng.randrange(5)] = 1  # type: ignore[index]  # a non-string key
        for value in (args or (), kwargs):
            size = len(repr(value))
            for maxlen in (None, 0, 1, 5, 20, size + 1, size, size - 1, 1024):
                for levels in (0, 1, 3, -1, None):
                    assert args_saferepr(value, maxlen, levels) == saferepr(
                        value, maxlen, maxlevels=levels
                    ), (value, maxlen, levels)
                    checked += 1
    assert checked == 250 * 2 * 9 * 5
    assert checked * 0.1 < slow[0] < checked * 0.9  # both ways taken, many times
