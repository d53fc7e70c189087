"""The docs point at things that exist: every test RELIABILITY.md (and the other top-level docs)
cites as proof, and every file or image README.md links to.

A fault table is only as good as its "Proven by" column: a renamed or moved test leaves a row
that proves nothing, so a reference that no longer resolves fails here, naming the doc, the line
and the reference.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("RELIABILITY.md", "README.md", "CONTRIBUTING.md", "BENCHMARKS.md")

# `tests/x/test_y.py::test_z`, `tests/x/test_y.py`, or `::test_z` (same file as the last one)
_CODE = re.compile(r"`([^`]+)`")
_REF = re.compile(
    r"(?P<file>tests/[\w/.-]+\.py)?(?:::(?P<name>\w+)(?:\[[^\]]*\])?)?(?: \([^)]*\))?"
)
_LINK = re.compile(r"\]\((?!https?://|#|mailto:)(?P<target>[^)\s#]+)(?:#[^)]*)?\)")


def _test_refs(text: str) -> list[tuple[int, str, str | None]]:
    """(line number, test file, test name or None) for each test reference in a markdown text;
    a bare ``::name`` belongs to the file named before it on the same line."""
    refs: list[tuple[int, str, str | None]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        last: str | None = None
        for code in _CODE.finditer(line):
            m = _REF.fullmatch(code.group(1))
            if m is None or (m["file"] is None and m["name"] is None):
                continue
            file = m["file"] or last
            if file is None:
                raise AssertionError(f"line {lineno}: `{code.group(1)}` names no test file")
            last = file
            refs.append((lineno, file, m["name"]))
    return refs


def _missing(path: Path) -> list[str]:
    """One line per reference in the markdown file at ``path`` that does not resolve."""
    if not path.exists():
        return []
    doc = path.name
    missing = []
    for lineno, file, name in _test_refs(path.read_text(encoding="utf-8")):
        source = REPO / file
        if not source.is_file():
            missing.append(f"{doc}:{lineno}: {file} does not exist")
        elif name is not None and not re.search(
            rf"^\s*(?:async\s+)?def {name}\(", source.read_text(encoding="utf-8"), re.M
        ):
            missing.append(f"{doc}:{lineno}: {file} has no test {name}")
    return missing


@pytest.mark.parametrize("doc", DOCS)
def test_every_test_a_doc_cites_exists(doc: str) -> None:
    missing = _missing(REPO / doc)
    assert not missing, "cited tests that do not exist (renamed or moved?):\n" + "\n".join(missing)


def test_the_reliability_table_cites_tests() -> None:
    """The checker sees RELIABILITY.md's references (a format change cannot make it vacuous)."""
    refs = _test_refs((REPO / "RELIABILITY.md").read_text(encoding="utf-8"))
    assert len([r for r in refs if r[2] is not None]) > 100


def test_the_checker_finds_a_renamed_test_and_a_moved_file(tmp_path: Path) -> None:
    doc = tmp_path / "FAULTS.md"
    doc.write_text(
        "| Fault | What happens | Proven by |\n|---|---|---|\n"
        "| a | b | `tests/test_docs.py::test_every_test_a_doc_cites_exists`, `::test_gone` |\n"
        "| c | d | `tests/no_such_dir/test_x.py::test_y` |\n",
        encoding="utf-8",
    )
    assert _missing(doc) == [
        "FAULTS.md:3: tests/test_docs.py has no test test_gone",
        "FAULTS.md:4: tests/no_such_dir/test_x.py does not exist",
    ]


def test_every_file_the_readme_links_to_exists() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [m["target"] for m in _LINK.finditer(text)]
    assert "docs/screenshots/dashboard-light.png" in targets
    missing = [target for target in targets if not (REPO / target).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
