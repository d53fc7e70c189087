"""``pytest -m gpu`` collects on a bare GPU image: one with torch but none of the notebook
packages (the GPU machine's image has no plotly, anywidget, ipywidgets or IPython)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UI_PACKAGES = ("plotly", "anywidget", "ipywidgets", "IPython")


def test_gpu_tests_collect_without_the_notebook_packages(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    for name in UI_PACKAGES:  # each import fails as if the package were not installed
        (hidden / name).mkdir(parents=True)
        hide = f"raise ModuleNotFoundError('{name} is hidden')\n"
        (hidden / name / "__init__.py").write_text(hide)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q",
         "-p", "no:cacheprovider", "tests"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-2000:]
    assert "error" not in done.stdout.lower().split("short test summary")[-1], done.stdout[-3000:]
