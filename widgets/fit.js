// Keeps the timeline's Plotly figures as wide as their cell (freeride_lab/ui/timeline/fit.py).
// Plotly's `responsive` config follows window resizes only, but a cell also narrows when a side
// panel opens or the notebook's width changes. A ResizeObserver on the timeline's box resizes its
// figures once the box's width has settled (SETTLE_MS after the last change), and only if the
// width moved by MIN_CHANGE_PX since the last resize: a figure's resize changes its height, never
// the box's width, so one resize cannot set off another, and a storm of changes costs one redraw.
const SETTLE_MS = 200;
const MIN_CHANGE_PX = 2;
const FIND_FRAMES = 600; // about 10 s of animation frames to find the box once in the page

function resizeFigures(box) {
  const plotly = window.Plotly; // set by plotly's figure widget bundle
  const figures = Array.from(box.querySelectorAll(".js-plotly-plot")).filter(
    (gd) => gd.isConnected && gd.offsetWidth > 0, // a hidden figure is sized when shown
  );
  if (!figures.length) return;
  if (plotly?.Plots?.resize) {
    for (const gd of figures) Promise.resolve(plotly.Plots.resize(gd)).catch(() => {});
  } else {
    window.dispatchEvent(new Event("resize")); // the figure widgets resize on this
  }
}

function render({ el }) {
  el.classList.add("fr-figure-fit");
  el.setAttribute("aria-hidden", "true");
  let observer = null;
  let timer = null;
  let frames = 0;
  let frame = 0;
  let done = false;
  const watch = () => {
    frame = 0;
    if (done) return;
    const box = el.closest(".fr-timeline");
    if (!box || !box.isConnected) {
      if (++frames < FIND_FRAMES) frame = requestAnimationFrame(watch);
      return;
    }
    let resizedAt = null; // the width the figures were last sized for
    observer = new ResizeObserver((entries) => {
      const width = Math.round(entries[entries.length - 1].contentRect.width);
      if (resizedAt === null) {
        resizedAt = width; // the first report: the figures were drawn at this width
        return;
      }
      clearTimeout(timer);
      timer = setTimeout(() => {
        timer = null;
        if (done || width === 0 || Math.abs(width - resizedAt) < MIN_CHANGE_PX) return;
        resizedAt = width;
        resizeFigures(box);
      }, SETTLE_MS);
    });
    observer.observe(box);
  };
  watch();
  return () => {
    done = true;
    if (frame) cancelAnimationFrame(frame);
    clearTimeout(timer);
    observer?.disconnect();
  };
}

export default { render };
