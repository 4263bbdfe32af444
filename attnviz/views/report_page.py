"""One capture as one self-contained HTML report (:func:`report`; ``Capture.report(path)`` reaches it
through :mod:`attnviz.data.reprs`): every view a reader needs, chosen in the page itself, with no server.

The head maps are precomputed: per part, units (tokens, words), measure (weights, what moves), layer and
head, the map as 8-bit levels of its own largest value, deflated and base64-encoded (:func:`~attnviz.views.report_data.encode_map`),
decoded in the page by a small inline script (the browser's own ``DecompressionStream``) that draws it
with ``Plotly.react``. The heatmap, a query's row and the head view follow the page's selectors; the
model view's thumbnails, the validation certificate and the provenance are drawn once. plotly.js and the
CJK face are inlined: nothing is loaded from anywhere, the file opens offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.capture import Capture
from ..data.reprs import register_report
from ..errors import AttnvizError, InputError, OutOfRangeError
from .common import labels
from .html import (
    CJK_TEXT,
    cjk_font_face,
    escape_html,
    page_head,
    probes_html,
    ranking_html,
    report_html,
    script_json,
    scripts_of,
    write_page,
)
from .plots import coref_bars, probe_intervals
from .report_data import QUANTISATION, REPORT_BUDGET_MB, report_data, thumbnail_data
from .report_script import REPORT_CSS, REPORT_JS
from .reports import prediction_bars, validation_map

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from ..analysis.coref import CorefRanking
    from ..analysis.probe_result import ProbeResult
    from ..data.predictions import Intervention
    from ..data.validate import ValidationReport

__all__ = ["provenance_html", "report", "write_report"]


def _fig_html(fig: go.Figure, div_id: str, scripts: list[str]) -> str:
    """The figure's div; its script (plotly's, the figure's JSON escaped by plotly) added to ``scripts``,
    the page's policy's list (:func:`~attnviz.views.html.content_security_policy`)."""
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})
    scripts.extend(scripts_of(div))
    return div


def _table(rows: list[tuple[str, Any]]) -> str:
    cell = "padding:1px 8px;text-align:left;border-bottom:1px solid #e5e5e5;vertical-align:top"
    body = "".join(
        f'<tr><th style="{cell}">{escape_html(str(k))}</th><td style="{cell}">{escape_html(_text(v))}</td></tr>'
        for k, v in rows
    )
    return f'<table style="border-collapse:collapse">{body}</table>'


def _text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)  # shown as text: escaped where it is put
    return str(value)


def provenance_html(cap: Capture) -> str:
    """The capture's model (name, backend, dtype, device, check) and, when the capture carries it,
    ``cap.model["provenance"]`` (whatever keys it has) as tables."""
    model = cap.model
    rows: list[tuple[str, Any]] = [
        (k, model[k]) for k in ("name", "model_type", "backend", "dtype", "device", "add_bos", "check") if k in model
    ]
    if "check_error" in model:
        rows.append(("check_error (× tolerance)", f"{model['check_error']:.3g}"))
    if "edits" in model:
        rows.append(("edits", "; ".join(map(str, model["edits"]))))
    out = _table(rows)
    provenance = model.get("provenance")
    if isinstance(provenance, dict) and provenance:
        out += "<h4>Provenance</h4>" + _table(sorted(provenance.items()))
    else:
        out += "<p>This capture carries no provenance record (model revision, weights and tokenizer hashes).</p>"
    return out


def _select(sel_id: str, label: str, options: list[tuple[str, str]] = ()) -> str:  # type: ignore[assignment]
    opts = "".join(f'<option value="{escape_html(v)}">{escape_html(t)}</option>' for v, t in options)
    return f'<label>{escape_html(label)} <select id="{sel_id}">{opts}</select></label>'


def report(
    cap: Capture,
    path: str | Path | None = None,
    *,
    ranking: CorefRanking | None = None,
    probes: ProbeResult | None = None,
    atlas: pd.DataFrame | None = None,
    intervention: Intervention | None = None,
    validation: ValidationReport | None = None,
    heads: list[tuple[int, int]] | None = None,
    layer: int | None = None,
    head: int | None = None,
    budget_mb: float = REPORT_BUDGET_MB,
    title: str | None = None,
) -> str:
    """One self-contained HTML report of a capture, returned (and written to ``path`` when given).

    The page holds the head map with its layer, head, units (tokens or words) and measure (weights or what
    moves) chosen in the page, a query's row (the AttentionLab's, the query chosen in the page), the head
    view of the chosen head, the model view's thumbnails (a click picks the head), the validation
    certificate (``validation``, else ``cap.validate()``), the model and its provenance
    (``cap.model["provenance"]`` where the capture carries one), a generation's steps when the capture
    is of one, the edits' predictions and maps before and after (``intervention``), the coreference
    ranking (``ranking``), a probe set's result with each head's 95 % interval (``probes``, what
    :func:`attnviz.evaluate_probes` returns) and the head atlas (``atlas``). Every map is precomputed (8-bit, deflated: the
    page states it) and decoded by the page's own script; plotly.js and the CJK face are inlined, so the
    file opens offline with no request leaving it. Past ``budget_mb`` MB for the whole page (default 15:
    SmolLM2 at 512 tokens takes 13.6 MB), the page first leaves out what moves between words, then keeps
    the overview's thumbnails and the maps of ``heads`` ((layer, head) pairs) only, and says so. ``layer`` / ``head``: what the page opens on (default: the first layer, its first head kept — head 0 of a capture of every head)."""
    import plotly.offline  # deferred: plotly.js is inlined into the page, read only when one is written

    if not isinstance(cap, Capture):
        raise InputError(f"report takes a Capture (attnviz.capture() or attnviz.load()), got {type(cap).__name__}")
    part = cap.parts[0]
    layer = cap.layer_indices(part)[0] if layer is None else layer
    if layer not in cap.layer_indices(part):
        raise OutOfRangeError(f"layer {layer} is not in the capture; its {part} holds layers {cap.layer_indices(part)}")
    head = cap.layer(layer, part).head_numbers[0] if head is None else head
    cap.check_head(head, part, layer)
    plotly_js = plotly.offline.get_plotlyjs()
    title = title or f"attnviz report — {cap.model.get('name')}: {cap.text[:80]}"

    # the parts drawn once: thumbnails, validation, extras
    sections = []
    scripts: list[str] = [plotly_js, REPORT_JS]  # the page's own scripts: the only ones its policy lets run
    thumbnails = thumbnail_data(cap, part, (layer, head))
    sections.append(
        "<h2>Model view</h2><p class='av-note'>Every layer × head, each map max-pooled to a thumbnail (stored "
        "as 8-bit levels of 1: within 0.002); click one to show it above.</p><div id='av-model'></div>"
    )
    try:
        validation = cap.validate() if validation is None else validation
        sections.append(
            "<h2>Validation certificate</h2>"
            + report_html(validation)
            + _fig_html(validation_map(validation, part=part), "av-validation", scripts)
        )
    except AttnvizError as err:
        sections.append(f"<h2>Validation certificate</h2><p>Not validated: {escape_html(str(err))}</p>")
    if intervention is not None:
        sections.append(_edits_html(intervention, scripts))
    if ranking is not None:
        sections.append(
            "<h2>Coreference ranking</h2>" + ranking_html(ranking) + _fig_html(coref_bars(ranking), "av-coref", scripts)
        )
    if probes is not None:
        sections.append(
            "<h2>Probe set: accuracy with its intervals</h2>"
            + probes_html(probes)
            + _fig_html(probe_intervals(probes), "av-probes", scripts)
        )
    if atlas is not None:
        from .atlas import atlas_map  # deferred: atlas imports html, as this module does; only an atlas needs it

        names = list(dict.fromkeys(atlas["part"])) if "part" in atlas.columns else [None]
        sections.append(
            "<h2>Head atlas</h2>"
            + "".join(_fig_html(atlas_map(atlas, part=p), f"av-atlas-{i}", scripts) for i, p in enumerate(names))
        )
    sections.append(f"<h2>Model and provenance</h2>{provenance_html(cap)}")
    cjk = CJK_TEXT.search(cap.text) or any(CJK_TEXT.search(t) for t in labels(cap, False, part, "key"))
    face = f"<style>{cjk_font_face()}</style>" if cjk else ""
    # what the maps may take: the budget less plotly.js, the face, the sections, the thumbnails, the frame
    fixed = len(plotly_js) + len(face) + sum(map(len, sections)) + len(thumbnails["z"]) + 100_000
    data = report_data(cap, budget_bytes=max(budget_mb * 1e6 - fixed, 0), heads=heads)
    if data.chosen is not None and not any(c[1:] == (layer, head) for c in data.chosen):
        layer, head = data.chosen[0][1], data.chosen[0][2]

    queries = labels(cap, False, part, "query")
    payload = {
        "parts": data.parts,
        "maps": data.maps,
        "masks": data.masks,
        "mask_data": data.mask_data,
        "norms": data.norms,
        "chosen": data.chosen,
        "thumbnails": thumbnails,
        "open": {"part": part, "layer": layer, "head": head, "units": "tokens", "query": len(queries) - 1},
    }
    blob = script_json(payload, separators=(",", ":"))
    bar = "".join(
        [
            _select("av-part", "part", [(p, p) for p in cap.parts]) if len(cap.parts) > 1 else "",
            _select("av-layer", "layer"),
            _select("av-head", "head"),
            _select("av-units", "units", [("tokens", "tokens"), ("words", "words")]),
            _select("av-measure", "show"),
            _select("av-query", "query"),
        ]
    )
    generation = any(p["prompt_length"] is not None for p in data.parts)
    steps = (
        "<h2>Generation steps</h2><p class='av-note'>The two rows behind each token the model wrote, for the "
        f"chosen head (new tokens in orange).</p>{_select('av-step', 'step')}<div id='av-steps'></div>"
        if generation
        else ""
    )
    left = "".join(f"<li>{escape_html(x)}</li>" for x in data.left_out)
    left = f"<p><b>Left out of this report:</b></p><ul>{left}</ul>" if left else ""
    body = (
        f"<h1>{escape_html(title)}</h1><div class='av-text'>{escape_html(cap.text)}</div>"
        f"<p class='av-note'>{cap.n_tokens} tokens · {escape_html(cap.model.get('name'))} · {QUANTISATION} "
        f"Maps: {data.nbytes / 1e6:.1f} MB; budget for the page: {budget_mb:g} MB.</p>{left}"
        f"<div class='av-bar'>{bar}<span id='av-status' class='av-note'></span></div>"
        "<h2>Head map</h2><div id='av-heatmap'></div>"
        "<h2>A query's row</h2><p class='av-note'>The AttentionLab's bars: where the chosen query looks.</p>"
        "<div id='av-row'></div><h2>Head view</h2><div id='av-headview'></div>"
        f"{steps}{''.join(sections)}"
    )
    if not face and (CJK_TEXT.search(body) or CJK_TEXT.search(blob)):  # CJK in a ranking, an atlas, the edits
        face = f"<style>{cjk_font_face()}</style>"
    page = (
        f"{page_head(title, scripts)}{face}<style>{REPORT_CSS}</style>"
        f'<script type="text/javascript">{plotly_js}</script></head>\n<body>{body}\n'
        f'<script type="application/json" id="attnviz-data">{blob}</script>\n<script>{REPORT_JS}</script>\n</body></html>\n'
    )
    if path is not None:
        write_page(page, path)
    return page


def _edits_html(out: Intervention, scripts: list[str]) -> str:
    from .maps import heatmap  # deferred: a report without edits draws no static heatmap

    parts = [f"<h2>Edits: before and after</h2><p>{escape_html('; '.join(map(str, out.edits)))}</p>"]
    try:
        parts.append(_fig_html(prediction_bars(out), "av-predictions", scripts))
    except AttnvizError as err:
        parts.append(f"<p>{escape_html(str(err))}</p>")
    shown = 0
    for part, layer in out.edited_layers:
        for edit in out.edits:
            if edit.layers is not None and layer not in edit.layers:
                continue
            for head in list(edit.heads or [0])[:2]:
                if shown >= 4:
                    break
                for which, cap in (("before", out.capture_before), ("after", out.capture_after)):
                    fig = heatmap(cap, layer, head, part=part)
                    fig.update_layout(title=f"{which} the edits: {fig.layout.title.text}")
                    parts.append(_fig_html(fig, f"av-edit-{shown}-{which}", scripts))
                shown += 1
    return "".join(parts)


def write_report(cap: Capture, path: str | Path, **kwargs: Any) -> Path:
    """``Capture.report(path, …)``: :func:`report` written to ``path``; the path returned."""
    report(cap, path, **kwargs)
    return Path(path)


register_report(Capture, write_report)  # Capture.report asks data.reprs, which this module fills in
