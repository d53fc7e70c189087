"""BENCHMARKS.md's tables come from the committed results through benchmarks/make_tables.py.

The script runs as a user runs it (a subprocess from the repository root); the tests only
compare text, never timings.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "make_tables.py"
REGION = re.compile(r"<!-- table:([a-z0-9-]+) -->\n(.*?)<!-- /table:\1 -->", re.S)


def make_tables(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_benchmarks_md_tables_are_what_the_committed_results_give() -> None:
    done = make_tables("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_number_in_a_table_of_benchmarks_md_lies_in_a_generated_region() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    outside = REGION.sub("", text)
    rows = [
        line
        for line in outside.splitlines()
        if line.lstrip().startswith("|") and re.search(r"\d", line)
    ]
    assert rows == [], "table rows with numbers outside <!-- table:NAME --> regions"


def test_a_stale_table_fails_the_check_by_name_and_is_rewritten(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    original = (ROOT / "BENCHMARKS.md").read_text()
    first = next(m for m in REGION.finditer(original) if "%" in m[2])  # a table with shares
    edited = original.replace(first[2], first[2].replace("%", "% (typed by hand)", 1), 1)
    assert edited != original
    doc.write_text(edited)

    check = make_tables("--check", "--no-results-md", "--doc", str(doc))
    assert check.returncode == 1
    assert f"table {first[1]}" in check.stdout

    fix = make_tables("--no-results-md", "--doc", str(doc))
    assert fix.returncode == 0, fix.stderr
    assert doc.read_text() == original


def test_a_region_that_names_no_table_is_refused_with_the_known_names(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    text = (ROOT / "BENCHMARKS.md").read_text()
    doc.write_text(text + "\n<!-- table:h100-typo -->\n<!-- /table:h100-typo -->\n")
    done = make_tables("--check", "--no-results-md", "--doc", str(doc))
    assert done.returncode == 2
    assert "'h100-typo'" in done.stderr and "h200-overhead" in done.stderr
