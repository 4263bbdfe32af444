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

/* The capture's provenance inside an image, as attnviz.figures.write_image(..., provenance=cap.provenance) writes
   it (attnviz/views/export.py::with_provenance, the same bytes in the same place): a PNG gets a tEXt chunk
   "attnviz-provenance", NUL, the JSON, right after its IHDR chunk; an SVG a <metadata id="attnviz-provenance">
   right after its opening tag. The page holds the shown capture's provenance as that JSON (ASCII, as
   json.dumps(..., ensure_ascii=True) writes it) in a hidden element: export_view's #capture-provenance for the
   text's capture, image_view's #image-provenance for the Image tab's figures (a picture's capture of its own).
   pageProvenance(gd) reads the one of gd's capture, or null where the page has none. */
window.attnviz.NOT_ONE_CAPTURE = ["#view-stats", "#view-atlas", "#view-training", "#view-compare"];
window.attnviz.pageProvenance = function (gd) {
  // a corpus's statistics or atlas, a run's checkpoints, two models side by side: not one capture's figure
  if (gd && gd.closest(window.attnviz.NOT_ONE_CAPTURE.join(","))) {
    return null;
  }
  const held = document.getElementById(gd && gd.closest("#view-image") ? "image-provenance" : "capture-provenance");
  return held && held.textContent ? held.textContent : null;
};

// CRC-32 of the PNG specification (reflected polynomial 0xEDB88320), over a chunk's type and data
window.attnviz.crc32 = function (bytes) {
  if (!window.attnviz.crcTable) {
    window.attnviz.crcTable = Array.from({ length: 256 }, (_, n) => {
      let c = n;
      for (let k = 0; k < 8; k++) {
        c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      }
      return c >>> 0;
    });
  }
  let crc = 0xffffffff;
  for (const b of bytes) {
    crc = window.attnviz.crcTable[(crc ^ b) & 0xff] ^ (crc >>> 8);
  }
  return (crc ^ 0xffffffff) >>> 0;
};

/* url (a PNG or SVG data URL, as figureImage makes) with provenance (JSON text, used as it is; an object is
   stringified) inside it; url unchanged without provenance or for another format. */
window.attnviz.withProvenance = function (url, fmt, provenance) {
  if (!provenance || (fmt !== "png" && fmt !== "svg")) {
    return url;
  }
  // ASCII only, as json.dumps(..., ensure_ascii=True): any other character as its \uXXXX escape
  const json = (typeof provenance === "string" ? provenance : JSON.stringify(provenance)).replace(
    /[^\x00-\x7f]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
  if (fmt === "svg") {
    const comma = url.indexOf(",");
    const svg = decodeURIComponent(url.slice(comma + 1));
    // escaped as the library's one rule escapes (attnviz.views.html.escape_html: Python's html.escape)
    const text = json.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
    const meta = '<metadata id="attnviz-provenance">' + text + "</metadata>";
    return url.slice(0, comma + 1) + encodeURIComponent(svg.replace(/<svg\b[^>]*>/, (open) => open + meta));
  }
  const png = Uint8Array.from(atob(url.slice(url.indexOf(",") + 1)), (c) => c.charCodeAt(0));
  const body = new TextEncoder().encode("tEXtattnviz-provenance\0" + json);  // type, then data: what the CRC covers
  const chunk = new Uint8Array(body.length + 8);
  const view = new DataView(chunk.buffer);
  view.setUint32(0, body.length - 4);  // the data's length, big-endian
  chunk.set(body, 4);
  view.setUint32(body.length + 4, window.attnviz.crc32(body));
  const headerEnd = 8 + 8 + 13 + 4;  // the signature, then IHDR: length and type, 13 bytes, its CRC
  const out = new Uint8Array(png.length + chunk.length);
  out.set(png.subarray(0, headerEnd));
  out.set(chunk, headerEnd);
  out.set(png.subarray(headerEnd), headerEnd + chunk.length);
  let binary = "";
  for (let i = 0; i < out.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, out.subarray(i, i + 0x8000));
  }
  return "data:image/png;base64," + btoa(binary);
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

/* The page's "Figure" button (export_view): each figure drawn in the shown view, through figureImage, with the
   capture's provenance inside (withProvenance), downloaded
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
        const url = window.attnviz.withProvenance(
          await window.attnviz.figureImage(gd, fmt), fmt, window.attnviz.pageProvenance(gd));
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
