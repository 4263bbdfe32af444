"""The report page's own style and script (:mod:`attnviz.views.report_page` inlines both): the script decodes a
head's map (the browser's ``DecompressionStream``: deflate) and draws the heatmap, the query's row, the head view,
the model view's mosaic and a generation's step with ``Plotly.react``, as the page's selectors say."""

__all__ = ["REPORT_CSS", "REPORT_JS"]

REPORT_CSS = """
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
REPORT_JS = r"""
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
