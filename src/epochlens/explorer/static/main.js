// epochlens explorer: the controls, and the start (the page's files load in the order of index.html).
'use strict';

// ---- controls and start -----------------------------------------------------------------------

function fillSelect(select, names, value) {
  select.innerHTML = names.map((n) => `<option value="${esc(n)}" title="${esc(app.m.descriptions[n] ?? '')}">${esc(n)}</option>`).join('');
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
  $('add-filter').innerHTML = '<option value="">…</option>' + free.map((n) => `<option>${esc(n)}</option>`).join('');
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
    else $('panel').innerHTML = `<p class="hint">No sample ${esc(state.sample)} in this run.</p>`;
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
