"""``lab`` never imports ``ui``: read off the source of every module under freeride_lab/lab, so
an import hidden in a function, a lazy one, or one under ``TYPE_CHECKING`` is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[2] / "freeride_lab" / "lab"
FORBIDDEN = ("freeride_lab.ui", "freeride_lab.magics", "freeride_lab.cli")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, relative ones resolved against lab."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from ..ui import y
                base = ["freeride_lab", "lab"][: max(0, 2 - (node.level - 1))]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value))
    return found


def upward_imports(path: Path) -> list[str]:
    return [
        f"{path.name}:{line}: {module}"
        for line, module in imported_modules(path)
        if any(module == f or module.startswith(f + ".") for f in FORBIDDEN)
    ]


@pytest.mark.parametrize("path", sorted(LAB.glob("*.py")), ids=lambda p: p.name)
def test_no_lab_module_imports_ui_magics_or_cli(path: Path) -> None:
    assert upward_imports(path) == []


def test_the_check_sees_lazy_relative_and_dynamic_imports(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "def f():\n"
        "    from freeride_lab.ui.report import write_session_report\n"
        "    from ..ui import dashboard\n"
        "    importlib.import_module('freeride_lab.ui.dashboard')\n"
        "    from freeride_lab import ui\n"
    )
    lines = {found.split(":")[1] for found in upward_imports(source)}
    assert lines == {"3", "4", "5", "6"}
