"""JupyterLab configuration for the browser tests (conventions.md §3.5, convention 14).

Never use it for anything but tests: it turns off every security check.

The test fixture (``tests/browser/conftest.py``) starts the server with
``python -m jupyter lab --config tests/browser/jupyter_server_config.py`` and passes the port
and directories through the environment. To look at the same server by hand::

    FREERIDE_LAB_TEST_PORT=8899 FREERIDE_LAB_TEST_ROOT=/tmp/lab-root \\
        python -m jupyter lab --config tests/browser/jupyter_server_config.py

Environment:
    FREERIDE_LAB_TEST_PORT: the port (default 8888); ``port_retries`` is 0, so a taken port fails
        at once instead of silently moving.
    FREERIDE_LAB_TEST_ROOT: the served directory (default: a fresh temporary directory).
    FREERIDE_LAB_TEST_STATE: where workspaces and user settings go (default: a fresh temporary
        directory), so no earlier layout or setting leaks into a test.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

c = get_config()  # type: ignore[name-defined]  # noqa: F821

# Settings every test relies on, written as JupyterLab user settings in a private directory.
#  - notification: no news fetch and no update check, so no toast covers the notebook and
#    nothing reaches for the network.
#  - notebook windowing off: every cell (and its outputs) stays in the DOM, so tests can read
#    outputs of cells scrolled out of view.
LAB_SETTINGS: dict[str, dict[str, object]] = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def _write_settings(settings_dir: Path) -> None:
    for plugin, values in LAB_SETTINGS.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2), encoding="utf-8")


_state = Path(os.environ.get("FREERIDE_LAB_TEST_STATE") or tempfile.mkdtemp(prefix="frl-lab-"))
_settings_dir = _state / "user-settings"
_workspaces_dir = _state / "workspaces"
_workspaces_dir.mkdir(parents=True, exist_ok=True)
_write_settings(_settings_dir)

c.ServerApp.ip = "127.0.0.1"
c.ServerApp.port = int(os.environ.get("FREERIDE_LAB_TEST_PORT", "8888"))
c.ServerApp.port_retries = 0
c.ServerApp.open_browser = False
c.ServerApp.root_dir = os.environ.get("FREERIDE_LAB_TEST_ROOT") or tempfile.mkdtemp(
    prefix="frl-lab-root-"
)
c.ServerApp.allow_root = True
c.ServerApp.disable_check_xsrf = True
c.ServerApp.password = ""
c.IdentityProvider.token = ""

c.LabApp.expose_app_in_browser = True  # window.jupyterapp: run commands from the test
c.LabApp.user_settings_dir = str(_settings_dir)
c.LabApp.workspaces_dir = str(_workspaces_dir)
c.LabApp.news_url = None  # belt and braces with fetchNews=false: the server fetches nothing
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"

# No language-server scan at start-up: less CPU on a 2-core box, nothing the tests use.
c.LanguageServerManager.autodetect = False

# Kernels get a short, bounded shutdown so the fixture's teardown does not wait on a stuck one.
c.KernelManager.shutdown_wait_time = 5.0
