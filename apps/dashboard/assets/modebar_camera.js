/* Every graph's camera button (plotly's modebar "toImage") exports through attnviz.figureImage (figure_image.js),
   so its PNG and SVG show the figure's Chinese and Japanese in the page's own face on any machine; plotly's own
   export draws its SVG as an image, which cannot reach the page's fonts (its CJK labels are boxes on a machine
   without a CJK font).

   Plotly gives a modebar button no name in the page and keeps its click handler on the button itself; dcc.Graph's
   config is JSON, so a button of our own with a click function cannot come from Python. One click listener on the
   document, in the capture phase, runs before the button's own: a click on a modebar button drawing plotly's camera
   icon (Plotly.Icons.camera) is stopped there and the graph is exported here instead — on every graph of the page,
   whatever config its view gives it. The format is the export bar's "Export figures as" (#export-format) as it is
   at the click, else the graph's toImageButtonOptions; the file name is theirs, as plotly's button names it:
   <filename or "newplot">.<png|svg>; the image carries the page's capture's provenance (attnviz.withProvenance).
   window.attnvizLastCamera keeps {name, url} of the last export, or {error} (the tests read it). */
window.attnviz = window.attnviz || {};

window.attnviz.isCameraButton = function (button) {
  const path = button && button.querySelector("svg path");
  return Boolean(path && window.Plotly && Plotly.Icons && path.getAttribute("d") === Plotly.Icons.camera.path);
};

window.attnviz.cameraExport = async function (gd) {
  const options = (gd._context && gd._context.toImageButtonOptions) || {};
  // the export bar's choice as it is now (dcc.Graph passes a changed config to plotly only when it redraws)
  const chosen = document.querySelector("#export-format input:checked");
  const fmt = (chosen ? chosen.value : options.format) === "svg" ? "svg" : "png";
  const name = (options.filename || "newplot") + "." + fmt;
  try {
    // the capture's provenance inside the image, as the Figure button's (figure_image.js)
    const url = window.attnviz.withProvenance(
      await window.attnviz.figureImage(gd, fmt), fmt, window.attnviz.pageProvenance(gd));
    await window.attnviz.saveImage(url, name);
    window.attnvizLastCamera = { name: name, url: url };
  } catch (err) {
    window.attnvizLastCamera = { error: String(err) };
    console.warn("attnviz: the figure could not be drawn as " + fmt.toUpperCase() + ": " + err);
  }
};

document.addEventListener(
  "click",
  (event) => {
    const button = event.target instanceof Element ? event.target.closest(".modebar-btn") : null;
    const gd = button ? button.closest(".js-plotly-plot") : null;
    if (!gd || !window.attnviz.isCameraButton(button) || !window.attnviz.figureImage) {
      return;
    }
    event.stopPropagation();
    event.preventDefault();
    window.attnviz.cameraExport(gd);
  },
  true,
);
