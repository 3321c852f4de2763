// epochlens explorer: a static page over manifest.json, columns/*.bin and chunks/* (built by
// epochlens.explorer.build). No library, nothing from the network: the scatter is drawn into a canvas
// ImageData (a million points without WebGL), the small charts with the canvas 2D API.
'use strict';

const $ = (id) => document.getElementById(id);
const PALETTE = ['#4e79a7', '#e15759', '#59a14f', '#f28e2b', '#b07aa1', '#76b7b2', '#edc948',
  '#ff9da7', '#9c755f', '#bab0ac'];
const VIRIDIS = ['#440154', '#482878', '#3e4989', '#31688e', '#26828e', '#1f9e89', '#35b779',
  '#6ece58', '#b5de2b', '#fde725'];
const OUT_COLOUR = 0xffdddddd; // ABGR: a filtered-out point
const NAN_COLOUR = 0xff999999;
const TABLE_ROWS = 100;

const app = {
  m: null, // the manifest
  info: {}, // column name -> manifest entry
  cols: {}, // column name -> Promise of its typed array
  chunks: {}, // chunk number -> Promise of {bin, strings}
  state: null, // {x, y, color, filters: {name: [min, max] | [names]}, sort, desc, sample}
  mask: null, // Uint8Array: 1 = passes the filters
  view: null, // the scatter's transform
  timings: {},
};
window.explorerTimings = app.timings;

// ---- data -------------------------------------------------------------------------------------

async function fetchOk(url, kind) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return kind === 'json' ? r.json() : r.arrayBuffer();
}

function column(name) {
  if (!app.cols[name]) {
    const c = app.info[name];
    const Type = { float32: Float32Array, uint8: Uint8Array, uint16: Uint16Array }[c.dtype];
    app.cols[name] = fetchOk(c.file).then((buf) => new Type(buf));
  }
  return app.cols[name];
}

function chunkBin(c) {
  if (!app.chunks[c]) app.chunks[c] = fetchOk(`chunks/${c}.bin`).then((buf) => new Float32Array(buf));
  return app.chunks[c];
}

function chunkStrings(c) {
  const key = `s${c}`;
  if (!app.chunks[key]) app.chunks[key] = fetchOk(`chunks/${c}.json`, 'json');
  return app.chunks[key];
}

// One row's strings (id, text, image): all the table needs of its chunk.
async function rowStrings(row) {
  const c = Math.floor(row / app.m.chunk_size);
  const strings = await chunkStrings(c);
  const out = {};
  for (const [name, values] of Object.entries(strings)) out[name] = values[row - c * app.m.chunk_size];
  return out;
}

// One row's scalars, series, neighbours and strings (from its chunk).
async function rowData(row) {
  const size = app.m.chunk_size;
  const c = Math.floor(row / size);
  const k = row - c * size;
  const [bin, strings] = await Promise.all([chunkBin(c), rowStrings(row)]);
  const L = app.m.layout;
  const v = bin.subarray(k * L.width, (k + 1) * L.width);
  const out = { row, scalars: {}, series: {}, neighbours: [], strings: {} };
  L.scalars.forEach((name, i) => { out.scalars[name] = v[i]; });
  for (const s of L.series) out.series[s.name] = Array.from(v.subarray(s.offset, s.offset + app.m.epochs.length));
  for (const nb of L.neighbours) {
    const items = [];
    for (let j = 0; j < nb.k; j++) {
      const r = v[nb.offset + j];
      if (r >= 0) items.push({ row: r, score: v[nb.offset + nb.k + j] });
    }
    out.neighbours.push({ ...nb, items });
  }
  out.strings = strings;
  return out;
}

function label(name, value) {
  const c = app.info[name];
  if (c.kind === 'category') return value === c.null || Number.isNaN(value) ? '' : c.categories[value];
  if (Number.isNaN(value)) return '';
  return Number.isInteger(value) ? String(value) : value.toPrecision(5);
}

// ---- state and the URL ------------------------------------------------------------------------

function defaultState() {
  const d = app.m.default;
  return { x: d.x, y: d.y, color: d.color, filters: { ...d.filters }, sort: d.x, desc: true, sample: null };
}

function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  const s = defaultState();
  for (const key of ['x', 'y', 'color', 'sort']) if (p.has(key) && app.info[p.get(key)]) s[key] = p.get(key);
  if (p.has('desc')) s.desc = p.get('desc') !== '0';
  if (p.has('f')) {
    s.filters = {};
    for (const f of p.getAll('f')) {
      const [name, rest] = [f.slice(0, f.indexOf('=')), f.slice(f.indexOf('=') + 1)];
      if (!app.info[name]) continue;
      if (app.info[name].kind === 'number') s.filters[name] = rest.split('~').map((t) => (t === '' ? null : Number(t)));
      else s.filters[name] = rest === '' ? [] : rest.split('|');
    }
  }
  s.sample = p.has('sample') ? p.get('sample') : null;
  return s;
}

function hashOf(state) {
  const p = new URLSearchParams();
  for (const key of ['x', 'y', 'color', 'sort']) p.set(key, state[key]);
  p.set('desc', state.desc ? '1' : '0');
  const fs = Object.entries(state.filters);
  if (!fs.length) p.append('f', ''); // present even when empty: no filter at all, not the default ones
  for (const [name, v] of fs) {
    const kind = app.info[name].kind;
    p.append('f', `${name}=${kind === 'number' ? v.map((t) => (t === null ? '' : t)).join('~') : v.join('|')}`);
  }
  if (state.sample) p.set('sample', state.sample);
  return '#' + p.toString();
}

function writeHash() {
  history.replaceState(null, '', hashOf(app.state));
}

// A sample's key in the URL: index:role:position (stable across rebuilds of the explorer).
async function keyOf(row) {
  const [index, role, position] = await Promise.all(['index', 'role', 'position'].map(column));
  return `${label('index', index[row])}:${label('role', role[row])}:${position[row]}`;
}

async function rowOf(key) {
  const [i, r, p] = key.split(':');
  const [index, role, position] = await Promise.all(['index', 'role', 'position'].map(column));
  const ic = app.info.index.categories.indexOf(i);
  const rc = app.info.role.categories.indexOf(r);
  const pos = Number(p);
  for (let k = 0; k < position.length; k++) {
    if (position[k] === pos && index[k] === ic && role[k] === rc) return k;
  }
  return -1;
}

// ---- filters ----------------------------------------------------------------------------------

async function computeMask() {
  const n = app.m.n_rows;
  const mask = new Uint8Array(n).fill(1);
  for (const [name, f] of Object.entries(app.state.filters)) {
    const v = await column(name);
    const c = app.info[name];
    if (c.kind === 'number') {
      const lo = f[0] === null ? -Infinity : f[0];
      const hi = f[1] === null ? Infinity : f[1];
      for (let i = 0; i < n; i++) if (!(v[i] >= lo && v[i] <= hi)) mask[i] = 0;
    } else {
      const ok = new Uint8Array(65536);
      for (const name2 of f) { const code = c.categories.indexOf(name2); if (code >= 0) ok[code] = 1; }
      for (let i = 0; i < n; i++) if (!ok[v[i]]) mask[i] = 0;
    }
  }
  app.mask = mask;
  let count = 0;
  for (let i = 0; i < n; i++) count += mask[i];
  app.count = count;
  $('count').textContent = `${count.toLocaleString('en')} of ${n.toLocaleString('en')} samples selected`;
  $('count').dataset.count = count;
}

function renderFilters() {
  const box = $('filters');
  box.innerHTML = '';
  for (const [name, f] of Object.entries(app.state.filters)) {
    const c = app.info[name];
    const div = document.createElement('div');
    div.className = 'filter';
    div.dataset.column = name;
    div.innerHTML = `<button type="button" title="remove">×</button><span class="name">${name}</span><br>`;
    div.querySelector('button').onclick = () => { delete app.state.filters[name]; update(); };
    if (c.kind === 'number') {
      ['min', 'max'].forEach((which, i) => {
        const input = document.createElement('input');
        Object.assign(input, { type: 'number', step: 'any', placeholder: `${which} ${c[which]}`, className: which });
        if (f[i] !== null) input.value = f[i];
        input.onchange = () => { f[i] = input.value === '' ? null : Number(input.value); update(); };
        div.append(input, ' ');
      });
    } else {
      for (const cat of c.categories) {
        const l = document.createElement('label');
        l.innerHTML = `<input type="checkbox" value="${cat}"${f.includes(cat) ? ' checked' : ''}> ${cat} `;
        l.querySelector('input').onchange = (e) => {
          const set = new Set(f);
          if (e.target.checked) set.add(cat); else set.delete(cat);
          app.state.filters[name] = [...set];
          update();
        };
        div.append(l);
      }
    }
    box.append(div);
  }
}

// ---- colours ----------------------------------------------------------------------------------

function abgr(hex) {
  const v = parseInt(hex.slice(1), 16);
  return (0xff000000 | ((v & 0xff) << 16) | (v & 0xff00) | ((v >> 16) & 0xff)) >>> 0;
}

function ramp(stops, n) {
  const out = new Uint32Array(n);
  const rgb = stops.map((h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16)));
  for (let i = 0; i < n; i++) {
    const t = (i / (n - 1)) * (stops.length - 1);
    const a = Math.floor(Math.min(t, stops.length - 2));
    const u = t - a;
    const c = rgb[a].map((v, j) => Math.round(v + u * (rgb[a + 1][j] - v)));
    out[i] = (0xff000000 | (c[2] << 16) | (c[1] << 8) | c[0]) >>> 0;
  }
  return out;
}
const VIRIDIS_LUT = ramp(VIRIDIS, 256);
const PALETTE_ABGR = PALETTE.map(abgr);

function colourer(name, values) {
  const c = app.info[name];
  if (c.kind === 'category') {
    return (i) => (values[i] === c.null ? NAN_COLOUR : PALETTE_ABGR[values[i] % PALETTE.length]);
  }
  const lo = c.min, span = (c.max - c.min) || 1;
  return (i) => {
    const v = values[i];
    return Number.isNaN(v) ? NAN_COLOUR : VIRIDIS_LUT[Math.max(0, Math.min(255, ((v - lo) / span) * 255 | 0))];
  };
}

function renderLegend() {
  const name = app.state.color;
  const c = app.info[name];
  const box = $('legend');
  if (c.kind === 'category') {
    box.innerHTML = c.categories.map((cat, i) =>
      `<span class="legend-item"><span class="swatch" style="background:${PALETTE[i % PALETTE.length]}"></span>${cat}</span>`).join('');
  } else {
    box.innerHTML = `${label(name, c.min)} <span class="swatch" style="width:120px;background:linear-gradient(to right,${VIRIDIS.join(',')})"></span> ${label(name, c.max)}`;
  }
}

// ---- the scatter ------------------------------------------------------------------------------

const MARGIN = { left: 56, right: 10, top: 10, bottom: 36 };

function niceTicks(lo, hi, n) {
  const step0 = (hi - lo) / n || 1;
  const mag = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
  return out;
}

function domain(name) {
  const c = app.info[name];
  if (c.kind === 'category') return [-0.5, c.categories.length - 0.5];
  const pad = (c.max - c.min) * 0.02 || 0.5;
  return [c.min - pad, c.max + pad];
}

async function drawScatter() {
  const canvas = $('scatter');
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w; canvas.height = h;
  const [xs, ys, cs] = await Promise.all([app.state.x, app.state.y, app.state.color].map(column));
  const [x0, x1] = domain(app.state.x), [y0, y1] = domain(app.state.y);
  const pw = w - MARGIN.left - MARGIN.right, ph = h - MARGIN.top - MARGIN.bottom;
  const sx = pw / (x1 - x0), sy = ph / (y1 - y0);
  app.view = { x0, y0, sx, sy, pw, ph, w, h };
  const ctx = canvas.getContext('2d');
  const img = ctx.createImageData(w, h);
  const px = new Uint32Array(img.data.buffer);
  px.fill(0xffffffff);
  const colour = colourer(app.state.color, cs);
  const mask = app.mask;
  const n = xs.length;
  const big = n <= 50000; // 3x3 points up to 50k samples, 2x2 beyond
  const plot = (i, col) => {
    const x = xs[i], y = ys[i];
    if (!(x >= x0 && x <= x1 && y >= y0 && y <= y1)) return; // NaN too
    const cx = MARGIN.left + ((x - x0) * sx) | 0;
    const cy = MARGIN.top + ph - ((y - y0) * sy) | 0;
    const o = cy * w + cx;
    px[o] = col; px[o + 1] = col; px[o - w] = col; px[o - w + 1] = col;
    if (big) { px[o - 1] = col; px[o + w] = col; px[o - w - 1] = col; px[o + w - 1] = col; px[o + w + 1] = col; }
  };
  for (let i = 0; i < n; i++) if (!mask[i]) plot(i, OUT_COLOUR);
  const c = app.info[app.state.color];
  if (c.kind === 'category' && c.categories.length <= 12) {
    // the rarer categories drawn last, on top (a flag's "true" over its "false")
    const counts = new Float64Array(c.categories.length + 1);
    for (let i = 0; i < n; i++) if (mask[i] && cs[i] !== c.null) counts[cs[i]]++;
    const order = [...counts.keys()].slice(0, -1).sort((a, b) => counts[b] - counts[a]);
    for (let i = 0; i < n; i++) if (mask[i] && cs[i] === c.null) plot(i, NAN_COLOUR);
    for (const code of order) for (let i = 0; i < n; i++) if (mask[i] && cs[i] === code) plot(i, colour(i));
  } else {
    for (let i = 0; i < n; i++) if (mask[i]) plot(i, colour(i));
  }
  ctx.putImageData(img, 0, 0);
  drawAxes(ctx);
  if (app.selected !== undefined && app.selected >= 0) ring(ctx, xs[app.selected], ys[app.selected]);
  app.timings.drawn = performance.now();
  $('status').textContent = '';
  canvas.dataset.drawn = String((Number(canvas.dataset.drawn) || 0) + 1);
}

function toPixel(x, y) {
  const v = app.view;
  return [MARGIN.left + (x - v.x0) * v.sx, MARGIN.top + v.ph - (y - v.y0) * v.sy];
}

function ring(ctx, x, y) {
  if (!Number.isFinite(x) || !Number.isFinite(y)) return;
  const [cx, cy] = toPixel(x, y);
  ctx.strokeStyle = '#000'; ctx.lineWidth = 2;
  ctx.beginPath(); ctx.arc(cx, cy, 7, 0, 2 * Math.PI); ctx.stroke();
}

function drawAxes(ctx) {
  const v = app.view;
  ctx.strokeStyle = '#888'; ctx.fillStyle = '#333'; ctx.lineWidth = 1; ctx.font = '11px sans-serif';
  ctx.strokeRect(MARGIN.left, MARGIN.top, v.pw, v.ph);
  const axis = (name, lo, hi, horizontal) => {
    const c = app.info[name];
    const ticks = c.kind === 'category' ? c.categories.map((_, i) => i) : niceTicks(lo, hi, 6);
    for (const t of ticks) {
      const text = c.kind === 'category' ? c.categories[t] : String(t);
      const [px, py] = horizontal ? toPixel(t, v.y0) : toPixel(v.x0, t);
      ctx.textAlign = horizontal ? 'center' : 'right';
      if (horizontal) ctx.fillText(text, px, py + 14); else ctx.fillText(text, px - 4, py + 4);
    }
  };
  axis(app.state.x, v.x0, v.x0 + v.pw / v.sx, true);
  axis(app.state.y, v.y0, v.y0 + v.ph / v.sy, false);
  ctx.textAlign = 'center';
  ctx.fillText(app.state.x, MARGIN.left + v.pw / 2, v.h - 4);
  ctx.save(); ctx.translate(12, MARGIN.top + v.ph / 2); ctx.rotate(-Math.PI / 2);
  ctx.fillText(app.state.y, 0, 0); ctx.restore();
}

// The nearest selected point within 8 pixels of (px, py), or -1.
async function nearest(px, py) {
  const [xs, ys] = await Promise.all([column(app.state.x), column(app.state.y)]);
  const v = app.view;
  let best = -1, bestD = 64;
  for (let i = 0; i < xs.length; i++) {
    if (!app.mask[i]) continue;
    const dx = MARGIN.left + (xs[i] - v.x0) * v.sx - px, dy = MARGIN.top + v.ph - (ys[i] - v.y0) * v.sy - py;
    const d = dx * dx + dy * dy;
    if (d < bestD) { bestD = d; best = i; }
  }
  return best;
}

function fromPixel(px, py) {
  const v = app.view;
  return [v.x0 + (px - MARGIN.left) / v.sx, v.y0 + (MARGIN.top + v.ph - py) / v.sy];
}

function wireScatter() {
  const canvas = $('scatter');
  let start = null;
  canvas.onmousedown = (e) => { start = [e.offsetX, e.offsetY]; };
  canvas.onmouseup = async (e) => {
    if (!start) return;
    const [ax, ay] = start; start = null;
    if (Math.hypot(e.offsetX - ax, e.offsetY - ay) < 4) {
      app.timings.click = performance.now();
      const row = await nearest(e.offsetX, e.offsetY);
      if (row >= 0) select(row);
      return;
    }
    const [xa, ya] = fromPixel(ax, ay), [xb, yb] = fromPixel(e.offsetX, e.offsetY);
    for (const [name, a, b] of [[app.state.x, xa, xb], [app.state.y, ya, yb]]) {
      if (app.info[name].kind === 'number') app.state.filters[name] = [+Math.min(a, b).toPrecision(6), +Math.max(a, b).toPrecision(6)];
    }
    update();
  };
}

// ---- the table --------------------------------------------------------------------------------

// The selected rows, sorted by the sort column (NaN and empty last).
async function sortedRows() {
  const v = await column(app.state.sort);
  const c = app.info[app.state.sort];
  const rows = [];
  for (let i = 0; i < app.mask.length; i++) if (app.mask[i]) rows.push(i);
  const key = (i) => (c.kind === 'category' ? (v[i] === c.null ? NaN : v[i]) : v[i]);
  const sign = app.state.desc ? -1 : 1;
  rows.sort((a, b) => {
    const ka = key(a), kb = key(b);
    if (Number.isNaN(ka)) return Number.isNaN(kb) ? a - b : 1;
    if (Number.isNaN(kb)) return -1;
    return ka === kb ? a - b : sign * (ka - kb);
  });
  return rows;
}

function tableColumns() {
  const s = app.state;
  const names = ['label_name', 'label', 'role', s.sort, s.x, s.y, s.color].filter((n) => app.info[n]);
  return [...new Set(names)];
}

async function renderTable() {
  const rows = (await sortedRows()).slice(0, TABLE_ROWS);
  const names = tableColumns();
  const texts = app.m.strings.filter((n) => n === 'id' || n === 'text');
  const values = await Promise.all(names.map(column));
  const data = await Promise.all(rows.map(rowStrings));
  $('table').tHead.innerHTML = '<tr>' + [...texts, ...names].map((n) =>
    `<th data-column="${n}" title="${app.info[n] ? 'sort by ' + n : ''}">${n}${n === app.state.sort ? (app.state.desc ? ' ▼' : ' ▲') : ''}</th>`).join('') + '</tr>';
  for (const th of $('table').tHead.querySelectorAll('th')) {
    if (!app.info[th.dataset.column]) continue;
    th.onclick = () => {
      if (app.state.sort === th.dataset.column) app.state.desc = !app.state.desc;
      app.state.sort = th.dataset.column;
      update();
    };
  }
  const body = $('table').tBodies[0];
  body.innerHTML = '';
  rows.forEach((row, k) => {
    const tr = document.createElement('tr');
    tr.dataset.row = row;
    if (row === app.selected) tr.className = 'selected';
    for (const t of texts) {
      const td = document.createElement('td');
      td.className = t;
      td.textContent = data[k][t] ?? '';
      tr.append(td);
    }
    names.forEach((n, j) => {
      const td = document.createElement('td');
      td.dataset.column = n;
      td.textContent = label(n, values[j][row]);
      tr.append(td);
    });
    tr.onclick = () => select(row);
    body.append(tr);
  });
  $('table-note').textContent = app.count > TABLE_ROWS ? `first ${TABLE_ROWS} of ${app.count.toLocaleString('en')}` : '';
}

// ---- the sample panel -------------------------------------------------------------------------

function forgettingEvents(correct) {
  const out = [];
  for (let t = 1; t < correct.length; t++) if (correct[t - 1] === 1 && correct[t] === 0) out.push(t);
  return out;
}

function lineChart(canvas, epochs, values, marks) {
  const w = canvas.clientWidth || 320, h = canvas.clientHeight || 110;
  canvas.width = w; canvas.height = h;
  const ctx = canvas.getContext('2d');
  const finite = values.filter(Number.isFinite);
  if (!finite.length) { ctx.fillText('no values', 10, 20); return; }
  let lo = Math.min(...finite), hi = Math.max(...finite);
  if (hi === lo) { lo -= 0.5; hi += 0.5; }
  const e0 = epochs[0], e1 = epochs[epochs.length - 1] === e0 ? e0 + 1 : epochs[epochs.length - 1];
  const X = (e) => 40 + ((e - e0) / (e1 - e0)) * (w - 50), Y = (v) => 8 + (1 - (v - lo) / (hi - lo)) * (h - 26);
  ctx.font = '10px sans-serif'; ctx.fillStyle = '#555';
  ctx.textAlign = 'right'; ctx.fillText(hi.toPrecision(3), 36, 12); ctx.fillText(lo.toPrecision(3), 36, h - 18);
  ctx.textAlign = 'center'; ctx.fillText(e0, X(e0), h - 4); ctx.fillText(e1, X(e1), h - 4);
  ctx.strokeStyle = '#e15759';
  for (const t of marks) { ctx.beginPath(); ctx.moveTo(X(epochs[t]), 8); ctx.lineTo(X(epochs[t]), h - 18); ctx.stroke(); }
  ctx.strokeStyle = '#4e79a7'; ctx.lineWidth = 1.5; ctx.beginPath();
  let pen = false;
  values.forEach((v, t) => {
    if (!Number.isFinite(v)) { pen = false; return; }
    if (pen) ctx.lineTo(X(epochs[t]), Y(v)); else ctx.moveTo(X(epochs[t]), Y(v));
    pen = true;
  });
  ctx.stroke();
  ctx.fillStyle = '#4e79a7';
  values.forEach((v, t) => { if (Number.isFinite(v)) ctx.fillRect(X(epochs[t]) - 1.5, Y(v) - 1.5, 3, 3); });
}

function seriesSection(d) {
  const epochs = app.m.epochs;
  const correct = d.series.correct;
  const marks = correct ? forgettingEvents(correct) : [];
  const box = document.createElement('div');
  if (Object.values(d.series).every((v) => v.every((x) => Number.isNaN(x)))) return box; // a query
  box.innerHTML = `<h3>Across checkpoints</h3><p class="hint">${marks.length} forgetting event(s)` +
    `${marks.length ? ' (red: correct at the checkpoint before, wrong at this one)' : ''}</p>`;
  for (const [name, values] of Object.entries(d.series)) {
    if (values.every((v) => Number.isNaN(v))) continue;
    const h = document.createElement('h3');
    h.textContent = name;
    const canvas = document.createElement('canvas');
    canvas.dataset.series = name;
    const det = document.createElement('details');
    det.innerHTML = `<summary>values</summary><table class="series-values" data-series="${name}"><tr><th>epoch</th><th>${name}</th></tr>` +
      epochs.map((e, t) => `<tr><td>${e}</td><td>${Number.isNaN(values[t]) ? '' : +values[t].toPrecision(6)}</td></tr>`).join('') + '</table>';
    box.append(h, canvas, det);
    requestAnimationFrame(() => lineChart(canvas, epochs, values, marks));
  }
  return box;
}

async function neighboursSection(d) {
  const box = document.createElement('div');
  box.className = 'neighbours';
  for (const nb of d.neighbours) {
    if (!nb.items.length) continue;
    const h = document.createElement('h3');
    h.textContent = nb.name;
    box.append(h);
    for (const it of nb.items) {
      const target = { strings: await rowStrings(it.row) };
      const a = document.createElement('a');
      a.href = hashOf({ ...app.state, sample: await keyOf(it.row) });
      a.dataset.row = it.row;
      const text = target.strings.text ?? target.strings.id ?? `row ${it.row}`;
      a.textContent = `${it.score.toPrecision(4)}  ${text.length > 80 ? text.slice(0, 80) + '…' : text}`;
      box.append(a);
    }
  }
  return box;
}

async function renderPanel(row) {
  const d = await rowData(row);
  const panel = $('panel');
  const head = document.createElement('div');
  const s = d.strings;
  head.innerHTML = `<h2>${s.id ?? 'row ' + row}</h2>`;
  if (s.image) head.innerHTML += `<img src="${s.image}" alt="${s.id ?? ''}">`;
  if (s.text !== undefined) head.innerHTML += `<div class="sample-text"></div>`;
  const kv = document.createElement('table');
  kv.className = 'kv';
  const predicted = d.series.predicted ? d.series.predicted.filter(Number.isFinite) : [];
  if (predicted.length) {
    const p = predicted[predicted.length - 1];
    const name = p < 0 ? 'no active class' : (app.m.class_names[String(p)] ?? String(p));
    kv.insertRow().innerHTML = `<td>prediction (last checkpoint)</td><td data-column="prediction">${name}</td>`;
  }
  for (const [name, v] of Object.entries(d.scalars)) {
    const text = label(name, v);
    if (text !== '') kv.insertRow().innerHTML = `<td>${name}</td><td data-column="${name}">${text}</td>`;
  }
  panel.innerHTML = '';
  panel.append(head);
  if (s.text !== undefined) head.querySelector('.sample-text').textContent = s.text;
  panel.append(kv, seriesSection(d), await neighboursSection(d));
  panel.dataset.row = row;
  app.timings.panel = performance.now();
}

async function select(row) {
  app.selected = row;
  app.state.sample = await keyOf(row);
  writeHash();
  await renderPanel(row);
  drawScatter();
  for (const tr of $('table').tBodies[0].rows) tr.classList.toggle('selected', Number(tr.dataset.row) === row);
}

// ---- detectors --------------------------------------------------------------------------------

function renderRoc() {
  const roc = app.m.roc;
  const box = $('roc');
  if (!roc.curves.length) { box.innerHTML = `<p class="hint">No ROC: ${roc.note}.</p>`; return; }
  box.innerHTML = '<p class="hint">ROC against is_corrupted over the training samples (built with scikit-learn)</p>';
  const canvas = document.createElement('canvas');
  canvas.width = 220; canvas.height = 220;
  box.append(canvas);
  const ctx = canvas.getContext('2d');
  const X = (f) => 20 + f * 190, Y = (t) => 200 - t * 190;
  ctx.strokeStyle = '#bbb'; ctx.strokeRect(20, 10, 190, 190);
  ctx.setLineDash([3, 3]); ctx.beginPath(); ctx.moveTo(X(0), Y(0)); ctx.lineTo(X(1), Y(1)); ctx.stroke(); ctx.setLineDash([]);
  roc.curves.forEach((c, i) => {
    ctx.strokeStyle = PALETTE[i % PALETTE.length]; ctx.lineWidth = 1.5; ctx.beginPath();
    c.fpr.forEach((f, j) => (j ? ctx.lineTo(X(f), Y(c.tpr[j])) : ctx.moveTo(X(f), Y(c.tpr[j]))));
    ctx.stroke();
    const item = document.createElement('span');
    item.className = 'roc-item';
    item.dataset.detector = c.name;
    item.dataset.auroc = c.auroc;
    item.innerHTML = `<span class="swatch" style="background:${PALETTE[i % PALETTE.length]}"></span>${c.name}: AUROC ${c.auroc.toFixed(3)} <span class="hint">(${c.n_positive} / ${c.n_negative})</span>`;
    box.append(item);
  });
}

// ---- export -----------------------------------------------------------------------------------

function csvCell(text) {
  return /[",\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

async function exportCsv() {
  const names = app.m.layout.scalars;
  const values = await Promise.all(names.map(column));
  const lines = [names.map(csvCell).join(',')];
  for (let i = 0; i < app.mask.length; i++) {
    if (!app.mask[i]) continue;
    lines.push(names.map((n, j) => {
      const c = app.info[n], v = values[j][i];
      if (c.kind === 'category') return csvCell(v === c.null ? '' : c.categories[v]);
      return Number.isNaN(v) ? '' : String(v);
    }).join(','));
  }
  const blob = new Blob([lines.join('\n') + '\n'], { type: 'text/csv' });
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = `${app.m.run || 'explorer'}-selection.csv`;
  document.body.append(a);
  a.click();
  a.remove();
}

// ---- controls and start -----------------------------------------------------------------------

function fillSelect(select, names, value) {
  select.innerHTML = names.map((n) => `<option value="${n}" title="${app.m.descriptions[n] ?? ''}">${n}</option>`).join('');
  select.value = value;
}

function renderControls() {
  const all = app.m.columns.map((c) => c.name);
  fillSelect($('x'), all, app.state.x);
  fillSelect($('y'), all, app.state.y);
  fillSelect($('color'), all, app.state.color);
  fillSelect($('sort'), all, app.state.sort);
  $('desc').checked = app.state.desc;
  const free = all.filter((n) => !(n in app.state.filters));
  $('add-filter').innerHTML = '<option value="">…</option>' + free.map((n) => `<option>${n}</option>`).join('');
}

async function update() {
  writeHash();
  renderControls();
  renderFilters();
  renderLegend();
  await computeMask();
  await drawScatter();
  await renderTable();
}

function wireControls() {
  for (const id of ['x', 'y', 'color', 'sort']) $(id).onchange = () => { app.state[id] = $(id).value; update(); };
  $('desc').onchange = () => { app.state.desc = $('desc').checked; update(); };
  $('add-filter').onchange = () => {
    const name = $('add-filter').value;
    if (!name) return;
    const c = app.info[name];
    app.state.filters[name] = c.kind === 'number' ? [c.min, c.max] : [...c.categories];
    update();
  };
  $('export').onclick = exportCsv;
  $('reset').onclick = () => { app.state = defaultState(); update(); };
  window.onhashchange = () => openState(readHash());
  window.onresize = () => drawScatter();
}

async function openState(state) {
  app.state = state;
  await update();
  if (state.sample) {
    const row = await rowOf(state.sample);
    if (row >= 0) await select(row);
    else $('panel').innerHTML = `<p class="hint">No sample ${state.sample} in this run.</p>`;
  }
}

async function main() {
  app.m = await fetchOk('manifest.json', 'json');
  for (const c of app.m.columns) app.info[c.name] = c;
  $('run').textContent = app.m.run ?? '';
  document.title = `epochlens explorer: ${app.m.run ?? ''}`;
  renderRoc();
  wireControls();
  wireScatter();
  await openState(readHash());
  document.body.dataset.ready = '1';
}

main().catch((e) => { $('status').textContent = String(e); console.error(e); });
