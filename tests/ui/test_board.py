"""Side-task board: requests set as the browser would reach the controller; rejections show."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

for _ui_package in ("anywidget",):
    pytest.importorskip(_ui_package, reason="the notebook UI packages are not installed")

from freeride_lab.ui.board import SideTaskBoard, plain_controls  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PALETTE = [
    {"name": "resnet18", "title": "ResNet-18", "unit": "samples"},
    {"name": "pagerank", "title": "PageRank", "unit": "iterations"},
]
STAGES = [{"stage": s, "free_bytes": (8 - s) * 2**30, "bubbles_ms": [12.5, 40.0]} for s in range(3)]


class FakeController:
    """Records calls; rejects what a session would (stage 2 is full, task t9 is gone)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.next_id = 0

    def attach(self, name, stage, **limits):
        self.calls.append(("attach", name, stage, limits))
        if stage == 2:
            raise ValueError("stage 2 has 0.5 GiB free; resnet18 needs 1.2 GiB")
        self.next_id += 1
        return {
            "id": f"t{self.next_id}",
            "name": name,
            "stage": stage,
            "state": "CREATED",
            **limits,
        }

    def move(self, task_id, stage):
        self.calls.append(("move", task_id, stage))
        if stage == 2:
            raise ValueError("stage 2 has 0.5 GiB free")

    def detach(self, task_id):
        self.calls.append(("detach", task_id))

    def checkpoint(self, task_id):
        self.calls.append(("checkpoint", task_id))
        if task_id == "t2":
            raise ValueError("could not checkpoint t2: its process saved nothing (not started yet)")
        return {"id": task_id, "name": "resnet18", "stage": 0, "state": "RUNNING", "progress": 64}

    def tune(self, task_id, **limits):
        self.calls.append(("tune", task_id, limits))
        if limits.get("sm_pct", 1) > 100:
            raise ValueError(f"sm_pct={limits['sm_pct']} must be in (0, 100]")
        return None


@pytest.fixture
def board():
    b = SideTaskBoard(FakeController(), palette=PALETTE, stages=STAGES)
    b.request = {"op": "attach", "name": "resnet18", "stage": 0, "seq": 1}
    b.request = {"op": "attach", "name": "pagerank", "stage": 1, "seq": 2}
    return b


def by_id(board, task_id):
    return next(t for t in board.tasks if t["id"] == task_id)


def test_attach_request_reaches_controller_and_adds_a_card(board):
    assert board.controller.calls[0] == ("attach", "resnet18", 0, {})
    assert [(t["id"], t["stage"], t["state"]) for t in board.tasks] == [
        ("t1", 0, "CREATED"),
        ("t2", 1, "CREATED"),
    ]


def test_request_from_the_front_end_state_message_is_handled():
    b = SideTaskBoard(FakeController(), palette=PALETTE, stages=STAGES)
    b.set_state({"request": {"op": "attach", "name": "pagerank", "stage": 1, "seq": 7}})
    assert b.controller.calls == [("attach", "pagerank", 1, {})]
    assert b.request == {}


def test_request_is_cleared_after_handling(board):
    assert board.request == {}


def test_attach_passes_limits_with_their_types(board):
    board.request = {
        "op": "attach",
        "name": "resnet18",
        "stage": 1,
        "limits": {"memory_bytes": 1.5 * 2**30, "sm_pct": "50", "priority": 1},
    }
    assert board.controller.calls[-1] == (
        "attach",
        "resnet18",
        1,
        {"memory_bytes": 1610612736, "sm_pct": 50.0, "priority": 1},
    )


def test_move_request_moves_the_card(board):
    board.request = {"op": "move", "id": "t1", "stage": 1}
    assert board.controller.calls[-1] == ("move", "t1", 1)
    assert by_id(board, "t1")["stage"] == 1


def test_detach_request_removes_the_card(board):
    board.request = {"op": "detach", "id": "t1"}
    assert board.controller.calls[-1] == ("detach", "t1")
    assert [t["id"] for t in board.tasks] == ["t2"]


def test_checkpoint_request_saves_through_the_controller_and_says_when_on_the_card(board):
    board.request = {"op": "checkpoint", "id": "t1", "seq": 3}
    assert board.controller.calls[-1] == ("checkpoint", "t1")
    card = by_id(board, "t1")
    assert re.fullmatch(r"saved \d\d:\d\d:\d\d", card["saved"])
    assert card["progress"] == 64  # the session's answer reaches the card
    assert "saved" not in by_id(board, "t2")


def test_the_saved_line_outlives_the_sessions_ticks_and_goes_with_its_card(board):
    board.request = {"op": "checkpoint", "id": "t1", "seq": 3}
    saved = by_id(board, "t1")["saved"]
    tick = [
        {"id": "t1", "name": "resnet18", "stage": 0},
        {"id": "t2", "name": "pagerank", "stage": 1},
    ]
    board.set_tasks(tick)
    assert by_id(board, "t1")["saved"] == saved
    board.request = {"op": "tune", "id": "t1", "limits": {"sm_pct": 50}, "seq": 4}
    assert by_id(board, "t1")["saved"] == saved
    board.request = {"op": "detach", "id": "t1", "seq": 5}
    board.set_tasks(tick)  # the same id back (attach resumes a detached task): no old line
    assert "saved" not in by_id(board, "t1")


def test_a_refused_checkpoint_shows_on_that_card(board):
    board.request = {"op": "checkpoint", "id": "t2", "seq": 3}
    assert "its process saved nothing" in by_id(board, "t2")["error"]
    assert "saved" not in by_id(board, "t2")
    board.request = {"op": "checkpoint", "id": "t9", "seq": 4}
    assert board.controller.calls[-1] == ("checkpoint", "t2")  # t9: refused by the board
    assert "unknown task id 't9'" in board.notice


def test_tune_request_updates_limits_on_the_card(board):
    board.request = {"op": "tune", "id": "t2", "limits": {"sm_pct": 25, "budget_ms": 30}}
    assert board.controller.calls[-1] == ("tune", "t2", {"sm_pct": 25.0, "budget_ms": 30.0})
    assert (by_id(board, "t2")["sm_pct"], by_id(board, "t2")["budget_ms"]) == (25.0, 30.0)


def test_rejected_move_sets_error_on_that_card_only(board):
    before = {t["id"]: dict(t) for t in board.tasks}
    board.request = {"op": "move", "id": "t1", "stage": 2}
    assert by_id(board, "t1")["error"] == "stage 2 has 0.5 GiB free"
    assert by_id(board, "t1")["stage"] == 0
    assert by_id(board, "t2") == before["t2"]
    assert board.request == {}


def test_rejected_tune_keeps_old_limits(board):
    board.request = {"op": "tune", "id": "t2", "limits": {"sm_pct": 150}}
    card = by_id(board, "t2")
    assert card["error"] == "sm_pct=150.0 must be in (0, 100]"
    assert card["sm_pct"] is None


def test_accepted_request_clears_the_cards_error(board):
    board.request = {"op": "move", "id": "t1", "stage": 2}
    board.request = {"op": "move", "id": "t1", "stage": 1}
    assert by_id(board, "t1")["error"] == ""


def test_rejected_attach_sets_notice_and_adds_no_card(board):
    board.request = {"op": "attach", "name": "resnet18", "stage": 2}
    assert "resnet18 needs 1.2 GiB" in board.notice
    assert len(board.tasks) == 2


def test_unknown_op_is_rejected_with_valid_ops():
    b = SideTaskBoard(FakeController())
    b.request = {"op": "explode"}
    valid = "attach, move, detach, tune, checkpoint"
    assert b.notice == f"explode: unknown op 'explode'; valid: {valid}"


def test_unknown_palette_name_is_rejected_before_the_controller(board):
    calls = len(board.controller.calls)
    board.request = {"op": "attach", "name": "vgg19", "stage": 0}
    assert "unknown side task 'vgg19'" in board.notice
    assert len(board.controller.calls) == calls


def test_unknown_limit_is_rejected_on_the_card(board):
    board.request = {"op": "tune", "id": "t1", "limits": {"gpu_pct": 5}}
    assert (
        by_id(board, "t1")["error"]
        == "unknown limit(s) ['gpu_pct']; valid: memory_bytes, sm_pct, priority, budget_ms"
    )


def test_board_without_controller_says_so():
    b = SideTaskBoard(palette=PALETTE, stages=STAGES)
    b.request = {"op": "attach", "name": "resnet18", "stage": 0}
    assert "no controller" in b.notice


def test_controller_bug_is_shown_not_raised(board):
    def broken(task_id):
        raise RuntimeError("worker gone")

    board.controller.detach = broken
    board.request = {"op": "detach", "id": "t1"}
    assert by_id(board, "t1")["error"] == "RuntimeError: worker gone"


def test_tasks_are_replaced_not_mutated(board):
    seen = []
    board.observe(lambda change: seen.append(change["new"]), names="tasks")
    old = board.tasks
    board.request = {"op": "move", "id": "t1", "stage": 1}
    assert seen and seen[-1] is not old
    assert old[0]["stage"] == 0


def test_set_tasks_keeps_an_existing_error(board):
    board.request = {"op": "move", "id": "t1", "stage": 2}
    board.set_tasks([{"id": "t1", "name": "resnet18", "stage": 0, "progress": 64.0}])
    assert by_id(board, "t1")["error"] == "stage 2 has 0.5 GiB free"
    assert by_id(board, "t1")["progress"] == 64.0


def test_state_is_plain_json():
    import json

    import numpy as np

    b = SideTaskBoard(
        stages=[
            {"stage": np.int64(1), "free_bytes": np.float64(2.0), "bubbles_ms": (1.0, float("nan"))}
        ]
    )
    assert json.loads(json.dumps(b.stages)) == [
        {"stage": 1, "free_bytes": 2.0, "bubbles_ms": [1.0, None], "label": "stage 1"}
    ]


def test_esm_and_css_come_from_the_widgets_assets():
    b = SideTaskBoard()
    assert "export default" in b._esm
    assert ".fr-board" in b._css


def test_plain_controls_drive_the_same_controller(board):
    box = plain_controls(board)
    (
        (name, stage, attach),
        (task, target, move, checkpoint, detach),
        (_memory, sm),
        (_priority, _budget, tune),
        status,
    ) = ([*row.children] if hasattr(row, "children") else row for row in box.children)
    name.value, stage.value = "pagerank", 0
    attach.click()
    assert board.controller.calls[-1][:3] == ("attach", "pagerank", 0)
    task.value, target.value = "t1", 2
    move.click()
    assert "stage 2 has 0.5 GiB free" in status.value
    sm.value = 40
    tune.click()
    assert board.controller.calls[-1] == (
        "tune",
        "t1",
        {"memory_bytes": None, "sm_pct": 40.0, "priority": 1, "budget_ms": None},
    )
    checkpoint.click()
    assert board.controller.calls[-1] == ("checkpoint", "t1")
    assert "saved" in status.value
    detach.click()
    assert "t1" not in [t["id"] for t in board.tasks]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node for the JS syntax check")
def test_board_js_parses():
    subprocess.run(["node", "--check", str(REPO / "widgets" / "board.js")], check=True)


def test_a_task_on_the_leftovers_carries_a_word_for_its_card(board):
    board.set_tasks([
        {"id": "t1", "name": "vgg19", "stage": 1, "gating": "bubbles"},
        {"id": "t2", "name": "image", "stage": 1, "gating": "leftovers"},
    ])  # fmt: skip
    assert "badge" not in by_id(board, "t1")
    assert by_id(board, "t2")["badge"] == "leftovers"
    assert "main task leaves" in by_id(board, "t2")["badge_title"]


def test_board_js_stays_small_and_framework_free():
    source = (REPO / "widgets" / "board.js").read_text()
    assert len(source.splitlines()) <= 170
    assert "http://" not in source and "https://" not in source
    assert "innerHTML" not in source
    for testid in ("stage-${s.stage}", "palette-${p.name}", "card-${task.id}"):
        assert testid in source


# A minimal DOM and anywidget model, enough to run widgets/board.js under node without a browser.
_NODE_HARNESS = r"""
class Node {
  constructor(tag) { this.tag = tag; this.children = []; this.attrs = {}; this.listeners = {};
    this.className = ""; this.value = ""; this.parent = null;
    this.classList = { add: () => {}, remove: () => {} }; }
  set textContent(t) { this.children = [String(t)]; }
  get textContent() {
    return this.children.map((c) => (typeof c === "string" ? c : c.textContent)).join("");
  }
  setAttribute(k, v) { this.attrs[k] = v; }
  getAttribute(k) { return this.attrs[k]; }
  addEventListener(type, fn) { (this.listeners[type] ??= []).push(fn); }
  append(...kids) {
    for (const k of kids) { if (k instanceof Node) k.parent = this; this.children.push(k); }
  }
  replaceChildren(...kids) { this.children = []; this.append(...kids.filter((k) => k !== "")); }
  remove() {
    if (this.parent) this.parent.children = this.parent.children.filter((c) => c !== this);
  }
  fire(type, event = {}) {
    const ev = { type, preventDefault() {}, stopPropagation() { this.stopped = true; }, ...event };
    for (let n = this; n && !ev.stopped; n = n.parent) {
      for (const fn of n.listeners[type] ?? []) fn(ev);
    }
  }
  find(id) {
    if (this.attrs["data-testid"] === id) return this;
    for (const c of this.children) if (c instanceof Node) { const f = c.find(id); if (f) return f; }
    return null;
  }
}
const windowListeners = {};
globalThis.document = { createElement: (tag) => new Node(tag) };
globalThis.window = { addEventListener: (t, f) => (windowListeners[t] = f),
                      removeEventListener: (t) => delete windowListeners[t] };
const state = JSON.parse(process.argv[2]);
const handlers = {};
const sent = [];
const model = { get: (k) => state[k], set: (k, v) => { state[k] = v; },
  save_changes: () => sent.push(state.request),
  on: (e, f) => (handlers[e] = f), off: (e) => delete handlers[e] };
const { default: widget } = await import(process.argv[3]);
const el = new Node("div");
const cleanup = widget.render({ model, el });
function dnd(from, to) {
  const store = {};
  const dataTransfer = {
    types: [], setData(t, v) { store[t] = v; this.types.push(t); }, getData: (t) => store[t],
  };
  el.find(from).fire("dragstart", { dataTransfer });
  el.find(to).fire("dragover", { dataTransfer });
  el.find(to).fire("drop", { dataTransfer });
  el.find(from)?.fire("dragend", {});
}
const out = { testids: [] };
(function walk(n) {
  if (n.attrs?.["data-testid"]) out.testids.push(n.attrs["data-testid"]);
  n.children?.forEach((c) => c instanceof Node && walk(c));
})(el);
dnd("palette-resnet18", "stage-1");
dnd("card-t1", "stage-2");
dnd("card-t1", "palette");
out.saved = el.find("saved-t1")?.textContent ?? null;
out.saveButtons = out.testids.filter((id) => id.startsWith("save-"));
el.find("save-t1").fire("click");
el.find("tune-t1").fire("click");
const slider = el.find("slider-t1-sm_pct");
slider.value = "40";
slider.fire("change");
out.error = el.find("error-t1")?.textContent ?? null;
state.notice = "attach x: rejected"; handlers["change:notice"]();
out.notice = el.find("notice")?.textContent ?? null;
out.sent = sent.map(({ seq, ...r }) => r);
cleanup();
out.handlersAfterCleanup = Object.keys(handlers).length;
out.childrenAfterCleanup = el.children.length;
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the board's ESM")
def test_board_js_sends_requests_for_drags_and_sliders(tmp_path):
    import json

    harness = tmp_path / "harness.mjs"
    harness.write_text(_NODE_HARNESS)
    state = {
        "palette": PALETTE,
        "stages": STAGES,
        "notice": "",
        "request": {},
        "tasks": [
            {
                "id": "t1",
                "name": "resnet18",
                "stage": 0,
                "state": "RUNNING",
                "progress": 12,
                "unit": "samples",
                "overruns": 1,
                "sm_pct": None,
                "error": "stage 2 is full",
                "saved": "saved 14:02:31",
            },
            {"id": "t2", "name": "vgg19", "stage": 1, "state": "FAILED", "error": "CUDA OOM"},
        ],
    }
    run = subprocess.run(
        ["node", str(harness), json.dumps(state), (REPO / "widgets" / "board.js").as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert {"palette", "stage-0", "stage-1", "stage-2", "palette-resnet18", "card-t1"} <= set(
        out["testids"]
    )
    assert out["sent"] == [
        {"op": "attach", "name": "resnet18", "stage": 1},
        {"op": "move", "id": "t1", "stage": 2},
        {"op": "detach", "id": "t1"},
        {"op": "checkpoint", "id": "t1"},
        {"op": "tune", "id": "t1", "limits": {"sm_pct": 40}},
    ]
    assert out["saved"] == " · saved 14:02:31"
    assert out["saveButtons"] == ["save-t1"]  # a failed task has no process to save
    assert out["error"] == "stage 2 is full"
    assert out["notice"] == "attach x: rejected"
    assert (out["handlersAfterCleanup"], out["childrenAfterCleanup"]) == (0, 0)


# The board's ESM in a real Chromium with a stand-in model that echoes like Python would.
_BROWSER_PAGE = """<!doctype html><html><head><style>%(css)s</style></head>
<body><div id="host"></div><script type="module">
const state = %(state)s;
const handlers = {};
window.sent = [];
const echo = (r) => {
  if (r.op === "attach") state.tasks = [...state.tasks, {id: "t1", name: r.name, stage: r.stage,
    state: "PAUSED", progress: 0, unit: "samples", overruns: 0, error: ""}];
  if (r.op === "move") state.tasks = state.tasks.map((t) => t.id !== r.id ? t
    : r.stage === 2 ? {...t, error: "stage 2 is full"} : {...t, stage: r.stage, error: ""});
  if (r.op === "detach") state.tasks = state.tasks.filter((t) => t.id !== r.id);
  if (r.op === "checkpoint") state.tasks = state.tasks.map((t) => t.id !== r.id ? t
    : {...t, saved: "saved 14:02:31"});
};
const model = {
  get: (k) => state[k], set: (k, v) => { state[k] = v; },
  save_changes: () => {
    window.sent.push(state.request); echo(state.request); state.request = {};
    setTimeout(() => handlers["change:tasks"]?.(), 0);
  },
  on: (e, f) => { handlers[e] = f; }, off: (e) => { delete handlers[e]; },
};
const url = URL.createObjectURL(new Blob([%(esm)s], {type: "text/javascript"}));
const widget = (await import(url)).default;
window.cleanup = widget.render({model, el: document.getElementById("host")});
window.ready = true;
</script></body></html>"""


@pytest.mark.browser
def test_board_drag_and_drop_in_chromium():
    import json

    from playwright.sync_api import sync_playwright

    state = {"palette": PALETTE, "stages": STAGES, "tasks": [], "notice": "", "request": {}}
    page_html = _BROWSER_PAGE % {
        "css": (REPO / "widgets" / "board.css").read_text(),
        "state": json.dumps(state),
        "esm": json.dumps((REPO / "widgets" / "board.js").read_text()),
    }
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    args = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=args)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.set_content(page_html)
            page.wait_for_function("window.ready === true", timeout=30_000)
            t = page.get_by_test_id
            t("palette-resnet18").drag_to(t("stage-1"))
            t("stage-1").get_by_test_id("card-t1").wait_for(timeout=10_000)
            t("card-t1").drag_to(t("stage-2"))
            t("error-t1").wait_for(timeout=10_000)
            t("save-t1").click()
            t("saved-t1").wait_for(timeout=10_000)
            saved = t("saved-t1").inner_text()
            t("tune-t1").click()
            t("slider-t1-sm_pct").fill("40")
            t("card-t1").drag_to(t("palette"))
            t("card-t1").wait_for(state="detached", timeout=10_000)
            sent = page.evaluate("window.sent.map(({seq, ...r}) => r)")
        finally:
            browser.close()
    assert errors == []
    assert sent == [
        {"op": "attach", "name": "resnet18", "stage": 1},
        {"op": "move", "id": "t1", "stage": 2},
        {"op": "checkpoint", "id": "t1"},
        {"op": "tune", "id": "t1", "limits": {"sm_pct": 40}},
        {"op": "detach", "id": "t1"},
    ]
    assert saved.strip() == "· saved 14:02:31"
