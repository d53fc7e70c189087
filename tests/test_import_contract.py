"""The import contract: the package's floors, read from the source with ``ast`` (nothing imported).

Floors, lowest first: core → io → gpu → sidetasks → pipeline → tasks → lab → bench → ui →
cli/magics. A module imports only from its own floor or a lower one; an import inside a function
(a lazy import) and one under ``if TYPE_CHECKING:`` (a type's dependency) count the same as one
at the top. ``core`` imports no torch at module top (it
stays importable in milliseconds). No two modules import each other, directly or round a loop.
A broken rule is printed as ``module imports module (floor X above floor Y)``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "freeride_lab"

#: Floor of each top-level room (the package's own ``__init__`` is the face: it loads the
#: magics when IPython asks it to).
FLOORS = {
    "core": 0,
    "io": 1,
    "gpu": 2,
    "sidetasks": 3,
    "pipeline": 4,
    "tasks": 5,
    "lab": 6,
    "bench": 7,
    "ui": 8,
    "cli": 9,
    "magics": 9,
    "task_cell": 9,  # the %%freeride_task cell, a part of the magics
    "": 9,
}
FLOOR_NAMES = {0: "core", 1: "io", 2: "gpu", 3: "sidetasks", 4: "pipeline", 5: "tasks",
               6: "lab", 7: "bench", 8: "ui", 9: "cli/magics"}  # fmt: skip

#: Known breaks of the contract, if ever one has to be let through while it is being removed; an
#: entry is "importer imports imported" exactly as the violation prints it. Empty: none.
ALLOWED: set[str] = set()


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS[parts[1] if len(parts) > 1 else ""]


def imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int, bool]]:
    """(imported module of this package, line, at module top) for each import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for name in names:
            while name and name not in known and name.startswith("freeride_lab"):
                name = name.rpartition(".")[0]
            if name.split(".")[0] == "torch":
                yield "torch", node.lineno, id(node) in top
            elif name in known:
                yield name, node.lineno, id(node) in top


def violations(package: Path = PACKAGE) -> list[str]:
    """Every break of the contract in ``package`` (a ``freeride_lab`` tree), sorted."""
    known = modules(package)
    found: set[str] = set()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for imported, _line, at_top in imports(module, path, known):
            if imported == "torch":
                if floor(module) == 0 and at_top:
                    found.add(f"{module} imports torch (floor core imports no torch at top)")
                continue
            if imported == module or module.startswith(imported + "."):
                continue  # a package's own __init__ runs first anyway
            graph[module].add(imported)
            mine, theirs = floor(module), floor(imported)
            if theirs > mine:
                found.add(
                    f"{module} imports {imported} "
                    f"(floor {FLOOR_NAMES[theirs]} above floor {FLOOR_NAMES[mine]})"
                )
    found.update(_cycles(graph))
    return sorted(found)


def _cycles(graph: dict[str, set[str]]) -> set[str]:
    """One "a imports b (cycle)" per strongly connected group: its first module, the next one
    round the loop (package ``__init__`` modules, which import their children, left out)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    out = set()
    for group in groups:
        first = group[0]
        nxt = min(w for w in graph[first] if w in group)
        out.add(f"{first} imports {nxt} (cycle)")
    return out


def test_imports_go_down_the_floors_and_round_no_loop() -> None:
    found = violations()
    new = [v for v in found if v not in ALLOWED]
    print("\n".join(found))
    assert not new, "imports that break the floors:\n" + "\n".join(new)


def test_the_allowed_list_holds_only_breaks_that_still_exist() -> None:
    gone = sorted(ALLOWED - set(violations()))
    assert not gone, "fixed; remove from ALLOWED in tests/test_import_contract.py:\n" + "\n".join(
        gone
    )


def test_each_kind_of_break_is_found_and_printed_with_its_floors(tmp_path: Path) -> None:
    root = tmp_path / "freeride_lab"
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/pure.py": "import torch\n\ndef later():\n    import torch.nn\n",
        "core/lazy.py": "def f():\n    import torch\n",
        "sidetasks/__init__.py": "",
        "sidetasks/loader.py": "def f():\n    from freeride_lab.tasks import vision\n",
        "tasks/__init__.py": "from . import vision\n",
        "tasks/vision.py": "from freeride_lab.sidetasks import loader\n",
        "lab/__init__.py": "",
        "lab/a.py": "from freeride_lab.lab import b\n",
        "lab/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert violations(root) == [
        "freeride_lab.core.pure imports torch (floor core imports no torch at top)",
        "freeride_lab.lab.a imports freeride_lab.lab.b (cycle)",
        "freeride_lab.sidetasks.loader imports freeride_lab.tasks.vision (cycle)",
        "freeride_lab.sidetasks.loader imports freeride_lab.tasks.vision "
        "(floor tasks above floor sidetasks)",
    ]
