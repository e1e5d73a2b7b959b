const chart = document.getElementById('panel');
const fail = (e) => {
  const text = 'The report could not be drawn: ' + (e && e.message ? e.message : String(e));
  window.__modprof_error = text;
  console.error(text);
  const box = document.createElement('div');
  box.className = 'error';
  box.textContent = text;
  chart.replaceChildren(box);
};
try {
  const read = (id) => JSON.parse(document.getElementById(id).textContent);
  const spec = read('modprof-spec');
  const table = read('modprof-rows');
  const columns = table.columns;
  const rows = table.data.map((r) => {
    const o = {};
    for (let i = 0; i < columns.length; ++i) o[columns[i]] = r[i];
    return o;
  });
  spec.data.find((d) => d.name === 'wandb').values = rows;
  const size = () => [Math.max(480, chart.clientWidth), Math.max(360, chart.clientHeight)];
  [spec.width, spec.height] = size();
  const result = await window.vegaEmbed(chart, spec, {
    mode: 'vega', renderer: 'svg', actions: false, tooltip: false,
  });
  const view = result.view;
  window.__modprof_view = view;
  window.__modprof_ready = performance.now();
  let pending = 0;
  window.addEventListener('resize', () => {
    cancelAnimationFrame(pending);
    pending = requestAnimationFrame(() => {
      const [w, h] = size();
      if (w !== view.width() || h !== view.height()) view.width(w).height(h).runAsync();
    });
  });
} catch (e) {
  fail(e);
}
