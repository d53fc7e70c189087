// Keeps the Plotly figures beside this widget as wide as their container
// (freeride_lab/ui/plot_fit.py). Plotly resizes a "responsive" figure when the window resizes,
// but a notebook cell also narrows or widens on its own (a side panel opens, the notebook is
// split); a ResizeObserver on each figure's element catches every change of its width and runs
// the figure's own responsive resize handler, which plotly.js sets on the element.
function render({ el }) {
  el.classList.add("fr-plot-fit");
  el.setAttribute("aria-hidden", "true");
  el.style.display = "none";
  const widths = new WeakMap(); // figure element -> last width seen
  const resized = new ResizeObserver((entries) => {
    for (const entry of entries) {
      const figure = entry.target;
      const width = Math.round(entry.contentRect.width);
      const before = widths.get(figure);
      widths.set(figure, width);
      if (before !== undefined && before !== width && width > 0) {
        figure._responsiveChartHandler?.();
      }
    }
  });
  let box = null;
  const watch = () => {
    for (const figure of box.querySelectorAll(".js-plotly-plot")) resized.observe(figure);
  };
  const added = new MutationObserver(watch); // figures draw after this widget renders
  let frame = 0;
  const attach = () => {
    // the view's element joins the page after render returns: wait for it, then watch the box
    if (!el.isConnected || !el.parentElement) {
      frame = requestAnimationFrame(attach);
      return;
    }
    box = el.parentElement;
    const what = { childList: true, subtree: true, attributes: true, attributeFilter: ["class"] };
    added.observe(box, what);
    watch();
  };
  attach();
  return () => {
    cancelAnimationFrame(frame);
    added.disconnect();
    resized.disconnect();
  };
}

export default { render };
