"""The dependency rules of the package: the core never imports a framework, the adapters
never import each other, and no module imports itself back through others.

Two independent checks: a real import of every core module in a fresh interpreter where
celery, dramatiq and kombu cannot be imported at all, and a static walk of every import
statement (module level and inside functions, since a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "emq_bridge"
FRAMEWORKS = ("celery", "dramatiq", "kombu")
ADAPTERS = ("emq_bridge.celery", "emq_bridge.dramatiq")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_adapter(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ADAPTERS)


def core_modules() -> list[str]:
    return [m for m in modules() if not is_adapter(m)]


def imports(module: str, path: Path) -> Iterator[str]:
    """Yield every module `module` imports, absolute, wherever the import statement is."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # `from pkg import sub` imports the submodule pkg.sub when there is one.
            yield from (f"{base}.{alias.name}" for alias in node.names)


def internal_graph() -> dict[str, set[str]]:
    known = modules()
    return {
        module: {target for target in imports(module, path) if target in known and target != module}
        for module, path in known.items()
    }


def test_every_core_module_imports_with_celery_dramatiq_and_kombu_blocked() -> None:
    blocker = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {FRAMEWORKS!r}:\n"
        "            raise ImportError(f'{name} is blocked by the layout test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib\n"
        f"for name in {core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        f"leaked = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "assert not leaked, leaked\n"
        "print('imported', len(sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("imported")


@pytest.mark.parametrize("module", core_modules())
def test_a_core_module_never_imports_a_framework_or_an_adapter(module: str) -> None:
    found = sorted(
        target
        for target in imports(module, modules()[module])
        if target.split(".")[0] in FRAMEWORKS or is_adapter(target)
    )
    assert found == [], f"{module} imports {found}: only emq_bridge.celery/.dramatiq may"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_adapter_never_imports_the_other_adapter(adapter: str) -> None:
    others = [a for a in ADAPTERS if a != adapter]
    found = sorted(
        (module, target)
        for module, path in modules().items()
        if is_adapter(module) and (module == adapter or module.startswith(adapter + "."))
        for target in imports(module, path)
        if any(target == o or target.startswith(o + ".") for o in others)
    )
    assert found == []


def test_no_module_of_the_package_is_part_of_an_import_cycle() -> None:
    sorter = graphlib.TopologicalSorter(internal_graph())
    try:
        order = list(sorter.static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle (each imported by the next): {' -> '.join(exc.args[1])}")
    assert set(order) == set(modules())


def test_the_cycle_check_finds_a_cycle_hidden_by_a_lazy_import(tmp_path: Path) -> None:
    # The check itself, on a two-module package whose cycle is inside a function.
    graph = {"p.a": {"p.b"}, "p.b": set()}
    source = "def later():\n    from .a import x\n"
    path = tmp_path / "b.py"
    path.write_text(source)
    graph["p.b"] = {t for t in imports("p.b", path) if t in graph}
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter(graph).static_order())


@pytest.mark.parametrize(("adapter", "framework"), [("celery", "celery"), ("dramatiq", "dramatiq")])
def test_an_adapter_without_its_framework_says_which_extra_to_install(
    adapter: str, framework: str
) -> None:
    probe = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {framework!r}:\n"
        "            raise ImportError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "try:\n"
        f"    import emq_bridge.{adapter}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == (
        f"emq_bridge.{adapter} needs {framework.capitalize()}: pip install 'emq-bridge[{adapter}]'"
    )
