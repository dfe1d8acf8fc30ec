"""The helpers for users' own tests (`emq_bridge.testing`) and the clocks they hand the registry
(found by a probe, session 32).

* A `Pump` given no clock, on a registry with one (`Repeat.clock`, `fake_repeat(clock=)`),
  scanned on the server's `TIME`: the schedules were placed at the test's 2030, the pump read
  2026, and advancing the clock fired nothing, without a word (so did the pump thread of
  `RecurringMiddleware(fake_repeat(clock=clock))`, whose `run_pump` is on by default). It runs
  on the registry's clock now; a pump with no clock on a registry with none still reads the
  server's clock in its scan, no round trip more.
* A registry clock that returns anything but an int of epoch ms (`time.time`'s float seconds)
  registered a record `get` then skipped as corrupt (one log line); `ManualClock` itself (the
  class) failed with a `TypeError` deep inside. Now `ConfigError`, naming the clock and what it
  returned, before anything is written. `ManualClock` refuses ms with a fraction, and
  `manual_pump` a dispatcher without `dispatch`.
* `fake_repeat()` without fakeredis raised a bare `ModuleNotFoundError`; with fakeredis but not
  its Lua support (lupa) it returned a registry whose first move failed with "unknown command
  'evalsha'". Both are an `ImportError` saying `pip install 'fakeredis[lua]'` now (lupa's absence
  made real in a child interpreter: nothing is uninstalled).

On the test server and on fakeredis (`any_repeat`), as every registry test.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone

import pytest
import redis

from emq_bridge import ConfigError, Pump, Repeat
from emq_bridge.testing import ManualClock, RecordingDispatcher, fake_repeat, manual_pump

UTC = timezone.utc
HOUR_MS = 3_600_000


def _register(repeat: Repeat, name: str = "refresh") -> None:
    repeat.register("reports", name, every="1h", template={"task": "t"})


# -- a pump on a registry with a clock ---------------------------------------------------------


def test_a_pump_given_no_clock_runs_on_the_registrys(any_repeat: Repeat) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    any_repeat.clock = clock
    _register(any_repeat)
    placed = any_repeat.get("reports", "refresh")
    assert placed is not None and placed.next_run_ms == clock() + HOUR_MS
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder)  # no clock of its own

    tick = pump.run_once()
    assert tick.now_ms == clock() == any_repeat.server_time_ms()
    assert tick.dispatched == []
    clock.advance(timedelta(hours=1) - timedelta(milliseconds=1))
    assert pump.run_once().dispatched == []  # a ms early
    clock.advance(1)
    (fired,) = pump.run_once().dispatched
    assert (fired.name, fired.due_ms, fired.missed) == ("refresh", clock(), 0)
    assert recorder.names() == ["refresh"]

    any_repeat.trigger("reports", "refresh")  # "now": the clock's
    (triggered,) = pump.run_once().dispatched
    assert triggered.due_ms == clock()


def test_the_pumps_own_clock_comes_first(any_repeat: Repeat) -> None:
    any_repeat.clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    _register(any_repeat)
    own = ManualClock(datetime(2030, 1, 1, 1, tzinfo=UTC))  # the registry's + 1 h
    (fired,) = Pump(any_repeat, ["reports"], RecordingDispatcher(), clock=own).run_once().dispatched
    assert fired.due_ms == own()


def test_with_no_clock_anywhere_the_scan_reads_the_servers_time(
    any_repeat: Repeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Production: no clock on the pump nor the registry. The scan reads the server's `TIME`
    itself: no `server_time_ms` round trip is added."""
    assert any_repeat.clock is None

    def no_round_trip() -> int:
        raise AssertionError("the pump asked the server's time in a round trip of its own")

    _register(any_repeat)
    any_repeat.trigger("reports", "refresh")
    monkeypatch.setattr(any_repeat, "server_time_ms", no_round_trip)
    before = int(time.time() * 1000)
    tick = Pump(any_repeat, ["reports"], RecordingDispatcher()).run_once()
    assert [o.name for o in tick.dispatched] == ["refresh"]
    assert before - 5_000 <= tick.now_ms <= int(time.time() * 1000) + 5_000


# -- clocks that do not return epoch ms --------------------------------------------------------


def test_a_registry_clock_of_float_seconds_is_refused_before_anything_is_written(
    any_repeat: Repeat,
) -> None:
    any_repeat.clock = time.time
    with pytest.raises(ConfigError) as refused:
        _register(any_repeat)
    message = str(refused.value)
    assert "a registry clock must return epoch milliseconds as an int, got float " in message
    assert "time.time" in message
    with pytest.raises(ConfigError, match="got float"):
        any_repeat.server_time_ms()
    any_repeat.clock = None
    assert any_repeat.get("reports", "refresh") is None
    assert any_repeat.list("reports") == []


@pytest.mark.parametrize(
    ("clock", "said"),
    [
        (ManualClock, "got a ManualClock from emq_bridge.testing.ManualClock: pass an instance"),
        (lambda: True, "as an int, got bool True"),
        (lambda: 1.5e12, "as an int, got float 1500000000000.0"),
        (lambda: None, "as an int, got None"),
        (lambda: -1, "from 0 (1970) to"),
        (datetime(2030, 1, 1, tzinfo=UTC), "must be a callable"),
    ],
)
def test_a_registry_clock_that_is_no_epoch_ms_clock_is_refused(clock: object, said: str) -> None:
    repeat = fake_repeat(clock=clock)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="a registry clock") as refused:
        _register(repeat)
    assert said in str(refused.value)


def test_a_pump_clock_of_float_seconds_is_refused(any_repeat: Repeat) -> None:
    pump = Pump(any_repeat, ["reports"], RecordingDispatcher(), clock=time.time)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="a pump clock must return epoch milliseconds as an int"):
        pump.run_once()


def test_a_manual_clock_counts_whole_ms() -> None:
    for make in (
        lambda: ManualClock(1.5),
        lambda: ManualClock(0).set(1.5),
        lambda: ManualClock(0).advance(1.5),
    ):
        with pytest.raises(ValueError, match=r"1\.5 is not a whole number"):
            make()
    clock = ManualClock(2.0)
    assert clock() == 2 and type(clock()) is int
    assert clock.advance(3.0) == 5 and clock.set(7.0) == 7 and type(clock()) is int
    with pytest.raises(ValueError, match="ManualClock starts at whole epoch ms"):
        ManualClock(float("nan"))


def test_manual_pump_refuses_a_dispatcher_without_dispatch() -> None:
    with pytest.raises(TypeError, match=r"needs a dispatcher, an object with a dispatch\("):
        manual_pump(fake_repeat(), ["reports"], ManualClock(), object())  # type: ignore[arg-type]


# -- fakeredis without its Lua support ---------------------------------------------------------


def test_fake_repeat_without_fakeredis_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "fakeredis", None)  # `import fakeredis` fails, as unset
    with pytest.raises(ImportError, match=r"pip install 'fakeredis\[lua\]'"):
        fake_repeat()


def test_fake_repeat_without_lupa_says_what_to_install() -> None:
    """In a child interpreter where `lupa` cannot be imported, as where it is not installed:
    fakeredis then answers EVAL as an unknown command."""
    child = textwrap.dedent(
        """
        import sys
        sys.modules["lupa"] = None
        import fakeredis
        from emq_bridge.testing import fake_repeat
        try:
            fake_repeat()
        except ImportError as exc:
            print("ImportError:", exc)
        else:
            print("no error")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=True
    )
    assert "ImportError: fake_repeat needs fakeredis' Lua support" in done.stdout, done
    assert "pip install 'fakeredis[lua]'" in done.stdout


def test_fake_repeat_with_lua_is_checked_on_its_own_server() -> None:
    server = __import__("fakeredis").FakeServer()
    repeat = fake_repeat(server=server)
    _register(repeat)
    assert isinstance(repeat.client, redis.Redis)
    assert [r.name for r in fake_repeat(server=server).list("reports")] == ["refresh"]
