"""benchmarks/bench_emulated_idle.py end to end on the CPU: an emulated run per place of the
last stage's loss, side by side in one call, with the idle split per rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_script

bench_emulated_idle = load_script("bench_emulated_idle")


@pytest.mark.slow  # two emulated CPU runs, with their calibration
def test_each_place_of_the_loss_gets_its_own_run_with_every_ranks_idle_split(
    tmp_path: Path,
) -> None:
    out = tmp_path / "idle.json"
    argv = ["--device", "cpu", "--schedules", "1F1B", "--steps", "6", "--skip", "2",
            "--real-rank", "3", "--loss-on", "device,host", "--run-root", str(tmp_path / "runs"),
            "--out", str(out)]  # fmt: skip
    assert bench_emulated_idle.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python ")
    assert [r["loss_on"] for r in record["results"]] == ["device", "host"]
    for r in record["results"]:
        assert r["state"] == "finished" and r["real_rank"] == 3
        assert [row["rank"] for row in r["per_rank"]] == [0, 1, 2, 3]
        for row in r["per_rank"]:
            parts = row["schedule_ms_per_step"] + row["peer_ms_per_step"] + row["host_ms_per_step"]
            assert parts == pytest.approx(row["bubble_ms_per_step"], abs=0.01)
        kinds = {a["action"] for a in r["action_ms"] if a["rank"] == 3}
        assert {"F", "B"} <= kinds or {"F", "I", "W"} <= kinds


@pytest.mark.parametrize(("flag", "value"), [("--loss-on", "gpu"), ("--wire-d-model", "0")])
def test_a_bad_list_is_refused_before_any_run(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench_emulated_idle.main([flag, value, "--out", str(tmp_path / "x.json")])
    assert value in capsys.readouterr().err
