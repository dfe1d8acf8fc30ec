"""The type of the migration tests' `run` fixture (the CLI on the test registry).

A module of its own, not the conftest: `from conftest import` finds whichever conftest was
imported first when two test directories run in one pytest call.
"""

from __future__ import annotations

from collections.abc import Callable

from click.testing import Result

Run = Callable[..., Result]
