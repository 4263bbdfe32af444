/* A figure of the page as PNG or SVG with its CJK labels drawn: attnviz.figureImage(graph, format) resolves
   to a data URL (the export bar's Figure button below, every graph's camera button: modebar_camera.js).
   Plotly's own export (Plotly.toImage) draws its SVG as an image, which cannot use the page's fonts, so on a
   machine without a CJK font its labels come out as boxes; here the
   "attnviz CJK" face (fonts.css) is inlined into the SVG as a data URI when the figure holds CJK text, and
   plotly's svgToImg rasterises that SVG. */
window.attnviz = window.attnviz || {};

window.attnviz.CJK = /[\u3000-\u30ff\u4e00-\u9fff\uff00-\uffef]/;

window.attnviz.cjkFace = function () {
  if (!window.attnviz.cjkFacePromise) {
    const css = document.querySelector('link[href*="fonts.css"]');
    const url = new URL("fonts/attnviz-cjk.woff2", css ? css.href : document.baseURI + "assets/");
    window.attnviz.cjkFacePromise = fetch(url)
      .then((response) => response.blob())
      .then((blob) => new Promise((resolve) => {
        const reader = new FileReader();
        reader.onload = () => resolve(reader.result.split(",")[1]);
        reader.readAsDataURL(blob);
      }));
  }
  return window.attnviz.cjkFacePromise;
};

window.attnviz.figureImage = async function (graph, format) {
  const gd = graph.classList.contains("js-plotly-plot") ? graph : graph.querySelector(".js-plotly-plot");
  let svg = Plotly.Snapshot.toSVG(gd);
  if (window.attnviz.CJK.test(gd.textContent)) {
    const doc = new DOMParser().parseFromString(svg, "image/svg+xml");
    const style = doc.createElementNS("http://www.w3.org/2000/svg", "style");
    style.textContent = '@font-face{font-family:"attnviz CJK";font-display:block;'
      + "unicode-range:U+3000-30FF,U+4E00-9FFF,U+FF00-FFEF;"
      + "src:url(data:font/woff2;base64," + (await window.attnviz.cjkFace()) + ') format("woff2")}';
    doc.documentElement.insertBefore(style, doc.documentElement.firstChild);
    svg = new XMLSerializer().serializeToString(doc);
  }
  if (format === "svg") {
    return "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg);
  }
  const size = gd._fullLayout;
  return Plotly.Snapshot.svgToImg({
    svg: svg, format: format || "png", width: size.width, height: size.height,
    promise: true, canvas: document.createElement("canvas"),
  });
};

/* Save an image's data URL as a file called name: a blob through an <a download> click (an SVG carrying the face
   is too long for a data URL's link). */
window.attnviz.saveImage = async function (url, name) {
  const blob = await (await fetch(url)).blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
};

/* The page's "Figure" button (export_view): each figure drawn in the shown view, through figureImage, downloaded
   as attnviz-<view>[-<graph>]-L<layer>-H<head>.<png|svg> (saveImage). It returns the names (the figure-image-done store) and a message;
   window.attnvizLastExport keeps [{name, url}] of the last click (the tests read the images there). */
window.dash_clientside = window.dash_clientside || {};
window.dash_clientside.attnviz = Object.assign(window.dash_clientside.attnviz || {}, {
  downloadFigures: async function (clicks, format, tab, layer, head) {
    const noUpdate = window.dash_clientside.no_update;
    if (!clicks) {
      return [noUpdate, noUpdate];
    }
    const view = document.getElementById("view-" + tab);
    const graphs = view ? Array.from(view.querySelectorAll(".js-plotly-plot"))
      .filter((gd) => gd._fullLayout && gd.offsetParent !== null) : [];
    if (!graphs.length) {
      return [noUpdate, "This view has no figure drawn to download (run the model, or pick a view with a figure)."];
    }
    const fmt = format === "svg" ? "svg" : "png";
    const exported = [];
    try {
      for (const gd of graphs) {
        const parts = ["attnviz", tab];
        if (graphs.length > 1) {
          parts.push((gd.closest(".dash-graph") || gd).id || String(exported.length + 1));
        }
        if (layer !== null && layer !== undefined && head !== null && head !== undefined) {
          parts.push("L" + layer, "H" + head);
        }
        const name = parts.join("-") + "." + fmt;
        const url = await window.attnviz.figureImage(gd, fmt);
        await window.attnviz.saveImage(url, name);
        exported.push({ name: name, url: url });
      }
    } catch (err) {
      return [noUpdate, "The figure could not be drawn as " + fmt.toUpperCase() + ": " + err];
    }
    window.attnvizLastExport = exported;
    return [exported.map((e) => e.name), noUpdate];
  },
});
