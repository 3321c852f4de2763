// epochlens explorer: the scatter, its colours, and the detectors' ROC (the page's files load in the order of index.html).
'use strict';

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
      `<span class="legend-item"><span class="swatch" style="background:${PALETTE[i % PALETTE.length]}"></span>${esc(cat)}</span>`).join('');
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
  // square points: 5 pixels up to 5,000 samples, 3 up to 50,000, 2 beyond
  const lo = n <= 5000 ? -2 : n <= 50000 ? -1 : 0, hi = n <= 5000 ? 2 : 1;
  const plot = (i, col) => {
    const x = xs[i], y = ys[i];
    if (!(x >= x0 && x <= x1 && y >= y0 && y <= y1)) return; // NaN too
    const cx = MARGIN.left + ((x - x0) * sx) | 0;
    const cy = MARGIN.top + ph - ((y - y0) * sy) | 0;
    for (let dy = lo; dy <= hi; dy++) {
      const o = (cy + dy) * w + cx;
      for (let dx = lo; dx <= hi; dx++) px[o + dx] = col;
    }
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

// ---- detectors --------------------------------------------------------------------------------

function renderRoc() {
  const roc = app.m.roc;
  const box = $('roc');
  if (!roc.curves.length) { box.innerHTML = `<p class="hint">No ROC: ${roc.note}.</p>`; return; }
  box.innerHTML = '<p class="hint">ROC against is_corrupted over the trained samples (computed with scikit-learn when the explorer was built)</p>';
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
    item.innerHTML = `<span class="swatch" style="background:${PALETTE[i % PALETTE.length]}"></span>${esc(c.name)}: AUROC ${c.auroc.toFixed(3)} <span class="hint">(${c.n_positive} / ${c.n_negative})</span>`;
    box.append(item);
  });
}
