"""Hostile and malformed input, property-based, over the public API.

Whatever a caller passes (names with braces, newlines, NUL, surrogates or 10 KB of text,
cron and interval strings drawn from a grammar and then mutated, templates holding
non-JSON values, deep nesting or too many bytes), the answer is either a working
registration or an `emq_bridge.errors` exception, and a refused call writes nothing.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from emq_bridge import (
    MAX_TEMPLATE_BYTES,
    ConfigError,
    Cron,
    EmqError,
    InvalidName,
    Repeat,
    ScheduleError,
    define,
    parse_every,
    validate_name,
)
from emq_bridge.keys import MAX_NAME_BYTES

PROPERTY = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
NOW_MS = 1_893_456_000_000  # 2030-01-01T00:00:00Z


def key_count(client: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000))


# -- names -------------------------------------------------------------------------------

HOSTILE_CHARS = st.sampled_from(
    [
        "{",
        "}",
        "\n",
        "\r",
        "\t",
        " ",
        "\x00",
        "\x7f",
        "\u200b",
        "\u2028",
        "\ufeff",
        "\udc80",
        "\ud800",
    ]
)
names = st.one_of(
    st.text(min_size=0, max_size=30),
    st.builds(lambda a, c, b: a + c + b, st.text(max_size=10), HOSTILE_CHARS, st.text(max_size=10)),
    st.text(alphabet="ab:*?[]é😀", min_size=150, max_size=260),
    st.binary(max_size=20),
    st.sampled_from([None, 0, 1.5, ["a"], b"\xff\xfe"]),
)


def allowed(name: object) -> bool:
    """The name rules, written out again independently of `validate_name`."""
    import unicodedata

    if not isinstance(name, str) or not name:
        return False
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return size <= MAX_NAME_BYTES and not any(
        c in "{}" or c.isspace() or unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp", "Zs")
        for c in name
    )


@PROPERTY
@given(queue=names, name=names)
def test_any_queue_and_name_either_registers_on_one_slot_or_is_refused_writing_nothing(
    repeat: Repeat, client: redis.Redis, prefix: str, queue: Any, name: Any
) -> None:
    before = key_count(client, prefix)
    if allowed(queue) and allowed(name):
        assert repeat.register(queue, name, every_ms=60_000, template={"n": name}) in (
            "registered",
            "exists",
        )
        registration = repeat.get(queue, name)
        assert registration is not None and registration.name == name
        assert registration.definition.template == {"n": name}
        keys = repeat.keys(queue)
        assert (
            len({key_slot(k.encode()) for k in [*keys.all_keys((name,)), keys.wake_channel]}) == 1
        )
        assert repeat.cancel(queue, name)
    else:
        with pytest.raises(InvalidName):
            repeat.register(queue, name, every_ms=60_000, template={})
        for move in (repeat.cancel, repeat.pause, repeat.trigger, repeat.get):
            with pytest.raises(InvalidName):
                move(queue, name)
        with pytest.raises(InvalidName):
            repeat.upsert(queue, name, every_ms=60_000)
    assert key_count(client, prefix) == before


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "a{b",
        "a}b",
        "{q}",
        "line\nbreak",
        "nul\x00",
        "tab\t",
        "space d",
        "zw\u200bsp",
        "\udc80surrogate",
        "x" * (MAX_NAME_BYTES + 1),
        "é" * (MAX_NAME_BYTES // 2 + 1),
    ],
)
def test_a_name_breaking_the_rules_is_refused_with_a_message_that_says_why(bad: str) -> None:
    with pytest.raises(InvalidName, match="name"):
        validate_name(bad)


def test_a_name_of_exactly_the_byte_limit_is_accepted(repeat: Repeat) -> None:
    name = "é" * (MAX_NAME_BYTES // 2)
    assert repeat.register("q", name, every_ms=1_000) == "registered"


def test_a_prefix_with_glob_characters_lists_only_its_own_queues(
    client: redis.Redis, prefix: str
) -> None:
    starry, plain = Repeat(client, f"{prefix}*"), Repeat(client, f"{prefix}xx")
    starry.register("mine", "a", every_ms=1_000)
    plain.register("theirs", "a", every_ms=1_000)
    assert starry.queues() == ["mine"]
    assert plain.queues() == ["theirs"]


# -- cadences ------------------------------------------------------------------------------

field_atoms = st.one_of(
    st.just("*"),
    st.integers(0, 70).map(str),
    st.builds("{}-{}".format, st.integers(0, 60), st.integers(0, 60)),
    st.builds("*/{}".format, st.integers(0, 70)),
    st.builds("{},{}".format, st.integers(0, 60), st.integers(0, 60)),
    st.sampled_from(["mon", "FRI", "jan", "L", "?", "5L", "1#2", "W"]),
)
cron_grammar = st.lists(field_atoms, min_size=5, max_size=5).map(" ".join)
MUTATIONS = [
    lambda s, d: s,
    lambda s, d: s + " *",
    lambda s, d: s.rsplit(" ", 1)[0],
    lambda s, d: s.replace(" ", "\t", 1),
    lambda s, d: s[: len(s) // 2] + d + s[len(s) // 2 :],
    lambda s, d: s.replace("*", d, 1),
    lambda s, d: d,
    lambda s, d: "@" + d,
]
junk = st.text(max_size=6) | st.sampled_from(
    ["-1", "99999", "٣", "\x00", "@daily", "@reboot", "", "0x10"]
)


@st.composite
def cron_strings(draw: st.DrawFn) -> str:
    mutate = draw(st.sampled_from(MUTATIONS))
    return str(mutate(draw(cron_grammar), draw(junk)))


interval_grammar = st.lists(
    st.builds(
        "{}{}{}".format,
        st.integers(0, 10**6),
        st.sampled_from(["", " "]),
        st.sampled_from(["ms", "s", "m", "h", "d", "w"]),
    ),
    min_size=1,
    max_size=3,
).map("".join)


@st.composite
def interval_strings(draw: st.DrawFn) -> str:
    mutate = draw(st.sampled_from(MUTATIONS))
    extra = draw(
        st.sampled_from(["", "²", "1.5h", "-5s", "9" * 40, "15M", "m15", "0", "1e3", "\u0661s"])
    )
    return str(mutate(draw(interval_grammar), extra))


@PROPERTY
@given(
    expr=cron_strings(),
    tz=st.sampled_from(["UTC", "Europe/Paris", "America/St_Johns", "Nope/Nowhere", ""]),
)
def test_any_cron_string_either_gives_a_future_slot_or_a_schedule_error(expr: str, tz: str) -> None:
    try:
        cron = Cron(expr, tz)
    except ScheduleError:
        return
    assert cron.next_after(NOW_MS) > NOW_MS
    assert cron.first_run(NOW_MS) == cron.next_after(NOW_MS)


@PROPERTY
@given(every=interval_strings())
def test_any_interval_string_either_parses_to_a_positive_interval_or_a_schedule_error(
    every: str,
) -> None:
    try:
        every_ms = parse_every(every)  # what `every=` takes: a bare number is seconds
    except ScheduleError:
        return
    assert every_ms > 0
    # The next slot of the epoch grid after NOW_MS (NOW_MS is on no grid but a day's divisors').
    assert define(every=every).cadence.next_after(NOW_MS) == (NOW_MS // every_ms + 1) * every_ms


@PROPERTY
@given(expr=cron_strings(), every=interval_strings())
def test_a_refused_cadence_writes_nothing(
    repeat: Repeat, client: redis.Redis, prefix: str, expr: str, every: str
) -> None:
    before = key_count(client, prefix)
    for cadence in ({"cron": expr}, {"every": every}):
        try:
            repeat.upsert("q", "n", **cadence, now_ms=NOW_MS)  # type: ignore[arg-type]
        except ScheduleError:
            assert key_count(client, prefix) == before
        else:
            registration = repeat.get("q", "n")
            assert registration is not None and registration.upcoming(1)[0] > NOW_MS
            repeat.cancel("q", "n")


# -- templates ------------------------------------------------------------------------------

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
non_json_leaves = st.sampled_from(
    [
        b"bytes",
        {1, 2},
        object(),
        math.nan,
        math.inf,
        -math.inf,
        decimal.Decimal("1.5"),
        dt.datetime(2030, 1, 1),
        1j,
        "\udc80",
        range(3),
        frozenset(),
    ]
)
hostile_values = st.recursive(
    json_leaves | non_json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers() | st.none(), inner, max_size=4)
    ),
    max_leaves=20,
)


def jsonable(value: Any) -> bool:
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (TypeError, ValueError):
        return False
    return json.loads(text) == value  # non-string keys and tuples do not come back equal


@PROPERTY
@given(kwargs=st.dictionaries(st.text(max_size=8), hostile_values, max_size=4), args=hostile_values)
def test_a_template_either_round_trips_as_json_or_is_refused_writing_nothing(
    repeat: Repeat, client: redis.Redis, prefix: str, kwargs: Any, args: Any
) -> None:
    template = {"task": "t", "args": [args], "kwargs": kwargs}
    before = key_count(client, prefix)
    if jsonable(template):
        repeat.upsert("q", "n", every_ms=1_000, template=template)
        registration = repeat.get("q", "n")
        assert registration is not None and registration.definition.template == template
        repeat.cancel("q", "n")
    else:
        with pytest.raises(ScheduleError):
            repeat.upsert("q", "n", every_ms=1_000, template=template)
    assert key_count(client, prefix) == before


@pytest.mark.parametrize(
    "template",
    [
        pytest.param([1, 2], id="not an object"),
        pytest.param("text", id="a string"),
        pytest.param({"a": "x" * MAX_TEMPLATE_BYTES}, id="over the size limit"),
        pytest.param({"a": "é" * (MAX_TEMPLATE_BYTES // 2)}, id="over the limit in UTF-8 bytes"),
        pytest.param({1: "int key"}, id="a non-string key"),
        pytest.param({"a": {"b": {2: "deep non-string key"}}}, id="a nested non-string key"),
        pytest.param({"a": "\ud800"}, id="a lone surrogate"),
        pytest.param({"a": math.nan}, id="NaN"),
        pytest.param({"a": 10**5000}, id="an integer too long to print"),
    ],
)
def test_a_malformed_template_is_refused_with_a_schedule_error_and_nothing_written(
    repeat: Repeat, client: redis.Redis, prefix: str, template: Any
) -> None:
    with pytest.raises(ScheduleError, match="template"):
        repeat.register("q", "n", every_ms=1_000, template=template)
    assert key_count(client, prefix) == 0


def test_a_template_nested_far_too_deep_is_refused() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ScheduleError, match="template"):
        define(every_ms=1_000, template={"a": deep})


def test_a_self_referencing_template_is_refused() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(ScheduleError, match="template"):
        define(every_ms=1_000, template=loop)


def test_a_template_at_the_size_limit_is_accepted(repeat: Repeat) -> None:
    overhead = len(json.dumps({"a": ""}, separators=(",", ":")))
    template = {"a": "x" * (MAX_TEMPLATE_BYTES - overhead)}
    assert repeat.register("q", "n", every_ms=1_000, template=template) == "registered"
    registration = repeat.get("q", "n")
    assert registration is not None and registration.definition.template == template


def test_records_are_json_and_never_unpickled(repeat: Repeat, client: redis.Redis) -> None:
    import pickle

    repeat.register("q", "n", every_ms=1_000, template={"task": "t"})
    record = repeat.keys("q").record("n")
    client.hset(record, "template", pickle.dumps({"task": "t"}))
    assert repeat.get("q", "n") is None  # refused as corrupt, never unpickled
    assert repeat.list("q") == []


def test_every_error_raised_for_bad_input_is_an_emq_error() -> None:
    for call in (
        define,
        lambda: define(every="1h", cron="* * * * *"),
        lambda: define(every="soon"),
        lambda: define(every_ms=-1),
        lambda: define(cron="* * * *"),
        lambda: define(cron="* * * * *", tz="Mars/Base"),
        lambda: define(every="1h", tz="UTC"),
        lambda: define(every="1h", misfire="never"),  # type: ignore[arg-type]
        lambda: define(every="1h", anchor="moon"),  # type: ignore[arg-type]
        lambda: define(every=True),  # type: ignore[arg-type]
    ):
        with pytest.raises(EmqError):
            call()


def test_the_allowed_name_model_agrees_with_validate_name_on_hostile_samples() -> None:
    samples = ["ok", "a{", "x\x00", "\u3000", "é" * 100, "é" * 101, "ünïcode", "a:b*c?"]
    for sample in samples:
        try:
            validate_name(sample)
            verdict = True
        except InvalidName:
            verdict = False
        assert verdict == allowed(sample), sample


# -- the command line and the schedule file ----------------------------------------------------

cli_texts = st.one_of(
    st.text(max_size=20),
    st.builds(lambda a, c, b: a + c + b, st.text(max_size=8), HOSTILE_CHARS, st.text(max_size=8)),
    st.sampled_from(["{q}", "-x", "--help", "a" * 300, "[]", "{}", '{"a": NaN}', "null"]),
)


def command_line(redis_url: str, prefix: str, *args: str) -> Any:
    from click.testing import CliRunner

    from emq_bridge.cli import cli

    return CliRunner().invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args])


@PROPERTY
@given(
    queue=cli_texts,
    name=cli_texts,
    cadence=st.one_of(
        interval_strings().map(lambda e: ["--every", e]),
        cron_strings().map(lambda c: ["--cron", c]),
        st.tuples(cron_strings(), cli_texts).map(lambda p: ["--cron", p[0], "--tz", p[1]]),
    ),
    kwargs=cli_texts,
)
def test_the_cli_add_command_either_adds_or_exits_with_one_line_and_writes_nothing(
    redis_url: str,
    client: redis.Redis,
    prefix: str,
    queue: str,
    name: str,
    cadence: list[str],
    kwargs: str,
) -> None:
    assume(not queue.startswith("-") and not name.startswith("-"))
    assume("\x00" not in "".join([queue, name, *cadence, kwargs]))  # argv cannot hold NUL
    before = key_count(client, prefix)
    result = command_line(
        redis_url, prefix, "add", queue, name, "--task", "t", *cadence, "--kwargs", kwargs
    )
    if result.exit_code == 0:
        assert Repeat(client, prefix).get(queue, name) is not None
        Repeat(client, prefix).cancel(queue, name)
    else:
        assert result.exit_code in (1, 2), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.exception
        )
        assert "Traceback" not in result.output
    assert key_count(client, prefix) == before


def toml_string(value: str) -> str:
    """Encode `value` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


@PROPERTY
@given(
    name=cli_texts,
    cadence=st.one_of(
        interval_strings().map(lambda e: f"every = {toml_string(e)}"),
        cron_strings().map(lambda c: f"cron = {toml_string(c)}"),
        st.integers().map(lambda n: f"every_ms = {n}"),
        st.sampled_from(["every = 5", "cron = []", "every = {}", 'tz = "UTC"', ""]),
    ),
    extra=st.sampled_from(
        [
            "",
            "args = [1, 2]",
            'kwargs = { a = "b" }',
            "args = 3",
            "kwargs = [1]",
            "options = { nested = { deeper = [1, { x = 1979-05-27T07:32:00Z }] } }",
            'args = ["' + "x" * MAX_TEMPLATE_BYTES + '"]',
            'misfire = "sometimes"',
            "unknown = 1",
            "args = [nan]",
            "kwargs = { inf = inf }",
        ]
    ),
    junk=st.sampled_from(["", "[[schedule", "= =", "\x00", "\ufeff", 'name = "dup"']),
)
def test_any_schedule_file_either_loads_or_raises_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, name: str, cadence: str, extra: str, junk: str
) -> None:
    from emq_bridge.config import load_schedule_file

    entry = f'name = {toml_string(name)}\ntask = "t"\n{cadence}\n{extra}\n{junk}\n'
    text = f'queue = "q"\n[[schedule]]\n{entry}'
    path = tmp_path_factory.mktemp("file") / "schedules.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        loaded = load_schedule_file(path)
    except ConfigError as exc:
        assert str(exc).startswith(str(path)), exc
        return
    for declaration in loaded.declarations:
        assert validate_name(declaration.name) == declaration.name
        encode = json.dumps(dict(declaration.definition.template), allow_nan=False)
        assert len(encode.encode()) <= MAX_TEMPLATE_BYTES + 100


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00garbage", b"\x80\x81", "[[schedule]]\nname = 'a'\n".encode("utf-16")]
)
def test_a_schedule_file_that_is_not_utf8_toml_is_a_config_error(
    tmp_path: Any, content: bytes
) -> None:
    from emq_bridge.config import load_schedule_file

    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="TOML"):
        load_schedule_file(path)


def test_an_invalid_schedule_file_synced_by_the_cli_writes_nothing(
    redis_url: str, client: redis.Redis, prefix: str, tmp_path: Any
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(
        'queue = "q"\n[[schedule]]\nname = "ok"\ntask = "t"\nevery = "1m"\n'
        '[[schedule]]\nname = "bad{name}"\ntask = "t"\nevery = "1m"\n'
    )
    result = command_line(redis_url, prefix, "sync", str(path))
    assert result.exit_code == 1
    assert "bad{name}" in result.output
    assert key_count(client, prefix) == 0


# -- occurrence identity -------------------------------------------------------------------

part = st.text(alphabet="a:\\b", min_size=1, max_size=6)


@PROPERTY
@given(
    one=st.tuples(part, part, part), other=st.tuples(part, part, part), due=st.integers(0, 2**50)
)
def test_distinct_registrations_never_share_an_occurrence_id(
    one: tuple[str, str, str], other: tuple[str, str, str], due: int
) -> None:
    from emq_bridge import occurrence_id

    assume(one != other)
    assert occurrence_id(*one, due) != occurrence_id(*other, due)
    assert occurrence_id(*one, due) == occurrence_id(*one, due)
