// Side-task board (anywidget ESM, no framework, no CDN).
// Reads the synced traits palette, stages, tasks and notice; writes one `request` per user
// action ({op: attach|move|detach|tune|checkpoint, ...}) and lets Python validate and echo the state.
// Keyboard: Tab reaches chips, cards, buttons and sliders; Enter on a chip attaches it to the
// first stage; on a card ←/→ move it between stages, Enter opens its limits, Delete detaches.
const GIB = 1024 ** 3;
const MIME = "application/x-freeride-board";
// [limit, label, min, max, step, slider value -> model value, model value -> slider value]
const LIMITS = [
  ["memory_bytes", "memory GiB", 0, 80, 0.25, (v) => (v > 0 ? Math.round(v * GIB) : null), (v) => (v ?? 0) / GIB],
  ["sm_pct", "SM %", 0, 100, 1, (v) => (v > 0 ? v : null), (v) => v ?? 0],
  ["priority", "priority", 0, 1, 1, (v) => v, (v) => v ?? 1],
  ["budget_ms", "step budget ms", 0, 500, 1, (v) => (v > 0 ? v : null), (v) => v ?? 0],
];
// a symbol beside each state's word, so a state never rests on colour alone
const LIVE = ["created", "paused", "running"]; // states with a task process that can save its state
const ICONS = { submitted: "…", created: "…", paused: "‖", running: "▶", finished: "✓", stopped: "■", failed: "✕" };

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children) if (child != null && child !== false) node.append(child); // text, never HTML
  return node;
}

const gib = (bytes) => (bytes == null ? "?" : `${(bytes / GIB).toFixed(1)} GiB`);
const num = (x) => (typeof x === "number" ? x.toLocaleString(undefined, { maximumFractionDigits: 1 }) : "0");
let seq = 0; // makes every request a change, even when it repeats the last one
const send = (model, request) => { model.set("request", { ...request, seq: ++seq }); model.save_changes(); };

function drop(zone, onDrop) {
  zone.addEventListener("dragover", (event) => {
    if (!event.dataTransfer.types.includes(MIME)) return;
    event.preventDefault(); zone.classList.add("fr-over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("fr-over"));
  zone.addEventListener("drop", (event) => {
    zone.classList.remove("fr-over");
    const data = event.dataTransfer.getData(MIME);
    if (!data) return;
    event.preventDefault(); event.stopPropagation();
    onDrop(JSON.parse(data));
  });
}

function draggable(node, payload, hold) {
  node.setAttribute("draggable", "true");
  node.addEventListener("pointerdown", () => hold(true)); // no redraw between press and dragstart
  node.addEventListener("dragstart", (event) => {
    event.dataTransfer.setData(MIME, JSON.stringify(payload));
    event.dataTransfer.setData("text/plain", payload.name ?? payload.id);
    event.dataTransfer.effectAllowed = "move"; hold(true);
  });
  node.addEventListener("dragend", () => hold(false));
  return node;
}

function sliders(model, task, hold) {
  return LIMITS.map(([key, label, min, max, step, toModel, fromModel]) => {
    const input = h("input", { type: "range", min, max, step, "data-testid": `slider-${task.id}-${key}`,
      "aria-label": `${label} of ${task.caption ?? task.name}` });
    input.value = String(fromModel(task[key]));
    const shown = h("span", { class: "fr-value", "aria-hidden": "true" }, input.value);
    input.addEventListener("pointerdown", () => hold(true));
    input.addEventListener("input", () => (shown.textContent = input.value));
    input.addEventListener("keydown", (event) => event.stopPropagation()); // arrows move the slider only
    input.addEventListener("change", () => { hold(false);
      send(model, { op: "tune", id: task.id, limits: { [key]: toModel(Number(input.value)) } }); });
    return h("label", { class: "fr-slider" }, h("span", {}, label), input, shown);
  });
}

function card(model, task, ctx) {
  const { open, hold, redraw, stages } = ctx;
  const isOpen = open.has(task.id);
  const state = String(task.state ?? "").toLowerCase();
  const caption = task.caption ?? `${task.name} · ${task.id}`;
  const toggle = h("button", { class: "fr-tune", "aria-expanded": isOpen, "aria-label": `limits of ${caption}`,
    "data-testid": `tune-${task.id}`, onclick: () => { isOpen ? open.delete(task.id) : open.add(task.id); redraw(); } },
    isOpen ? "▾" : "⚙");
  const save = LIVE.includes(state) && !task.final && h("button", { class: "fr-save", "data-testid": `save-${task.id}`, title: "save its state now; it goes on",
    "aria-label": `save the state of ${caption} now`, onclick: () => send(model, { op: "checkpoint", id: task.id }) }, "save");
  const fix = task.fix && !task.final && h("button", { class: "fr-fix", "data-testid": `fix-${task.id}`,
    onclick: () => send(model, { op: "tune", id: task.id, limits: task.fix.limits }) }, task.fix.label);
  const node = h("div", { class: `fr-card fr-state-${state}${task.final ? " fr-final" : ""}`, tabindex: 0,
    role: "group", title: caption, "data-testid": `card-${task.id}`, "data-task": task.name,
    "aria-label": `${caption}: ${state}. ${task.why ?? ""}` },
    h("div", { class: "fr-card-head" }, h("b", {}, task.label ?? task.name),
      task.label && task.label !== task.name ? h("code", { class: "fr-code" }, task.name) : "",
      task.badge && h("span", { class: "fr-badge", title: task.badge_title ?? "", "data-testid": `badge-${task.id}` }, task.badge),
      h("span", { class: "fr-state", "data-testid": `state-${task.id}` }, `${ICONS[state] ?? ""} ${state}${task.final ? " (final)" : ""}`),
      toggle),
    h("div", { class: "fr-progress" }, `${num(task.progress)} ${task.unit ?? ""}`,
      task.overruns ? ` · ${task.overruns} overrun${task.overruns === 1 ? "" : "s"}` : "",
      task.saved ? h("span", { "data-testid": `saved-${task.id}` }, ` · ${task.saved}`) : "", save),
    task.why && h("div", { class: "fr-why", "data-testid": `why-${task.id}` }, task.why), fix,
    task.error && !task.why?.includes(task.error) && h("div", { class: "fr-error", role: "alert", "data-testid": `error-${task.id}` }, task.error),
    ...(isOpen ? sliders(model, task, hold) : []));
  node.addEventListener("keydown", (event) => {
    if (event.target !== node) return;
    const at = stages.indexOf(task.stage);
    const to = { ArrowLeft: stages[at - 1], ArrowRight: stages[at + 1] }[event.key];
    if (to !== undefined) send(model, { op: "move", id: task.id, stage: to });
    else if (event.key === "Enter") toggle.click();
    else if (event.key === "Delete" || event.key === "Backspace") send(model, { op: "detach", id: task.id });
    else return;
    event.preventDefault();
  });
  return draggable(node, { kind: "card", id: task.id, stage: task.stage }, hold);
}

function render({ model, el }) {
  const open = new Set(); // ids of cards whose sliders are shown
  const root = h("div", { class: "fr-board", "data-testid": "board" });
  let busy = false; // a drag or slider is in progress: redraw after it, not under the pointer
  let pending = false;
  const hold = (on) => { busy = on; if (!on && pending) draw(); };
  const release = () => hold(false);
  function draw() {
    if (busy) { pending = true; return; } pending = false;
    const active = document.activeElement; // keep the keyboard's place across the redraw
    const focused = active && root.contains?.(active) ? active.dataset?.testid : null;
    const tasks = model.get("tasks") ?? [];
    const stageList = model.get("stages") ?? [];
    const ctx = { open, hold, redraw: draw, stages: stageList.map((s) => s.stage) };
    const palette = h("div", { class: "fr-palette", role: "toolbar", "aria-label": "side tasks", "data-testid": "palette" },
      h("div", { class: "fr-title" }, "Side tasks: drag onto a stage (or press Enter), drop a card here to detach"),
      ...(model.get("palette") ?? []).map((p) =>
        draggable(h("button", { class: "fr-chip", title: `${p.title} · ${p.name} · ${p.unit}`, "data-testid": `palette-${p.name}`,
          "aria-label": `attach ${p.title} (${p.name}) to stage ${ctx.stages[0] ?? ""}`,
          onclick: () => ctx.stages.length && send(model, { op: "attach", name: p.name, stage: ctx.stages[0] }) },
          p.title, p.title !== p.name ? h("code", { class: "fr-code" }, p.name) : ""),
          { kind: "palette", name: p.name }, hold)));
    drop(palette, (d) => d.kind === "card" && send(model, { op: "detach", id: d.id }));
    const zones = stageList.map((s) => {
      const bubbles = (s.bubbles_ms ?? []).map((b) => b.toFixed(1)).join(", ") || "–";
      const meta = `free ${gib(s.free_bytes)} · bubbles ${bubbles} ms`;
      const zone = h("div", { class: "fr-stage", role: "region", "aria-label": `${s.label ?? `stage ${s.stage}`}: ${meta}`,
        "data-testid": `stage-${s.stage}` },
        h("div", { class: "fr-title" }, s.label ?? `stage ${s.stage}`), h("div", { class: "fr-meta" }, meta),
        ...tasks.filter((t) => t.stage === s.stage).map((t) => card(model, t, ctx)));
      drop(zone, (d) => {
        if (d.kind === "palette") send(model, { op: "attach", name: d.name, stage: s.stage });
        else if (d.kind === "card" && d.stage !== s.stage) send(model, { op: "move", id: d.id, stage: s.stage });
      });
      return zone;
    });
    const notice = model.get("notice");
    root.replaceChildren(palette, h("div", { class: "fr-stages" }, ...zones),
      notice ? h("div", { class: "fr-notice", role: "alert", "data-testid": "notice" }, notice) : "");
    if (focused) root.querySelector(`[data-testid=${JSON.stringify(focused)}]`)?.focus();
  }

  const events = ["change:palette", "change:stages", "change:tasks", "change:notice"];
  events.forEach((name) => model.on(name, draw)); window.addEventListener("pointerup", release);
  el.append(root); draw();
  return () => { events.forEach((name) => model.off(name, draw)); window.removeEventListener("pointerup", release); root.remove(); };
}

export default { render };
