// Reports JupyterLab's theme to the kernel (freeride_lab/ui/theme.py): "light" or "dark" in the
// synced trait `theme`, from <body data-jp-theme-light="true|false">, again on every switch.
function current() {
  const light = document.body.dataset.jpThemeLight;
  if (light === "false") return "dark";
  if (light === "true") return "light";
  return window.matchMedia?.("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

function render({ model, el }) {
  el.classList.add("fr-theme-probe");
  el.setAttribute("aria-hidden", "true");
  const report = () => {
    const theme = current();
    if (model.get("theme") !== theme) {
      model.set("theme", theme);
      model.save_changes();
    }
  };
  const observer = new MutationObserver(report);
  observer.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light"] });
  report();
  return () => observer.disconnect();
};

export default { render };
