"""HTML: the self-contained page of figures (:func:`html_page`; :func:`to_html` writes it to a file),
and the compact HTML Jupyter shows for a Capture, a validation report, a coreference ranking and a
probe-set result (their ``_repr_html_``). No CDN. A page with Chinese or Japanese text carries the library's
CJK face inlined (:func:`cjk_font_face`), so it reads on a machine without one.

One rule for every page and fragment attnviz writes (the report, these pages, the atlas page, a notebook's
HTML): a text that comes from a model, a file, a capture or a user goes into markup through
:func:`escape_html` only, and a value into a ``<script>`` through :func:`script_json` only. Every written page
carries a Content-Security-Policy (:func:`page_head`, :func:`content_security_policy`) that lets nothing be
fetched and runs only the page's own scripts, named by their hashes."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis.coref import CorefRanking
from ..analysis.probe_result import ProbeResult
from ..assets import CJK_FONT
from ..data.capture import Capture
from ..data.reprs import register_html
from ..data.validate import ValidationReport
from ..errors import InputError
from ..files import write_text

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = [
    "CJK_TEXT",
    "capture_html",
    "cjk_font_face",
    "cjk_font_path",
    "content_security_policy",
    "escape_html",
    "html_page",
    "page_head",
    "probes_html",
    "ranking_html",
    "report_html",
    "script_json",
    "scripts_of",
    "to_html",
    "write_page",
]

_BOX = "font-family:system-ui,sans-serif;font-size:13px;line-height:1.45;max-width:960px"
_CELL = "padding:1px 8px;text-align:left;border-bottom:1px solid #e5e5e5"
_CHIP = "display:inline-block;margin:1px;padding:0 4px;border:1px solid #ccc;border-radius:3px;background:#f7f7f9"
MAX_CHIPS = 60
#: a character the CJK face holds (CJK punctuation, kana, unified ideographs, full-width forms), as itself
#: or as the \\uXXXX escape of a figure's JSON
CJK_TEXT = re.compile(
    r"[\u3000-\u30ff\u4e00-\u9fff\uff00-\uffef]|\\u(?:30[0-9a-f]{2}|4[ef][0-9a-f]{2}|[5-9][0-9a-f]{3}|ff[0-9a-e][0-9a-f])",
    re.IGNORECASE,
)


def escape_html(value: Any) -> str:
    """The one escaping rule for every text attnviz puts into a page's markup (an element's text or an
    attribute's value in double quotes): ``str(value)`` with ``&``, ``<``, ``>``, ``"`` and ``'`` as entities.
    A model's or a file's name, a capture's provenance, its tokens and text, a word, a title: each goes
    through here, so that ``<img src=x onerror=…>`` shows as text, never as an element."""
    return html.escape(str(value), quote=True)


#: what a JSON text may not hold inside a <script>: "</script>", "<!--" and "-->" (which change how the
#: browser finds the script's end), "&" and the two line separators JavaScript once read as newlines
_SCRIPT_UNSAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def script_json(value: Any, **dumps: Any) -> str:
    """``value`` as JSON to put inside a ``<script>`` element (``type="application/json"`` or a script's
    literal): ``json.dumps(value, ensure_ascii=False, **dumps)`` with ``<``, ``>``, ``&``, U+2028 and
    U+2029 written as ``\\u003c``, ``\\u003e``, ``\\u0026``, ``\\u2028``, ``\\u2029`` — the same value
    to ``JSON.parse``, and no string in it can end the script or start a comment in it. (JSON holds those
    characters only inside its strings, where the escapes mean them.)"""
    return json.dumps(value, ensure_ascii=False, **dumps).translate(_SCRIPT_UNSAFE)


_SCRIPT = re.compile(r"<script(?:\s+type=\"text/javascript\")?>(.*?)</script>", re.S)


def scripts_of(fragment: str) -> list[str]:
    """The text of each script a trusted fragment holds (plotly's ``fig.to_html(full_html=False)``, whose
    figure JSON plotly escapes as :func:`script_json` does), for :func:`content_security_policy`. Never
    call it on markup holding text from a model, a file or a user: that is what the policy guards against."""
    return _SCRIPT.findall(fragment)


def content_security_policy(scripts: Iterable[str] = ()) -> str:
    """The Content-Security-Policy of a page attnviz writes, whose inline scripts are ``scripts``: nothing
    fetched from anywhere (``default-src 'none'``, so no ``connect-src``, no frames, no ``<base>``, no form
    submitted); only those scripts run, each named by its SHA-256 (an injected ``<script>`` or an
    ``onerror=`` attribute does not run); inline styles (plotly adds its own), images from ``data:`` and
    ``blob:`` (plotly's "download as PNG"), fonts from ``data:`` (the inlined CJK face). plotly.js needs no
    ``'unsafe-eval'`` for the traces attnviz draws. ``'unsafe-inline'`` in ``script-src`` is for a browser that
    predates hashes (CSP 1): any browser that reads the hashes ignores it."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode("utf-8")).digest()).decode("ascii") + "'"
        for s in dict.fromkeys(scripts)
    )
    script_src = f"{hashes} 'unsafe-inline'" if hashes else "'none'"
    return (
        f"default-src 'none'; script-src {script_src}; style-src 'unsafe-inline'; img-src data: blob:; "
        "font-src data:; base-uri 'none'; form-action 'none'"
    )


def page_head(title: str, scripts: Iterable[str] = ()) -> str:
    """The start of every page attnviz writes, up to its ``<title>``: the doctype, UTF-8, the
    Content-Security-Policy for its inline ``scripts`` (:func:`content_security_policy`, before anything it
    governs) and the title, escaped."""
    policy = content_security_policy(scripts)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{escape_html(policy)}">'
        f"<title>{escape_html(title)}</title>"
    )


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f'<th style="{_CELL}">{escape_html(str(h))}</th>' for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td style="{_CELL}">{escape_html(_fmt(v))}</td>' for v in row) + "</tr>" for row in rows
    )
    return f'<table style="border-collapse:collapse;margin:4px 0"><tr>{head}</tr>{body}</table>'


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-3 and value != 0 else f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def _chips(labels: Sequence[str], title: str) -> str:
    shown = "".join(f'<span style="{_CHIP}">{escape_html(label)}</span>' for label in labels[:MAX_CHIPS])
    more = f" … and {len(labels) - MAX_CHIPS} more" if len(labels) > MAX_CHIPS else ""
    return f"<div><b>{escape_html(title)}</b> ({len(labels)}): {shown}{escape_html(more)}</div>"


def _verdict(passed: bool) -> str:
    colour = "#1a7f37" if passed else "#b00020"
    return f'<b style="color:{colour}">{"PASS" if passed else "FAIL"}</b>'


def _kept(cap: Capture, part: str, n_heads: int) -> str:
    """ ", kept H3, H7" when ``capture(heads=)`` kept some of a part's heads, else nothing."""
    kept = cap.kept_heads(part)
    return "" if len(kept) == n_heads else ", kept " + ", ".join(f"H{h}" for h in kept)


def capture_html(cap: Capture) -> str:
    model = cap.model
    parts = _table(
        ["part", "reads", "layers captured", "heads (kv)", "d_head"],
        [
            (
                p,
                "{} × {}".format(*(len(s.tokens) for s in cap.sequences(p))),
                f"{len(cap.layer_indices(p))} of {info['n_layers']}",
                f"{info['n_heads']} ({info['n_kv_heads']})" + _kept(cap, p, info["n_heads"]),
                info["d_head"],
            )
            for p, info in model.get("parts", {}).items()
        ],
    )
    check = model.get("check", "off")
    checked = (
        ""
        if check == "off" or "check_error" not in model
        else f" · self-check ({check}): {_verdict(model['check_error'] <= 1)}, worst error "
        f"{model['check_error']:.2g}× its tolerance"
    )
    target = _chips(cap.target.token_labels, "target tokens") if cap.target is not None else ""
    return (
        f'<div style="{_BOX}"><b>attnviz Capture</b> · {escape_html(str(model.get("name")))} · '
        f"{escape_html(str(model.get('backend')))} · {escape_html(str(model.get('dtype')))} · {cap.nbytes / 2**20:.1f} MiB kept"
        f"{checked}{parts}{_chips(cap.token_labels, 'tokens')}{target}</div>"
    )


def report_html(report: ValidationReport, worst: int = 5) -> str:
    df = report.to_pandas()
    if df.empty:
        return f'<div style="{_BOX}">{escape_html(str(report))}</div>'
    df = df.assign(share=df.max_abs_error / df.tolerance).sort_values("share", ascending=False).head(worst)
    rows = [
        (r.part, r.layer, r.head, r.quantity, r.rows, r.max_abs_error, r.tolerance, "yes" if r.passed else "NO")
        for r in df.itertuples(index=False)
    ]
    scope = "a sample of rows" if report.sample else "every row"
    return (
        f'<div style="{_BOX}"><b>attnviz validation</b> {_verdict(report.passed)} · {escape_html(report.model)} · '
        f"{escape_html(report.dtype)} on {escape_html(report.backend)} · {scope} · tolerance {report.atol:g} + "
        f"{report.rtol:g}·max|model|<div>{escape_html(str(report).split(' — ', 1)[-1])}</div>"
        f"<div>the {len(rows)} heads closest to their tolerance:</div>"
        + _table(["part", "layer", "head", "quantity", "rows", "max |error|", "tolerance", "passed"], rows)
        + "</div>"
    )


def _frame(df: pd.DataFrame, top: int) -> str:
    return _table(list(df.columns), df.head(top).itertuples(index=False))


def ranking_html(ranking: CorefRanking, top: int = 10) -> str:
    return (
        f'<div style="{_BOX}"><b>attnviz coreference</b><div>{escape_html(str(ranking))}</div>'
        f"{_frame(ranking.table.round(3), top)}</div>"
    )


PROBE_COLUMNS = ("layer", "head", "accuracy", "low", "high", "correct", "n", "p_chance", "p_holm", "beats_chance")


def probes_html(result: ProbeResult, top: int = 10) -> str:
    """A probe set's result: its sentence (:class:`~attnviz.analysis.ProbeResult`'s ``str``), the
    best head's tests against chance and the baselines, and the ``top`` heads with their 95 % Wilson
    intervals, chance p-values and Holm's adjustment."""
    ranked = result.ranked()
    heads = ranked[[c for c in PROBE_COLUMNS if c in ranked.columns]].head(top)
    tests = ""
    if result.has_picks and "p_chance" in result.accuracy.columns:
        table = result.tests()
        tests = "<div>the best head's tests (optimistic: it was chosen on these probes):</div>" + _table(
            ["comparison", "test", "statistic", "p-value", "meaning"],
            table[["comparison", "test", "statistic", "p_value", "meaning"]].itertuples(index=False),
        )
    return (
        f'<div style="{_BOX}"><b>attnviz probe set</b><div>{escape_html(str(result))}</div>'
        f"{tests}<div>the top {len(heads)} heads:</div>{_table(list(heads.columns), heads.itertuples(index=False))}</div>"
    )


# the HTML a notebook shows for each (their _repr_html_ asks data.reprs, which this module fills in)
register_html(Capture, capture_html)
register_html(ValidationReport, report_html)
register_html(CorefRanking, ranking_html)
register_html(ProbeResult, probes_html)


def cjk_font_path() -> Path:
    """The CJK web face "attnviz CJK" (a subset of Noto Sans CJK SC, SIL OFL 1.1: the 6,763 hanzi of GB2312,
    CJK punctuation, kana, full-width forms; ``OFL.txt`` beside it): the library's own
    ``attnviz/assets/fonts/attnviz-cjk.woff2`` (:data:`attnviz.assets.CJK_FONT`), the file the dashboard serves."""
    if not CJK_FONT.is_file():
        raise FileNotFoundError(f"the CJK font attnviz-cjk.woff2 is not in {CJK_FONT.parent}: reinstall attnviz")
    return CJK_FONT


def cjk_font_face() -> str:
    """The ``@font-face`` rule of "attnviz CJK" with the font inlined as a base64 data URI (≈1.8 MB of
    text), for a page that must read offline on any machine; the same face the dashboard serves."""
    data = base64.b64encode(cjk_font_path().read_bytes()).decode("ascii")
    return (
        '@font-face{font-family:"attnviz CJK";font-style:normal;font-display:block;'
        "unicode-range:U+3000-30FF,U+4E00-9FFF,U+FF00-FFEF;"
        f'src:url(data:font/woff2;base64,{data}) format("woff2")}}'
    )


def html_page(
    figures: go.Figure | list[go.Figure], *, title: str = "attnviz", provenance: dict[str, Any] | None = None
) -> str:
    """One self-contained HTML page holding the figures, as text: plotly.js inlined once, no CDN, no
    server — it opens offline, in any browser, years from now (:func:`to_html` writes it to a file).
    ``provenance`` (a capture's :attr:`~attnviz.Capture.provenance`: its weights' and tokenizer's hashes,
    versions, device, check) goes into the page twice: as a table under the figures, and as JSON in
    ``<script type="application/json" id="attnviz-provenance">`` for a program to read.

    A page whose title or figures hold Chinese or Japanese characters also inlines the CJK face
    (:func:`cjk_font_face`, ≈1.8 MB) and names it in the figures' font (:data:`~attnviz.views.common.FONT_FAMILY`),
    so they read on a machine without a CJK font; a page without such text stays as small as before."""
    import plotly.graph_objects as go  # plotly loads when a page is written, not when Jupyter shows a capture
    import plotly.offline

    figs = [figures] if isinstance(figures, go.Figure) else list(figures)
    if not figs or not all(isinstance(f, go.Figure) for f in figs):
        raise InputError("html_page and to_html take a plotly Figure or a list of them")
    divs = _divs(figs)
    if CJK_TEXT.search(title) or CJK_TEXT.search(divs):
        from .common import FONT_FAMILY  # deferred: common imports torch, which showing a capture does not need

        if any(f.layout.font.family is None for f in figs):  # a figure of the caller's own: named on a copy
            figs = [
                go.Figure(f).update_layout(font_family=FONT_FAMILY) if f.layout.font.family is None else f for f in figs
            ]
            divs = _divs(figs)
        font = f"<style>{cjk_font_face()}</style>"
    else:
        font = ""
    plotly_js = plotly.offline.get_plotlyjs()
    return (
        f"{page_head(title, [plotly_js, *scripts_of(divs)])}{font}"
        f'<script type="text/javascript">{plotly_js}</script></head>'
        f"<body style='font-family:\"attnviz CJK\",system-ui,sans-serif'><h3>{escape_html(title)}</h3>\n{divs}\n"
        f"{provenance_html(provenance)}</body></html>\n"
    )


def _divs(figs: list[go.Figure]) -> str:
    """The figures' divs, each with its own fixed id (the same figures make the same page, and the same
    script hashes in its policy)."""
    return "\n".join(
        f.to_html(full_html=False, include_plotlyjs=False, div_id=f"attnviz-figure-{i}") for i, f in enumerate(figs)
    )


def provenance_html(provenance: dict[str, Any] | None) -> str:
    """A capture's provenance as a folded table and as JSON a program reads (``id="attnviz-provenance"``);
    nothing for None or an empty dict (a file saved before attnviz recorded it)."""
    if not provenance:
        return ""
    rows = "".join(
        f"<tr><td>{escape_html(str(key))}</td><td><code>{escape_html('-' if value is None else str(value))}</code></td></tr>"
        for key, value in provenance.items()
    )
    data = script_json(provenance)
    return (
        f"<details><summary>Provenance: what made these figures</summary><table>{rows}</table></details>\n"
        f'<script type="application/json" id="attnviz-provenance">{data}</script>\n'
    )


def write_page(page: str, path: str | Path) -> Path:
    """Write an HTML page as UTF-8 to ``path``, atomically (:func:`attnviz.files.write_text`: a reader sees
    the old page or the new one, never half of one). Its folder must exist: else an :class:`InputError` that
    says so; a folder given as the file, a full disk, no permission: :class:`~attnviz.errors.FileWriteError`."""
    path = Path(path)
    if not path.parent.is_dir():
        raise InputError(f"cannot write {str(path)!r}: the folder {str(path.parent)!r} does not exist")
    return write_text(path, page, what="the page")


def to_html(
    figures: go.Figure | list[go.Figure],
    path: str | Path | None = None,
    *,
    title: str = "attnviz",
    provenance: dict[str, Any] | None = None,
) -> Path | None:
    """Write the figures to ``path`` as one self-contained HTML page (:func:`html_page`: plotly.js
    inlined once, no CDN, no server — it opens offline) and return the path written; ``path=None``
    writes nothing and returns None (the page as text is :func:`html_page`'s). A notebook cell ending
    in ``to_html(…)`` shows the path, not the ~5 MB page. ``provenance``: as :func:`html_page` takes it."""
    page = html_page(figures, title=title, provenance=provenance)
    if path is None:
        return None
    return write_page(page, path)
