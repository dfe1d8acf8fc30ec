"""Sitecustomize files that move a test process's wall clock, for the clock tests.

Written as `sitecustomize.py` into a folder put first on a child process's PYTHONPATH, Python
loads it before anything else: the child's `time.time` (and more, see each) is moved off the
true time while `time.monotonic` is left alone, as on a host whose clock is off or steps (NTP).
"""

from __future__ import annotations

import textwrap

__all__ = ["FIXED_OFFSET", "STEPPED"]

# A fixed offset of $CLOCK_OFFSET_S seconds: `time.time`, `time.time_ns`,
# `datetime.now`/`utcnow`/`today`.
FIXED_OFFSET = textwrap.dedent("""
    import datetime as _dt
    import os
    import time as _time

    _offset = float(os.environ.get("CLOCK_OFFSET_S", "0") or 0)
    if _offset:
        _real_time, _real_time_ns = _time.time, _time.time_ns

        def time():
            return _real_time() + _offset

        def time_ns():
            return _real_time_ns() + int(_offset * 1e9)

        _time.time, _time.time_ns = time, time_ns
        _RealDT = _dt.datetime

        class _Meta(type):
            def __instancecheck__(cls, obj):
                return isinstance(obj, _RealDT)

            def __subclasscheck__(cls, sub):
                return issubclass(sub, _RealDT)

        class FakeDatetime(_RealDT, metaclass=_Meta):
            @classmethod
            def now(cls, tz=None):
                return _RealDT.fromtimestamp(time(), tz)

            @classmethod
            def utcnow(cls):
                return _RealDT.utcfromtimestamp(time())

            @classmethod
            def today(cls):
                return _RealDT.fromtimestamp(time())

        _dt.datetime = FakeDatetime
""")

# An offset read again every 0.2 s from the file $CLOCK_OFFSET_FILE, so a test steps the
# clock while the process runs: `time.time` and `time.time_ns`.
STEPPED = textwrap.dedent("""
    import os, time

    _file, _time, _mono = os.environ["CLOCK_OFFSET_FILE"], time.time, time.monotonic
    _seen = [0.0, -1.0]


    def _offset():
        if _mono() - _seen[1] > 0.2:
            try:
                with open(_file) as f:
                    _seen[0] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
            _seen[1] = _mono()
        return _seen[0]


    time.time = lambda: _time() + _offset()
    time.time_ns = lambda: int((_time() + _offset()) * 1e9)
""")
