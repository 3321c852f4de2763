// epochlens explorer: the data, the state in the URL and the filters. A static page over manifest.json,
// columns/*.bin and chunks/* (built by epochlens.explorer.build). No library, nothing from the network: the
// scatter is drawn into a canvas ImageData (a million points without WebGL), the small charts with canvas 2D.
'use strict';

const $ = (id) => document.getElementById(id);
// Text of the data (ids, class names, descriptions) inside HTML written by the page.
const esc = (t) => String(t).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
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
    div.innerHTML = `<button type="button" title="remove">×</button><span class="name">${esc(name)}</span><br>`;
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
        l.innerHTML = `<input type="checkbox" value="${esc(cat)}"${f.includes(cat) ? ' checked' : ''}> ${esc(cat)} `;
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
