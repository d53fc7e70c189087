"""benchmarks/bubble_ledger.py: which side task stepped in each announced bubble."""

from __future__ import annotations

from pathlib import Path

from bench_scripts import load_script

from freeride_lab.core import events as ev

bubble_ledger = load_script("bubble_ledger")
MS = 1_000_000


def _run(tmp_path: Path) -> tuple[dict[str, object], Path]:
    """A bench result with one governed and one vanilla block on stage 1, and its run
    directory: three bubbles in the governed block (both tasks, the leftovers task alone,
    neither, while the stage's task checkpointed), one in the vanilla block."""
    events = tmp_path / "runs" / "r1" / "events"
    events.mkdir(parents=True)
    rank: list[ev.Event] = [
        ev.StepTimed(rank=1, step=s, start_ns=t * MS, end_ns=(t + 99) * MS,
                     optimizer_start_ns=(t + 98) * MS, optimizer_end_ns=(t + 99) * MS)
        for s, t in ((10, 90), (11, 200), (12, 300), (13, 400))
    ]  # fmt: skip
    for start, end, predicted in ((100, 110, 108), (120, 124, 123.5), (130, 134, 133),
                                  (310, 320, 318)):  # fmt: skip
        step = 10 if start < 200 else 12
        rank += [
            ev.BubbleEdge(rank=1, stage=1, step=step, slot=start, edge="start", t_ns=start * MS,
                          predicted_end_ns=int(predicted * MS)),
            ev.BubbleEdge(rank=1, stage=1, step=step, slot=start, edge="end", t_ns=end * MS),
        ]  # fmt: skip
    steps = [("resnet18-0a1b", 101, 105, 4.5, 1), ("image-0c2d", 105.3, 107, 0.8, 3),
             ("image-0c2d", 120.4, 121.2, 0.8, 1)]  # fmt: skip
    side = [
        ev.SideTaskStep(task_id=t, name=t.split("-")[0], stage=1, rank=1, step=10,
                        start_ns=int(a * MS), end_ns=int(z * MS), progress=float(n), unit="x",
                        guard_ns=int(g * MS), calls=n)
        for t, a, z, g, n in steps
    ]  # fmt: skip
    side.append(
        ev.SideTaskCheckpoint(
            task_id="resnet18-0a1b",
            name="resnet18",
            stage=1,
            rank=1,
            start_ns=129 * MS,
            end_ns=131 * MS,
            why="periodic",
        )
    )
    for name, lines in (("rank-1", rank), ("task-a", side)):
        (events / f"{name}.jsonl").write_text("".join(ev.to_json(e) + "\n" for e in lines))
    block = {"run": "m8", "stage": 1, "task": "resnet18", "leftovers_task": "image", "steps": 1}
    result = {
        "runs": [{"name": "m8", "run_dir": "benchmarks/results/runs/r1"}],
        "blocks": [{**block, "mode": "governed", "repeat": 0, "first_step": 10},
                   {**block, "mode": "vanilla", "repeat": 0, "first_step": 12}],
    }  # fmt: skip
    return result, tmp_path / "runs"


def test_each_bubble_of_a_gated_block_lists_the_steps_in_it_and_who_used_it(
    tmp_path: Path,
) -> None:
    result, root = _run(tmp_path)
    stage = bubble_ledger.ledger(result, root)["m8/1"]
    rows = stage["bubbles"]
    assert [(r["length_ms"], r["predicted_ms"]) for r in rows] == [
        (10.0, 8.0),
        (4.0, 3.5),
        (4.0, 3.0),
    ]  # the vanilla block's bubble is not among them
    # task, start and end after the bubble's start, guard (ms), progress, calls (a group of 3)
    assert rows[0]["steps"] == [
        ["resnet18", 1.0, 5.0, 4.5, 1.0, 1],
        ["image", 5.3, 7.0, 0.8, 3.0, 3],
    ]
    assert rows[2]["steps"] == []
    assert [r["held"] for r in rows] == [False, False, True]  # a checkpoint over the third
    found = stage["summary"]
    assert found["by_who"] == {
        "image": {"bubbles": 1, "time_frac": round(4 / 18, 4)},
        "image + resnet18": {"bubbles": 1, "time_frac": round(10 / 18, 4)},
        "none": {"bubbles": 1, "time_frac": round(4 / 18, 4)},
    }
    assert found["tail_frac"] == round((3.0 + 2.8) / 18, 4)  # after each used bubble's last step


def test_the_hand_on_gap_the_guards_and_step_times_by_size_are_summed_up_from_three() -> None:
    rows = [
        {"length_ms": 10.0, "predicted_ms": 9.0,
         "steps": [["vgg19", 0.2, 6.0 + i, 7.0, 32.0],
                   ["image", 6.3 + i + 0.1 * i, 8.0 + i, 0.8, 0.125]]}
        for i in range(3)
    ]  # fmt: skip
    rows[0]["steps"].insert(1, ["vgg19", 6.0, 6.1, 7.0, 8.0])  # one step of another size
    found = bubble_ledger.summary(rows, "vgg19", "image")
    assert found["handon_gap_ms"]["p50"] == 0.4
    assert found["guard_at_entry_ms"]["image"]["p50"] == 0.8
    assert found["unused_length_ms"] is None  # none unused
    by_size = found["step_ms_by_progress"]
    assert list(by_size["vgg19"]) == ["32"]  # the size stepped once is left out
    assert by_size["vgg19"]["32"]["p50"] == 6.8 and by_size["vgg19"]["32"]["steps"] == 3
    assert by_size["image"]["0.125"]["steps"] == 3
