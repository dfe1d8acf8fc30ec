"""The `--<framework> SPEC` options of the commands, one per installed framework target.

Targets are found through `emq_bridge.targets` (entry points), so no command names a
framework: `pump` sends through the one given, `add` checks `--task` against it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import click

from .. import targets
from ..dispatch import PumpTarget

__all__ = ["framework_options", "given_frameworks", "load_target"]


def _param(framework: str) -> str:
    return "target_" + framework.replace("-", "_")


def framework_options(
    help_for: Callable[[str], str],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Add `--<framework> SPEC` for each installed framework, with `help_for(framework)`."""

    def add(command: Callable[..., None]) -> Callable[..., None]:
        for framework in reversed(list(targets.frameworks())):
            option = click.option(
                f"--{framework}", _param(framework), metavar="SPEC", help=help_for(framework)
            )
            command = option(command)
        return command

    return add


def given_frameworks(params: Mapping[str, object]) -> list[tuple[str, str]]:
    """Return the `(framework, SPEC)` pairs given among a command's parameters, in order."""
    names = {_param(framework): framework for framework in targets.frameworks()}
    return [(names[p], str(spec)) for p, spec in params.items() if p in names and spec]


def framework_params(params: dict[str, object]) -> dict[str, object]:
    """Remove and return the framework options from a command's parameters."""
    names = {_param(framework) for framework in targets.frameworks()}
    return {p: params.pop(p) for p in list(params) if p in names}


def load_target(framework: str, spec: str, pipelined: bool = False) -> PumpTarget:
    """Load the application at `spec` through the adapter registered as `framework`."""
    try:
        return targets.load_target(framework, spec, pipelined=pipelined)
    except ImportError as exc:
        raise click.ClickException(f"cannot load {spec!r} for {framework}: {exc}") from exc
