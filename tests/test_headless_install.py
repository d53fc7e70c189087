"""A GPU node installs freeride-lab without its ``[notebook]`` extra: training ranks, side-task
workers, the Session and the command line import no notebook package there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Top-level names of the packages only the ``[notebook]`` extra brings.
UI_PACKAGES = ("ipywidgets", "anywidget", "plotly", "IPython", "jupyter", "jupyterlab")

HEADLESS = """
import contextlib, io, json, sys
import freeride_lab, freeride_lab.lab, freeride_lab.pipeline.rank, freeride_lab.sidetasks.worker
import freeride_lab.cli
from freeride_lab.lab import Session
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    freeride_lab.cli.main(["--help"])  # what `freeride-lab --help` runs
assert "usage: freeride-lab" in out.getvalue(), out.getvalue()
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_the_headless_parts_import_no_notebook_package() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", HEADLESS], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    ui = sorted(n for n in loaded if n.startswith(UI_PACKAGES))
    assert not ui, f"the headless install imported notebook packages: {', '.join(ui)}"


def test_the_notebook_extra_lists_every_notebook_package() -> None:
    """What the headless test keeps out of a GPU node is exactly what ``[notebook]`` adds."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = " ".join(project["dependencies"]).lower()
    extras = project["optional-dependencies"]

    def expand(extra: str) -> list[str]:  # "freeride-lab[ui]" inside an extra is that extra
        out = []
        for req in extras[extra]:
            inner = req.partition("freeride-lab[")[2].rstrip("]")
            out += [x for e in inner.split(",") for x in expand(e)] if inner else [req]
        return out

    notebook = " ".join(expand("notebook")).lower()
    for name in ("ipywidgets", "anywidget", "plotly", "ipython", "jupyterlab"):
        assert name in notebook and name not in required, name
    assert project["optional-dependencies"]["lab"] == ["freeride-lab[notebook]"]
