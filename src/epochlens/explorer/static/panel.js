// epochlens explorer: the table, the sample panel and the CSV export (the page's files load in the order of index.html).
'use strict';

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
  const label = app.info.label_name ? 'label_name' : 'label';
  const names = [s.sort, label, s.color, s.x, s.y].filter((n) => app.info[n]);
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

// A sample's picture: a crop of a thumbnail sheet ("thumbs/train_0.png#xywh=x,y,w,h", a media
// fragment: samples/sheets.py) drawn on a canvas, or a whole image file.
function thumbnail(src, id) {
  const m = /^(.*)#xywh=(\d+),(\d+),(\d+),(\d+)$/.exec(src);
  if (!m) return Object.assign(document.createElement('img'), { src, alt: id });
  const [x, y, w, h] = m.slice(2).map(Number);
  const canvas = Object.assign(document.createElement('canvas'), { width: w, height: h, className: 'thumb' });
  canvas.setAttribute('role', 'img');
  canvas.setAttribute('aria-label', id);
  const sheet = new Image();
  sheet.onload = () => {
    canvas.getContext('2d').drawImage(sheet, x, y, w, h, 0, 0, w, h);
    canvas.dataset.drawn = 'true';
  };
  sheet.src = m[1];
  return canvas;
}

async function renderPanel(row) {
  const d = await rowData(row);
  const panel = $('panel');
  const head = document.createElement('div');
  const s = d.strings;
  head.innerHTML = `<h2>${esc(s.id ?? 'row ' + row)}</h2>`;
  if (s.text !== undefined) head.innerHTML += `<div class="sample-text"></div>`;
  if (s.image) head.querySelector('h2').after(thumbnail(s.image, s.id ?? ''));
  const kv = document.createElement('table');
  kv.className = 'kv';
  const predicted = d.series.predicted ? d.series.predicted.filter(Number.isFinite) : [];
  if (predicted.length) {
    const p = predicted[predicted.length - 1];
    const name = p < 0 ? 'no active class' : (app.m.class_names[String(p)] ?? String(p));
    kv.insertRow().innerHTML = `<td>prediction (last checkpoint)</td><td data-column="prediction">${esc(name)}</td>`;
  }
  for (const [name, v] of Object.entries(d.scalars)) {
    const text = label(name, v);
    if (text !== '') kv.insertRow().innerHTML = `<td>${esc(name)}</td><td data-column="${esc(name)}">${esc(text)}</td>`;
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
