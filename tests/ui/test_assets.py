"""Widget assets are found in the package data dir (wheel) or the repo's widgets/ (editable)."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from freeride_lab.ui.assets import asset_dirs, asset_path

REPO = Path(__file__).resolve().parents[2]
ASSETS = ("board.js", "board.css")


def test_search_order_is_package_data_then_repo_widgets():
    package_dir, repo_dir = asset_dirs()
    assert package_dir == REPO / "freeride_lab" / "_widgets"
    assert repo_dir == REPO / "widgets"


def test_package_data_dir_wins_when_present(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "board.js").write_text("// packaged")
    found = asset_path("board.js", search=[tmp_path / "pkg", REPO / "widgets"])
    assert found == tmp_path / "pkg" / "board.js"


def test_repo_widgets_is_the_fallback_for_editable_installs(tmp_path):
    found = asset_path("board.js", search=[tmp_path / "missing", REPO / "widgets"])
    assert found == REPO / "widgets" / "board.js"


def test_this_checkout_resolves_every_asset():
    for name in ASSETS:
        assert asset_path(name).is_file()


def test_missing_asset_names_the_directories_searched(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'nope\.js' not found in .*missing"):
        asset_path("nope.js", search=[tmp_path / "missing"])


def test_built_wheel_contains_widget_assets_and_templates(tmp_path):
    hatchling_wheel = pytest.importorskip("hatchling.builders.wheel")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "freeride_lab", src / "freeride_lab", ignore=ignore)
    shutil.copytree(REPO / "widgets", src / "widgets", ignore=ignore)
    readme = REPO / "README.md"
    (src / "README.md").write_text(readme.read_text() if readme.exists() else "freeride-lab\n")
    [wheel] = hatchling_wheel.WheelBuilder(str(src)).build(
        directory=str(tmp_path / "dist"), versions=["standard"]
    )
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ASSETS:
        assert f"freeride_lab/_widgets/{name}" in names
    assert "freeride_lab/ui/templates/report.html.j2" in names
