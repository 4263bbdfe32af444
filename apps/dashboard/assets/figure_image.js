/* A figure of the page as PNG or SVG with its CJK labels drawn: attnviz.figureImage(graph, format) resolves
   to a data URL. Plotly's own export (the camera button, Plotly.toImage) draws its SVG as an image, which
   cannot use the page's fonts, so on a machine without a CJK font its labels come out as boxes; here the
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
