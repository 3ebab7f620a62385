// DOM helpers of the fencer console. Every text reaches the page through
// textContent or an attribute, never as HTML: resource names, holders and
// reasons are whatever clients sent.

/** Creates an element: h('td', {class: 'num'}, 'text', child, …). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) {
      el.addEventListener(k.slice(2), v);
    } else if (k === 'dataset') {
      for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv);
    } else if (v === true) {
      el.setAttribute(k, '');
    } else {
      el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/**
 * A table: columns are {label, cell(row) → node|text, class?}; `empty` is
 * shown in a single row when there are no rows.
 */
export function table(columns, rows, empty, attrs) {
  const head = h('tr', {}, columns.map((c) => h('th', { class: c.class, scope: 'col' }, c.label)));
  const body = rows.length
    ? rows.map((r) => h('tr', r.__attrs || {}, columns.map((c) => h('td', { class: c.class }, c.cell(r)))))
    : [h('tr', {}, h('td', { colspan: columns.length, class: 'muted empty' }, empty || 'nothing'))];
  return h('table', attrs || {}, h('thead', {}, head), h('tbody', {}, body));
}

/** Label/value pairs as a definition list. */
export function facts(pairs) {
  return h('dl', { class: 'facts' }, pairs.filter(Boolean).map(([k, v, attrs]) => [h('dt', {}, k), h('dd', attrs || {}, v)]));
}

/** 1234 → "1.2s", 61000 → "1m 1s", 90061000 → "1d 1h". */
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  ms = Math.max(0, ms);
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${Math.floor(s % 60)}s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 24) return `${hrs}h ${m % 60}m`;
  return `${Math.floor(hrs / 24)}d ${hrs % 24}h`;
}

/** Unix ms → local "YYYY-MM-DD HH:MM:SS". */
export function clock(unixMs) {
  if (!unixMs) return '—';
  const d = new Date(unixMs);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** A number with thousands separators. */
export function num(n) {
  return n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US');
}

/** A small coloured label. */
export function badge(text, kind) {
  return h('span', { class: `badge ${kind || ''}` }, text);
}

/** A link to a page of the console. */
export function link(hash, text) {
  return h('a', { href: hash }, text);
}

/**
 * Asks the operator to confirm an action. `fields` are {name, label, type?,
 * value?, required?, min?}. Resolves with the entered values once `run(values)`
 * succeeded (its error is shown in the dialog and the dialog stays open),
 * or with null when cancelled.
 */
export function confirmAction({ title, text, ok, fields, run }) {
  const dialog = document.getElementById('confirm-dialog');
  const form = document.getElementById('confirm-form');
  const error = document.getElementById('confirm-error');
  fill(document.getElementById('confirm-title'), title);
  fill(document.getElementById('confirm-text'), text);
  fill(document.getElementById('confirm-ok'), ok);
  const inputs = {};
  fill(
    document.getElementById('confirm-fields'),
    fields.map((f) => {
      const input = h('input', {
        name: f.name,
        type: f.type || 'text',
        value: f.value ?? '',
        required: f.required !== false,
        min: f.min,
        autocomplete: 'off',
        spellcheck: 'false',
      });
      inputs[f.name] = input;
      return h('label', {}, f.label, input);
    }),
  );
  error.hidden = true;
  return new Promise((resolve) => {
    const done = (v) => {
      form.removeEventListener('submit', submit);
      cancel.removeEventListener('click', onCancel);
      dialog.removeEventListener('cancel', onCancel);
      if (dialog.open) dialog.close();
      resolve(v);
    };
    const submit = async (ev) => {
      ev.preventDefault();
      const values = Object.fromEntries(Object.entries(inputs).map(([k, i]) => [k, i.value.trim()]));
      try {
        document.getElementById('confirm-ok').disabled = true;
        const result = await run(values);
        done({ values, result });
      } catch (e) {
        fill(error, e.message || String(e));
        error.hidden = false;
      } finally {
        document.getElementById('confirm-ok').disabled = false;
      }
    };
    const onCancel = (ev) => {
      ev.preventDefault();
      done(null);
    };
    const cancel = document.getElementById('confirm-cancel');
    form.addEventListener('submit', submit);
    cancel.addEventListener('click', onCancel);
    dialog.addEventListener('cancel', onCancel);
    dialog.showModal();
    const first = fields.length ? inputs[fields[0].name] : null;
    if (first) first.focus();
  });
}

/** A line of text that says when the data shown was fetched. */
export function freshness(at) {
  return h('span', { class: 'muted fresh', dataset: { at } }, `updated ${clock(at)}`);
}
