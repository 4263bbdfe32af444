"""One capture as one self-contained HTML report (:func:`report`; ``Capture.report(path)`` reaches it
through :mod:`attnviz.data.reprs`): every view a reader needs, chosen in the page itself, with no server.

The head maps are precomputed: per part, units (tokens, words), measure (weights, what moves), layer and
head, the map as 8-bit levels of its own largest value, deflated and base64-encoded (:func:`encode_map`),
decoded in the page by a small inline script (the browser's own ``DecompressionStream``) that draws it
with ``Plotly.react``. The heatmap, a query's row and the head view follow the page's selectors; the
model view's thumbnails, the validation certificate and the provenance are drawn once. plotly.js and the
CJK face are inlined: nothing is loaded from anywhere, the file opens offline.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..data.capture import Capture
from ..data.reprs import register_report
from ..errors import AttnvizError, InputError, OutOfRangeError
from .common import allowed_cells, labels, measure_map
from .html import CJK_TEXT, cjk_font_face, probes_html, ranking_html, report_html, write_page
from .model_view import MODEL_VIEW_CELLS, model_view, thumb_size
from .plots import coref_bars, probe_intervals
from .reports import prediction_bars, validation_map

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from ..analysis.coref import CorefRanking
    from ..analysis.probe_result import ProbeResult
    from ..data.predictions import Intervention
    from ..data.validate import ValidationReport

__all__ = [
    "LEVELS",
    "QUANTISATION",
    "REPORT_BUDGET_MB",
    "ReportData",
    "encode_map",
    "map_key",
    "provenance_html",
    "quantise",
    "report",
    "report_data",
    "write_report",
]

#: the levels a stored value takes: a map is kept as round(LEVELS·x/s), s its largest value
LEVELS = 255
#: the size a report aims at, in MB (10⁶ bytes): past it, the maps of the chosen heads only
REPORT_BUDGET_MB = 15.0
UNITS = ("tokens", "words")
MEASURES = ("weights", "moved")
QUANTISATION = (
    "Each head's token map is stored as 8-bit levels of its own largest value s (round(255·x/s)), deflated: "
    "a weight shown is within s/510 of the one attnviz computed (at most 0.002). Words are merged in the page "
    "as cap.attention(words=True) merges them (a key word sums its tokens, a query word averages its rows): "
    "within m·s/510 for a key word of m tokens. What moves between tokens, α·‖f(x)‖, is the stored weight "
    "times the key's ‖f(x)‖ (16-bit levels of the layer's largest): within ‖f(x)‖·s/510; between words it is "
    "the norm of a summed vector, stored as its own 8-bit map: within s/510 of its largest value s."
)


def map_key(part: str, units: str, measure: str, layer: int, head: int) -> str:
    """The name of one head's map in the page's data: ``part/units/measure/layer/head``."""
    return f"{part}/{units}/{measure}/{layer}/{head}"


def _pack(raw: bytes) -> str:
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def quantise(maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # maps [..., q, k] ≥ 0
    """Each map (the last two dimensions) as 8-bit levels of its own largest value: (levels uint8 [..., q, k],
    scales [...]); an all-zero map has scale 1."""
    top = maps.float().amax(dim=(-2, -1))
    scales = torch.where(top > 0, top, torch.ones_like(top))
    levels = (maps.float() * (LEVELS / scales)[..., None, None]).round_().clamp_(0, LEVELS).to(torch.uint8)
    return levels, scales


def encode_map(z: torch.Tensor) -> tuple[float, str]:  # z [query, key], float, ≥ 0; masked cells any value
    """One map as the page stores it: (s, base64 of the deflated bytes round(255·z/s)), s its largest
    value (1 for an all-zero map); the page reads back s·level/255."""
    levels, scale = quantise(z)
    return float(scale), _pack(levels.contiguous().numpy().tobytes())


@dataclass
class ReportData:
    """What the page's script reads: the parts' layers, heads and labels, each head's map
    (:func:`map_key` → (s, base64)) and each layer's mask, and what was left out."""

    parts: list[dict[str, Any]]
    maps: dict[str, tuple[float, str]] = field(default_factory=dict)
    masks: dict[str, int] = field(default_factory=dict)  # part/layer → its token mask's place in mask_data
    mask_data: list[str] = field(default_factory=list)  # each distinct mask: base64 of deflated 0/1 bytes
    # part/layer → (the layer's largest norm t, base64 of deflated uint16 levels round(65535·‖f_h(x_j)‖/t), [head, key])
    norms: dict[str, tuple[float, str]] = field(default_factory=dict)
    chosen: list[tuple[str, int, int]] | None = None  # past the budget: the heads kept (part, layer, head)
    left_out: list[str] = field(default_factory=list)  # what the page could not hold, said in it

    @property
    def nbytes(self) -> int:
        """The characters the maps and masks take in the page."""
        return (
            sum(len(b) for _, b in self.maps.values())
            + sum(map(len, self.mask_data))
            + sum(len(b) for _, b in self.norms.values())
        )


def _word_of(seq: Any) -> list[int]:
    """Each token's word (-1 for a token in none): what the page merges a token map into words with."""
    word_of = [-1] * seq.n_tokens
    for i, w in enumerate(seq.words):
        word_of[w.token_start : w.token_stop] = [i] * (w.token_stop - w.token_start)
    return word_of


def _has_norms(cap: Capture, part: str) -> bool:
    return all(cap.layer(layer, part).value_dots is not None for layer in cap.layer_indices(part))


def report_data(
    cap: Capture, *, budget_bytes: float | None = None, heads: list[tuple[int, int]] | None = None
) -> ReportData:
    """What the page stores of every part, layer and head: its token weights (8-bit, :func:`quantise`), the
    layer's mask (each distinct one once) and value norms (16-bit: what moves between tokens is the weight
    times the norm), and what moves between words (a map of its own: it is not linear in the weights);
    the page merges words itself. Past ``budget_bytes``, what moves between words is left out; if that is
    not enough, the maps of ``heads`` only ((layer, head) pairs; default: the first layer's head 0) — each
    said in :attr:`ReportData.left_out`."""
    parts: list[dict[str, Any]] = []
    data = ReportData(parts=parts)
    first = cap.parts[0]
    chosen = heads if heads is not None else [(cap.layer_indices(first)[0], cap.kept_heads(first)[0])]
    kept = [  # by the model's head numbers: a capture of some heads (capture(heads=)) holds those only
        (part, layer, head)
        for layer, head in chosen
        for part in cap.parts
        if layer in cap.layer_indices(part) and head in cap.layer(layer, part).head_numbers
    ]
    if not kept:
        raise OutOfRangeError(f"heads={heads!r}: none of these (layer, head) pairs is in the capture")
    n_layers = sum(len(cap.layer_indices(p)) for p in cap.parts)
    words_moved, only_chosen = True, False  # what the budget lets in: decided on the layers' sizes so far
    token_total = word_total = done = 0  # bytes of the token weights (and norms, masks), of words' moved; layers
    for part in cap.parts:
        layers = cap.layer_indices(part)
        info = cap.info(part)
        measures = [m for m in MEASURES if m == "weights" or _has_norms(cap, part)]
        if "moved" not in measures:
            data.left_out.append(f"{part}: what moves (this capture kept no value norms)")
        entry: dict[str, Any] = {
            "name": part,
            "layers": layers,
            "n_heads": info["n_heads"],
            "heads": {str(layer): cap.layer(layer, part).head_numbers for layer in layers},  # the model's numbers
            "measures": measures,
            "units": {
                u: {"q": labels(cap, u == "words", part, "query"), "k": labels(cap, u == "words", part, "key")}
                for u in UNITS
            },
            "prompt_length": cap.model["generation"]["prompt_length"]
            if "generation" in cap.model and part == "decoder"
            else None,
        }
        queries, keys = cap.sequences(part)
        entry["word_of"] = {"q": _word_of(queries), "k": _word_of(keys)}
        parts.append(entry)
        for layer in layers:
            allowed = cap.allowed(layer, part=part).cpu()  # [query, key]: the word masks follow (any pair)
            mask = _pack(allowed.to(torch.uint8).contiguous().numpy().tobytes())
            if mask not in data.mask_data:  # a causal mask is the same in every layer: stored once
                data.mask_data.append(mask)
                token_total += len(mask)
            done += 1
            data.masks[f"{part}/{layer}"] = data.mask_data.index(mask)
            stacked = cap.layer(layer, part).head_numbers  # the record's heads, in its stacks' order
            shown = [h for p, la, h in kept if (p, la) == (part, layer)] if only_chosen else stacked
            if not shown:
                continue
            weights = torch.stack([cap.attention(layer, h, part=part).float().cpu() for h in shown])
            levels, scales = quantise(weights.nan_to_num_(0).masked_fill_(~allowed, 0))
            token_bytes = 0
            for i, head in enumerate(shown):
                packed = _pack(levels[i].contiguous().numpy().tobytes())
                token_bytes += len(packed)
                data.maps[map_key(part, "tokens", "weights", layer, head)] = (float(scales[i]), packed)
            if "moved" in measures:
                # α_ij·‖f_h(x_j)‖ between tokens: the page multiplies the weights by the norms, 16-bit levels
                norms = cap.value_norms(layer, part=part).float().cpu()  # [head, key]
                top = float(norms.max()) or 1.0
                norm_levels = (norms / top * 65535).round().clamp(0, 65535).to(torch.int32).numpy().astype("<u2")
                data.norms[f"{part}/{layer}"] = (top, _pack(norm_levels.tobytes()))
                token_bytes += len(data.norms[f"{part}/{layer}"][1])
            token_total += token_bytes
            tokens_about = token_total / done * n_layers  # the first layers' maps deflate worst: an overestimate
            if budget_bytes is not None and not only_chosen and tokens_about > 3 * budget_bytes:
                only_chosen = True  # far past the budget (a long text): no more heads are computed than are kept
                _keep_chosen(data, kept, f"about {tokens_about / 1e6:.0f} MB", budget_bytes)
                shown = [h for p, la, h in kept if (p, la) == (part, layer)]
            if "moved" not in measures or not words_moved or not shown:
                continue
            # between words it is the norm of a summed vector, not linear in the weights: stored
            moved = measure_map(cap, layer, None, "moved", part=part, words=True)[[stacked.index(h) for h in shown]]
            word_allowed = allowed_cells(cap, layer, None, True, part)
            levels, scales = quantise(moved.nan_to_num_(0).masked_fill_(~word_allowed, 0))
            for i, head in enumerate(shown):
                packed = _pack(levels[i].contiguous().numpy().tobytes())
                word_total += len(packed)
                data.maps[map_key(part, "words", "moved", layer, head)] = (float(scales[i]), packed)
            if budget_bytes is not None and not only_chosen and tokens_about + word_total > budget_bytes:
                words_moved = False  # with them the maps would pass the budget: what moves between words goes
                _drop_words_moved(data, f"about {word_total / done * n_layers / 1e6:.1f} MB", budget_bytes)
    if budget_bytes is not None and not only_chosen and data.nbytes > budget_bytes:  # the exact sizes, at the end
        if words_moved and any("/words/moved/" in k for k in data.maps):
            words_moved = False
            _drop_words_moved(data, f"{word_total / 1e6:.1f} MB", budget_bytes)
        if data.nbytes > budget_bytes:
            _keep_chosen(data, kept, f"{data.nbytes / 1e6:.1f} MB", budget_bytes)
    for entry in parts:
        entry["words_moved"] = words_moved and "moved" in entry["measures"]
    return data


def _keep_chosen(data: ReportData, kept: list[tuple[str, int, int]], size: str, budget_bytes: float) -> None:
    data.left_out.append(
        f"the maps of every head: they take {size}, over the budget of {budget_bytes / 1e6:.1f} MB for the maps; "
        "shown: the overview's thumbnails and the chosen heads " + ", ".join(f"{p} L{la}·H{h}" for p, la, h in kept)
    )
    data.maps = {k: v for k, v in data.maps.items() if (k.split("/")[0], *map(int, k.split("/")[3:])) in kept}
    data.chosen = kept


def _drop_words_moved(data: ReportData, size: str, budget_bytes: float) -> None:
    data.left_out.append(
        f"what moves between words ({size}: it would take the maps past their budget of "
        f"{budget_bytes / 1e6:.1f} MB); between tokens it is here"
    )
    data.maps = {k: v for k, v in data.maps.items() if "/words/moved/" not in k}


def thumbnail_data(cap: Capture, part: str, selected: tuple[int, int]) -> dict[str, Any]:
    """The model view (:func:`~attnviz.views.model_view.model_view`) as the page rebuilds it: its figure
    without the mosaic, the mosaic as 8-bit levels of 1 (255: a gap between thumbnails), deflated, and what
    names each cell's head (the thumbnails' size, the layers): a mosaic of 270 heads at 24² cells is
    ≈1.4 MB as the figure's JSON, ≈0.1 MB so."""
    import numpy as np  # deferred: numpy comes with torch; only the report's thumbnails need it here

    fig = model_view(cap, part=part, selected=selected)
    z = np.asarray(fig.data[0].z, dtype=np.float32)
    levels = np.where(np.isnan(z), 255, np.clip(np.round(np.nan_to_num(z) * 254), 0, 254)).astype(np.uint8)
    fig.data[0].z, fig.data[0].customdata = None, None
    return {
        "z": _pack(levels.tobytes()),
        "shape": list(z.shape),
        "size": list(thumb_size(cap, False, MODEL_VIEW_CELLS, part)),
        "layers": cap.layer_indices(part),
        "n_heads": cap.info(part)["n_heads"],
        "heads": cap.kept_heads(part),  # the mosaic's columns, by the model's numbers
        "figure": json.loads(fig.to_json()),
    }


def _fig_html(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})


def _table(rows: list[tuple[str, Any]]) -> str:
    cell = "padding:1px 8px;text-align:left;border-bottom:1px solid #e5e5e5;vertical-align:top"
    body = "".join(
        f'<tr><th style="{cell}">{escape(str(k))}</th><td style="{cell}">{escape(_text(v))}</td></tr>' for k, v in rows
    )
    return f'<table style="border-collapse:collapse">{body}</table>'


def _text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
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


_CSS = """
body{font-family:"attnviz CJK",system-ui,sans-serif;font-size:14px;margin:16px auto;max-width:1200px;color:#222}
h2{margin-top:28px;border-bottom:1px solid #ddd}
.av-bar{display:flex;flex-wrap:wrap;gap:12px;align-items:center;margin:8px 0;padding:8px;background:#f6f6f9;
position:sticky;top:0;z-index:10;border:1px solid #e3e3ea;border-radius:6px}
.av-bar label{display:flex;gap:4px;align-items:center}
.av-note{color:#555;font-size:12px}
select,option,button{font-family:inherit;font-size:13px}
.av-text{white-space:pre-wrap;background:#fafafa;border:1px solid #eee;padding:6px;border-radius:4px}
"""

# the page's script: decodes a head's map (DecompressionStream: deflate) and draws the heatmap, the
# query's row, the head view and a generation's step with Plotly.react, as the selectors say
_JS = r"""
(function(){
const D = JSON.parse(document.getElementById('attnviz-data').textContent);
const $ = id => document.getElementById(id);
const cache = new Map();
// plotly's Python "Blues" (plotly.js' own named scale runs the other way): white 0 to dark blue at the top
const BLUES = [[0, '#f7fbff'], [0.125, '#deebf7'], [0.25, '#c6dbef'], [0.375, '#9ecae1'], [0.5, '#6baed6'],
  [0.625, '#4292c6'], [0.75, '#2171b5'], [0.875, '#08519c'], [1, '#08306b']];
async function inflate(b64){
  const bin = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const stream = new Blob([bin]).stream().pipeThrough(new DecompressionStream('deflate'));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}
function part(){ return D.parts.find(p => p.name === ($('av-part') ? $('av-part').value : D.parts[0].name)); }
function key(p, u, m, l, h){ return [p, u, m, l, h].join('/'); }
// stored: the token weights, and what moves between words; the rest is drawn from them
function storedKey(p, u, m, l, h){ return key(p.name, u === 'words' && m === 'moved' ? 'words' : 'tokens', m === 'moved' && u === 'words' ? 'moved' : 'weights', l, h); }
function decode(lv, s, nq, nk, allowed){
  const z = [];
  for (let i = 0; i < nq; i++){
    const row = new Array(nk);
    for (let j = 0; j < nk; j++) row[j] = allowed(i, j) ? lv[i*nk+j] * s / 255 : null;
    z.push(row);
  }
  return z;
}
async function getMap(p, u, m, l, h){
  const k = key(p.name, u, m, l, h);
  if (!(storedKey(p, u, m, l, h) in D.maps)) return null;
  if (cache.has(k)) return cache.get(k);
  let r;
  if (u === 'tokens' && m === 'weights'){
    const [s, b64] = D.maps[k], nk = p.units.tokens.k.length;
    const lv = await inflate(b64), mask = await inflate(D.mask_data[D.masks[p.name + '/' + l]]);
    r = {z: decode(lv, s, p.units.tokens.q.length, nk, (i, j) => mask[i*nk+j]), s: s};
  } else if (u === 'tokens') r = await moved(p, l, h);
  else if (m === 'weights') r = await wordMap(p, l, h);
  else {
    const [s, b64] = D.maps[k], w = await wordMap(p, l, h);
    r = {z: decode(await inflate(b64), s, p.units.words.q.length, p.units.words.k.length, (i, j) => w.z[i][j] !== null), s: s};
  }
  cache.set(k, r);
  return r;
}
async function wordMap(p, l, h){
  // the token weights merged as cap.attention(words=True) does: a key word sums its tokens, a query word
  // averages its tokens' rows; a word pair is masked where every token pair is
  const t = await getMap(p, 'tokens', 'weights', l, h);
  const wq = p.word_of.q, wk = p.word_of.k, nQ = p.units.words.q.length, nK = p.units.words.k.length;
  const sum = Array.from({length: nQ}, () => new Float64Array(nK)), open = Array.from({length: nQ}, () => new Uint8Array(nK));
  const count = new Float64Array(nQ);
  for (let i = 0; i < wq.length; i++){
    const I = wq[i]; if (I < 0) continue;
    count[I]++;
    const row = t.z[i];
    for (let j = 0; j < wk.length; j++){
      const J = wk[j]; if (J < 0 || row[j] === null) continue;
      sum[I][J] += row[j]; open[I][J] = 1;
    }
  }
  let s = 0;
  const z = sum.map((row, I) => Array.from(row, (v, J) => { if (!open[I][J]) return null; const x = v / count[I]; if (x > s) s = x; return x; }));
  return {z: z, s: s > 0 ? s : 1};
}
async function moved(p, l, h){
  // what moves between tokens, α_ij·‖f_h(x_j)‖: the stored weights times each key's norm (float32)
  const w = await getMap(p, 'tokens', 'weights', l, h);
  const [top, b64] = D.norms[p.name + '/' + l];
  const norms = new Uint16Array((await inflate(b64)).buffer);
  const nk = p.units.tokens.k.length, off = p.heads[l].indexOf(h) * nk;
  let s = 0;
  const z = w.z.map(row => row.map((v, j) => { if (v === null) return null; const x = v * norms[off + j] * top / 65535; if (x > s) s = x; return x; }));
  return {z: z, s: s > 0 ? s : 1};
}
function fill(sel, items, keep){
  const old = sel.value;
  sel.innerHTML = '';
  items.forEach(([v, t]) => { const o = document.createElement('option'); o.value = v; o.textContent = t; sel.appendChild(o); });
  if (keep && items.some(([v]) => String(v) === old)) sel.value = old;
}
function ticks(names, max){
  const step = Math.max(1, Math.ceil(names.length / max)), v = [], t = [];
  for (let i = 0; i < names.length; i += step){ v.push(i); t.push(names[i].length > 12 ? names[i].slice(0, 11) + '…' : names[i]); }
  return {tickmode: 'array', tickvals: v, ticktext: t};
}
function selectors(){
  const p = part();
  const layers = D.chosen ? [...new Set(D.chosen.filter(c => c[0] === p.name).map(c => c[1]))] : p.layers;
  fill($('av-layer'), layers.map(l => [l, 'L' + l]), true);
  const l = +$('av-layer').value;
  const heads = D.chosen ? D.chosen.filter(c => c[0] === p.name && c[1] === l).map(c => c[2]) : p.heads[l];
  fill($('av-head'), heads.map(h => [h, 'H' + h]), true);
  const u = $('av-units').value, q = p.units[u].q;
  const measures = p.measures.filter(m => m === 'weights' || u === 'tokens' || p.words_moved);
  fill($('av-measure'), measures.map(m => [m, m === 'weights' ? 'weights α' : 'what moves ‖α·f(x)‖']), true);
  const before = $('av-query').value;
  fill($('av-query'), q.map((t, i) => [i, i + ': ' + t]), true);
  if (before === '' || +before >= q.length) $('av-query').value = q.length - 1;
  if ($('av-step')){
    const n = p.units.tokens.q.length - (p.prompt_length || 0);
    fill($('av-step'), [...Array(Math.max(n, 0)).keys()].map(i => [i, 'step ' + i + ': ' + p.units.tokens.q[p.prompt_length + i]]), true);
  }
}
let drawing = 0;  // the latest draw wins: an earlier one still decoding draws nothing
async function draw(){
  const mine = ++drawing;
  const p = part(), u = $('av-units').value, m = $('av-measure').value;
  const l = +$('av-layer').value, h = +$('av-head').value, qi = +$('av-query').value;
  const names = p.units[u], map = await getMap(p, u, m, l, h);
  if (mine !== drawing) return;
  const title = (D.parts.length > 1 ? p.name + ' ' : '') + 'L' + l + '·H' + h + ' — ' + (m === 'weights' ? 'weights α' : 'what moves ‖α·f(x)‖') + ', ' + u;
  $('av-status').textContent = map ? title : 'L' + l + '·H' + h + ' is not in this report (past its size budget)';
  if (!map) return;
  const top = m === 'weights' ? 1 : map.s;
  const hover = names.q.length * names.k.length <= 65536;
  Plotly.react('av-heatmap', [{type: 'heatmap', z: map.z, colorscale: BLUES, zmin: 0, zmax: top, hoverongaps: false,
      text: hover ? names.q.map(a => names.k.map(b => a + ' → ' + b)) : null,
      hovertemplate: (hover ? '%{text}' : 'query %{y} → key %{x}') + ': %{z:.4f}<extra></extra>'}],
    {title: {text: title}, height: Math.min(900, 260 + 14 * Math.min(names.q.length, 60)),
     xaxis: Object.assign({side: 'top'}, ticks(names.k, 64)), yaxis: Object.assign({autorange: 'reversed'}, ticks(names.q, 64)),
     margin: {t: 140, l: 110, r: 20, b: 20}, font: {family: '"attnviz CJK", "Open Sans", verdana, arial, sans-serif'}});
  const row = map.z[qi].map(v => v === null ? 0 : v);
  Plotly.react('av-row', [{type: 'bar', x: names.k.map((_, i) => i), y: row, customdata: names.k,
      hovertemplate: '%{customdata}: %{y:.4f}<extra></extra>'}],
    {title: {text: 'query ' + qi + ' ' + JSON.stringify(names.q[qi]) + ' → keys (' + title + ')'}, height: 340,
     xaxis: ticks(names.k, 64), yaxis: {range: [0, top * 1.02]}, margin: {t: 60, l: 50, r: 10, b: 90},
     font: {family: '"attnviz CJK", "Open Sans", verdana, arial, sans-serif'}});
  headView(names, map.z, top, title, qi);
  if ($('av-step')) await step(p, l, h);
}
function headView(names, z, top, title, qi){
  const bins = [0.1, 0.25, 0.5, 0.75, 1.01], xs = bins.map(() => []), ys = bins.map(() => []), qx = [], qy = [];
  for (let i = 0; i < z.length; i++) for (let j = 0; j < z[i].length; j++){
    const v = z[i][j] === null ? 0 : z[i][j] / top;
    if (v < 0.02) continue;
    if (i === qi){ qx.push(0, 1, null); qy.push(i, j, null); continue; }
    const found = bins.findIndex(e => v < e), b = found < 0 ? bins.length - 1 : found;
    xs[b].push(0, 1, null); ys[b].push(i, j, null);
  }
  const traces = bins.map((_, b) => ({type: 'scatter', mode: 'lines', x: xs[b], y: ys[b], hoverinfo: 'skip', showlegend: false,
      line: {color: 'rgba(31,119,180,' + [0.12, 0.3, 0.55, 0.8, 1][b] + ')', width: 1 + b * 0.6}}));
  traces.push({type: 'scatter', mode: 'lines', x: qx, y: qy, hoverinfo: 'skip', showlegend: false,
      line: {color: 'rgba(255,127,14,0.9)', width: 2}});
  traces.push({type: 'scatter', mode: 'markers', x: names.k.map(() => 1), y: names.k.map((_, j) => j), yaxis: 'y2',
      marker: {size: 3, color: '#888'}, customdata: names.k, hovertemplate: 'key %{y}: %{customdata}<extra></extra>'});
  const n = Math.max(names.q.length, names.k.length), range = [n - 0.5, -0.5];
  Plotly.react('av-headview', traces,
    {title: {text: 'head view: ' + title + ' — queries left, keys right; the chosen query in orange (lines ≥ 2% of the largest)'},
     height: Math.min(1400, 140 + 16 * n), xaxis: {range: [-0.02, 1.02], visible: false}, showlegend: false,
     yaxis: Object.assign({range: range}, ticks(names.q, 80)),
     yaxis2: Object.assign({range: range, overlaying: 'y', side: 'right'}, ticks(names.k, 80)),
     margin: {t: 50, l: 110, r: 110, b: 20}, font: {family: '"attnviz CJK", "Open Sans", verdana, arial, sans-serif'}});
}
async function step(p, l, h){
  const i = +$('av-step').value, pos = p.prompt_length + i;
  const map = await getMap(p, 'tokens', 'weights', l, h);
  if (!map || isNaN(pos)) return;
  const names = p.units.tokens.k.slice(0, pos + 1), xs = names.map((_, j) => j);
  const rowOf = r => map.z[r].slice(0, pos + 1).map(v => v === null ? 0 : v);
  const colour = xs.map(j => j >= p.prompt_length ? '#ff7f0e' : '#1f77b4');
  Plotly.react('av-steps', [
      {type: 'bar', x: xs, y: rowOf(Math.max(pos - 1, 0)), marker: {color: colour}, customdata: names, name: 'choosing',
       hovertemplate: '%{customdata}: %{y:.4f}<extra></extra>'},
      {type: 'bar', x: xs, y: rowOf(pos), marker: {color: colour}, customdata: names, name: 'reading', xaxis: 'x2', yaxis: 'y2',
       hovertemplate: '%{customdata}: %{y:.4f}<extra></extra>'}],
    {title: {text: 'step ' + i + ': the model wrote ' + JSON.stringify(names[pos]) + ' at position ' + pos +
      ' — top: the row of the position before it, whose output chose it; bottom: its own row (L' + l + '·H' + h + ')'},
     grid: {rows: 2, columns: 1}, height: 520, showlegend: false, xaxis: ticks(names, 64), xaxis2: ticks(names, 64),
     yaxis: {range: [0, 1.02]}, yaxis2: {range: [0, 1.02]}, margin: {t: 70, l: 50, r: 10, b: 60},
     font: {family: '"attnviz CJK", "Open Sans", verdana, arial, sans-serif'}});
}
function changed(){ selectors(); draw().catch(e => { $('av-status').textContent = 'could not draw: ' + e.message; }); }
['av-part', 'av-layer', 'av-head', 'av-units', 'av-measure', 'av-query', 'av-step'].forEach(id => { if ($(id)) $(id).addEventListener('change', changed); });
async function thumbnails(){
  // the model view's mosaic: 8-bit levels of 1, 255 a gap; each cell names its thumbnail's layer and head
  const T = D.thumbnails, lv = await inflate(T.z), [rows, cols] = T.shape, [tq, tk] = T.size;
  const z = [], ids = [];
  for (let r = 0; r < rows; r++){
    const zr = new Array(cols), ir = new Array(cols), layer = T.layers[Math.min(Math.floor(r / (tq + 1)), T.layers.length - 1)];
    for (let c = 0; c < cols; c++){
      const v = lv[r * cols + c];
      zr[c] = v === 255 ? null : v / 254;
      ir[c] = [layer, T.heads[Math.min(Math.floor(c / (tk + 1)), T.heads.length - 1)]];
    }
    z.push(zr); ids.push(ir);
  }
  const fig = T.figure;
  fig.data[0].z = z; fig.data[0].customdata = ids;
  await Plotly.newPlot('av-model', fig.data, fig.layout, {displaylogo: false});
  $('av-model').on('plotly_click', ev => {
    const c = ev.points[0].customdata; if (!c) return;
    $('av-layer').value = c[0]; selectors(); $('av-head').value = c[1]; changed();
  });
}
const o = D.open;
if ($('av-part')) $('av-part').value = o.part;
$('av-units').value = o.units;
selectors();
$('av-layer').value = o.layer; selectors(); $('av-head').value = o.head;
if (o.query !== null) $('av-query').value = o.query;
window.attnvizReport = {ready: Promise.all([draw(), thumbnails()]).then(() => true), getMap: getMap, data: D};
})();
"""


def _select(sel_id: str, label: str, options: list[tuple[str, str]] = ()) -> str:  # type: ignore[assignment]
    opts = "".join(f'<option value="{escape(v)}">{escape(t)}</option>' for v, t in options)
    return f'<label>{escape(label)} <select id="{sel_id}">{opts}</select></label>'


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
            + _fig_html(validation_map(validation, part=part), "av-validation")
        )
    except AttnvizError as err:
        sections.append(f"<h2>Validation certificate</h2><p>Not validated: {escape(str(err))}</p>")
    if intervention is not None:
        sections.append(_edits_html(intervention))
    if ranking is not None:
        sections.append(
            "<h2>Coreference ranking</h2>" + ranking_html(ranking) + _fig_html(coref_bars(ranking), "av-coref")
        )
    if probes is not None:
        sections.append(
            "<h2>Probe set: accuracy with its intervals</h2>"
            + probes_html(probes)
            + _fig_html(probe_intervals(probes), "av-probes")
        )
    if atlas is not None:
        from .atlas import atlas_map  # deferred: atlas imports html, as this module does; only an atlas needs it

        names = list(dict.fromkeys(atlas["part"])) if "part" in atlas.columns else [None]
        sections.append(
            "<h2>Head atlas</h2>"
            + "".join(_fig_html(atlas_map(atlas, part=p), f"av-atlas-{i}") for i, p in enumerate(names))
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
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
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
    left = "".join(f"<li>{escape(x)}</li>" for x in data.left_out)
    left = f"<p><b>Left out of this report:</b></p><ul>{left}</ul>" if left else ""
    body = (
        f"<h1>{escape(title)}</h1><div class='av-text'>{escape(cap.text)}</div>"
        f"<p class='av-note'>{cap.n_tokens} tokens · {cap.model.get('name')} · {QUANTISATION} "
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
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{escape(title)}</title>{face}'
        f"<style>{_CSS}</style>"
        f'<script type="text/javascript">{plotly_js}</script></head>\n<body>{body}\n'
        f'<script type="application/json" id="attnviz-data">{blob}</script>\n<script>{_JS}</script>\n</body></html>\n'
    )
    if path is not None:
        write_page(page, path)
    return page


def _edits_html(out: Intervention) -> str:
    from .maps import heatmap  # deferred: a report without edits draws no static heatmap

    parts = [f"<h2>Edits: before and after</h2><p>{escape('; '.join(map(str, out.edits)))}</p>"]
    try:
        parts.append(_fig_html(prediction_bars(out), "av-predictions"))
    except AttnvizError as err:
        parts.append(f"<p>{escape(str(err))}</p>")
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
                    parts.append(_fig_html(fig, f"av-edit-{shown}-{which}"))
                shown += 1
    return "".join(parts)


def write_report(cap: Capture, path: str | Path, **kwargs: Any) -> Path:
    """``Capture.report(path, …)``: :func:`report` written to ``path``; the path returned."""
    report(cap, path, **kwargs)
    return Path(path)


register_report(Capture, write_report)  # Capture.report asks data.reprs, which this module fills in
