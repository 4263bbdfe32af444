"""Figures as image files through kaleido with their CJK labels drawn, also on a machine without a CJK font
(:func:`to_image`, :func:`write_image`).

Kaleido draws a figure in a headless Chromium, and plotly's export draws the figure's SVG as an image, which
reaches the system's fonts only — not a web face — so ``fig.write_image`` on a machine without a CJK font
draws every Chinese or Japanese character as the same box. Here the browser kaleido starts is given the
dashboard's face "attnviz CJK" as a system font of its own: the shipped WOFF2 converted to OpenType (fontconfig
cannot read WOFF2) in a folder of attnviz's cache, named by a ``fonts.conf`` that includes the system's
configuration, and ``FONTCONFIG_FILE`` pointing at it while that browser starts (Linux, where Chromium finds
its fonts through fontconfig; macOS and Windows ship CJK fonts of their own). An SVG that holds CJK text also
carries the face inlined (:func:`~attnviz.views.html.cjk_font_face`), so it reads in any viewer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import re
import struct
import sys
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ArgumentTypeError, InputError
from ..files import atomic_path, write_bytes
from .html import CJK_TEXT, cjk_font_face, cjk_font_path, escape_html

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["IMAGE_FORMATS", "cjk_fontconfig", "cjk_fontconfig_file", "to_image", "write_image"]

#: what kaleido writes; a file's suffix names its format where ``format`` is not given
IMAGE_FORMATS = ("png", "jpg", "jpeg", "webp", "svg", "pdf")
#: FONTCONFIG_FILE is process-wide: one browser start at a time sets it
_ENV_LOCK = threading.Lock()
_SVG_OPEN = re.compile(rb"<svg\b[^>]*>")


def _cache_root() -> Path:
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = str(Path.home() / "Library" / "Caches")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnviz"


def _write_once(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed), unless it already holds ``data``'s size."""
    if path.is_file() and path.stat().st_size == len(data):
        return
    write_bytes(path, data, what="the CJK font")


def cjk_fontconfig_file(folder: str | Path | None = None) -> Path:
    """A ``fonts.conf`` that adds the face "attnviz CJK" to the system's fonts, for a browser kaleido starts.

    The face (:func:`~attnviz.views.html.cjk_font_path`, WOFF2) is converted to OpenType once (fontTools;
    about 1.8 MB, a fraction of a second) into ``folder`` — by default attnviz's cache folder
    (``$XDG_CACHE_HOME/attnviz`` or ``~/.cache/attnviz``), in a subfolder named by the face's hash — and
    the file written there includes the configuration in force (``$FONTCONFIG_FILE``, else
    ``/etc/fonts/fonts.conf``), so every other font stays found."""
    woff2 = cjk_font_path()
    digest = hashlib.sha256(woff2.read_bytes()).hexdigest()[:12]
    where = (Path(folder) if folder is not None else _cache_root()) / f"cjk-font-{digest}"
    otf = where / "attnviz-cjk.otf"
    conf = where / "fonts.conf"
    try:
        where.mkdir(parents=True, exist_ok=True)
        if not otf.is_file():
            try:  # fontTools[woff] (brotli) comes with attnviz[app]; deferred: only an image export needs it
                from fontTools.ttLib import TTFont
            except ImportError as err:
                raise InputError(
                    "writing an image with CJK labels needs fontTools with WOFF2 support: pip install 'fonttools[woff]'"
                ) from err
            font = TTFont(woff2)
            font.flavor = None
            with atomic_path(otf, what="the CJK font") as tmp:
                font.save(tmp)
        system = os.environ.get("FONTCONFIG_FILE") or "/etc/fonts/fonts.conf"
        if Path(system).resolve() == conf.resolve():
            system = "/etc/fonts/fonts.conf"
        text = (
            '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">\n<fontconfig>\n'
            f'  <include ignore_missing="yes">{_xml(system)}</include>\n'
            f"  <dir>{_xml(str(where))}</dir>\n"
            f"  <cachedir>{_xml(str(where / 'fontconfig'))}</cachedir>\n</fontconfig>\n"
        )
        _write_once(conf, text.encode("utf-8"))
    except OSError as err:
        raise InputError(
            f"cannot write the CJK face for kaleido's browser under {str(where)!r} ({err}): "
            "pass folder=… a writable folder (attnviz.figures.write_image(…, font_folder=…))"
        ) from err
    return conf


def _xml(text: str) -> str:
    return escape_html(text)


@contextmanager
def cjk_fontconfig(folder: str | Path | None = None) -> Iterator[Path]:
    """``FONTCONFIG_FILE`` set to :func:`cjk_fontconfig_file` for a browser started inside the block, the
    previous value (or its absence) restored after it, also when the block raises. One block at a time."""
    conf = cjk_fontconfig_file(folder)
    with _ENV_LOCK:
        before = os.environ.get("FONTCONFIG_FILE")
        os.environ["FONTCONFIG_FILE"] = str(conf)
        try:
            yield conf
        finally:
            if before is None:
                del os.environ["FONTCONFIG_FILE"]
            else:
                os.environ["FONTCONFIG_FILE"] = before


def _image_format(format: str | None, path: Path | None) -> str:
    if format is None:
        format = path.suffix.lstrip(".").lower() if path is not None and path.suffix else "png"
    fmt = format.lower().lstrip(".")
    if fmt not in IMAGE_FORMATS:
        raise InputError(f"cannot write an image as {format!r}: pass format= one of {', '.join(IMAGE_FORMATS)}")
    return "jpeg" if fmt == "jpg" else fmt


def to_image(
    fig: go.Figure,
    format: str = "png",
    *,
    width: int | None = None,
    height: int | None = None,
    scale: float | None = None,
    font_folder: str | Path | None = None,
    provenance: dict[str, Any] | None = None,
) -> bytes:
    """A figure as image bytes through kaleido (``png``, ``jpeg``/``jpg``, ``webp``, ``svg``, ``pdf``), its
    Chinese and Japanese labels drawn in the face "attnviz CJK" also on a machine without a CJK font — where
    plotly's ``fig.to_image`` draws boxes.

    Kaleido starts its own headless browser for the call with the face among its fonts (:func:`cjk_fontconfig`;
    a browser of ``kaleido.start_sync_server`` is not used, it was started without the face); an SVG that holds
    CJK text carries the face inlined (≈1.8 MB more). ``width``/``height`` default to the figure's layout, then
    plotly's ``plotly.io.defaults``; ``scale`` to plotly's default; MathJax is off unless
    ``plotly.io.defaults.mathjax`` names one (kaleido's own default loads it from a CDN). ``font_folder``: where the face is converted
    to OpenType (default attnviz's cache folder). ``provenance`` (a capture's :attr:`~attnviz.Capture.provenance`)
    goes into the file as JSON: a PNG's ``tEXt`` chunk ``attnviz-provenance`` (``PIL.Image.open(f).text``), an
    SVG's ``<metadata id="attnviz-provenance">``; JPEG, WebP and PDF carry none."""
    import plotly.graph_objects as go
    import plotly.io as pio

    if not isinstance(fig, go.Figure):
        raise ArgumentTypeError(f"to_image and write_image take a plotly Figure, got {type(fig).__name__}")
    try:
        import kaleido
    except ImportError as err:
        raise InputError("writing a figure as an image needs kaleido: pip install 'attnviz[app]'") from err
    fmt = _image_format(format, None)
    spec = fig.to_dict()
    layout = spec.get("layout", {})
    template = layout.get("template", {}).get("layout", {}) if isinstance(layout.get("template"), dict) else {}
    opts = dict(
        format=fmt,
        width=width or layout.get("width") or template.get("width") or pio.defaults.default_width,
        height=height or layout.get("height") or template.get("height") or pio.defaults.default_height,
        scale=scale or pio.defaults.default_scale,
    )
    # plotly's settings where set; MathJax only where set (kaleido's default fetches it from a CDN: offline first)
    kopts = {
        "plotlyjs": pio.defaults.plotlyjs,
        "mathjax": pio.defaults.mathjax or False,
        "headers": pio.defaults.headers,
    }
    kopts = {key: value for key, value in kopts.items() if value is not None}
    # a browser of its own, started in a thread (a notebook's thread runs an event loop already); on a
    # busy machine kaleido's tab can be asked to render before its own page has defined its scripts
    # ("kaleido_scopes is not defined"): that race is tried again in a fresh browser, twice at most
    for attempt in range(3):
        try:
            with cjk_fontconfig(font_folder), concurrent.futures.ThreadPoolExecutor(1) as pool:
                image = pool.submit(
                    asyncio.run, kaleido.calc_fig(spec, opts, topojson=pio.defaults.topojson, kopts=kopts)
                ).result()
            break
        except Exception as err:  # kaleido's JavascriptError is not importable from its public API
            if "kaleido_scopes is not defined" not in str(err) or attempt == 2:
                raise
    if isinstance(image, str):
        image = image.encode("utf-8")
    if fmt == "svg" and CJK_TEXT.search(image.decode("utf-8", "replace")):
        image = _SVG_OPEN.sub(lambda m: m.group(0) + f"<style>{cjk_font_face()}</style>".encode(), image, count=1)
    return with_provenance(image, fmt, provenance) if provenance else image


def with_provenance(image: bytes, fmt: str, provenance: dict[str, Any]) -> bytes:
    """The image with ``provenance`` as JSON inside it: after a PNG's header chunk a ``tEXt`` chunk keyed
    ``attnviz-provenance`` (ASCII JSON), after an SVG's opening tag a ``<metadata id="attnviz-provenance">``;
    other formats unchanged."""
    data = json.dumps(provenance, ensure_ascii=True, sort_keys=False)
    if fmt == "png":
        header_end = 8 + 8 + 13 + 4  # the signature, then IHDR: length and type, 13 bytes, its CRC
        body = b"tEXt" + b"attnviz-provenance\0" + data.encode("ascii")
        chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
        return image[:header_end] + chunk + image[header_end:]
    if fmt == "svg":
        meta = f'<metadata id="attnviz-provenance">{escape_html(data)}</metadata>'.encode()
        return _SVG_OPEN.sub(lambda m: m.group(0) + meta, image, count=1)
    return image


def write_image(
    fig: go.Figure,
    path: str | Path,
    format: str | None = None,
    *,
    width: int | None = None,
    height: int | None = None,
    scale: float | None = None,
    font_folder: str | Path | None = None,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """Write a figure to ``path`` as an image (:func:`to_image`: its CJK labels drawn without a CJK font on the
    machine) and return the path written; the format is ``format``, else the path's suffix, else PNG. Where
    plotly's ``fig.write_image(path)`` draws boxes for Chinese, ``figures.write_image(fig, path)`` does not.
    ``provenance=cap.provenance``: written into a PNG or an SVG, as :func:`to_image` says."""
    path = Path(path)
    if not path.parent.is_dir():
        raise InputError(f"cannot write {str(path)!r}: the folder {str(path.parent)!r} does not exist")
    fmt = _image_format(format, path)
    return write_bytes(
        path,
        to_image(fig, fmt, width=width, height=height, scale=scale, font_folder=font_folder, provenance=provenance),
        what=f"the {fmt.upper()} image",
    )
