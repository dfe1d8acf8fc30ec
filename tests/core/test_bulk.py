"""`gc_paused` holds the cyclic collector off for a bulk build and puts it back as it was."""

from __future__ import annotations

import gc

import pytest

from emq_bridge.bulk import gc_paused, without_gc
from emq_bridge.sync import sync


def test_the_collector_is_off_inside_and_as_it_was_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner one leaves it to the outer
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a failed build")
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_wrapped_function_keeps_its_name_signature_and_result() -> None:
    @without_gc
    def build(n: int, *, twice: bool = False) -> list[bool]:
        return [gc.isenabled()] * (2 * n if twice else n)

    assert build(2, twice=True) == [False] * 4
    assert build.__name__ == "build" and gc.isenabled()
    assert sync.__name__ == "sync" and "Plan, then" in (sync.__doc__ or "")
