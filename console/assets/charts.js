// Hand-drawn SVG line charts over the last 15 minutes: no library, no
// canvas, elements built one by one (no markup parsed from strings).

import { h } from './ui.js';

// The SVG namespace is an identifier, not an address: nothing is fetched.
const SVG = 'http://www.w3.org/2000/svg';
const W = 720;
const H = 200;
const PAD = { left: 56, right: 12, top: 12, bottom: 24 };

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) {
    if (typeof c === 'string') el.appendChild(document.createTextNode(c));
    else if (c) el.appendChild(c);
  }
  return el;
}

/** A "nice" upper bound for an axis: 1, 2 or 5 × 10^n at or above `v`. */
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function fmt(v, unit) {
  if (v === null || v === undefined) return '—';
  const digits = v >= 100 ? 0 : v >= 10 ? 1 : 2;
  return `${v.toFixed(digits)}${unit ? ` ${unit}` : ''}`;
}

/**
 * A chart of `lines` ({key, label, unit, values}) over times `t` (Unix ms),
 * covering `windowMs` up to `now`. Returns a <figure> whose legend items
 * carry the latest and the highest value of each line (data-last,
 * data-max) for people and tests alike.
 */
export function lineChart({ id, title, t, lines, windowMs, now, unit }) {
  const x0 = now - windowMs;
  const all = lines.flatMap((l) => l.values.filter((v) => v !== null && v !== undefined));
  const top = niceMax(Math.max(0, ...all));
  const px = (ms) => PAD.left + ((ms - x0) / windowMs) * (W - PAD.left - PAD.right);
  const py = (v) => H - PAD.bottom - (v / top) * (H - PAD.top - PAD.bottom);
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': title });
  // Grid and y axis labels.
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    const y = py(v);
    svg.appendChild(s('line', { x1: PAD.left, x2: W - PAD.right, y1: y, y2: y, class: 'grid' }));
    svg.appendChild(s('text', { x: PAD.left - 6, y: y + 4, class: 'axis', 'text-anchor': 'end' }, fmt(v, '')));
  }
  // x axis: a label every 5 minutes, counted back from now.
  for (let m = 15; m >= 0; m -= 5) {
    const x = px(now - m * 60000);
    svg.appendChild(s('line', { x1: x, x2: x, y1: PAD.top, y2: H - PAD.bottom, class: 'grid' }));
    svg.appendChild(
      s('text', { x, y: H - 6, class: 'axis', 'text-anchor': 'middle' }, m === 0 ? 'now' : `-${m}m`),
    );
  }
  lines.forEach((line, i) => {
    let d = '';
    let pen = false;
    line.values.forEach((v, j) => {
      if (v === null || v === undefined || t[j] < x0) {
        pen = false;
        return;
      }
      d += `${pen ? 'L' : 'M'}${px(t[j]).toFixed(1)},${py(v).toFixed(1)}`;
      pen = true;
    });
    if (d) svg.appendChild(s('path', { d, class: `line s${i}`, 'data-key': line.key }));
  });
  const legend = h(
    'ul',
    { class: 'legend' },
    lines.map((line, i) => {
      const vals = line.values.filter((v) => v !== null && v !== undefined);
      const last = vals.length ? vals[vals.length - 1] : null;
      const max = vals.length ? Math.max(...vals) : null;
      return h(
        'li',
        { dataset: { key: line.key, last: last ?? '', max: max ?? '' } },
        h('span', { class: `swatch s${i}` }),
        `${line.label} `,
        h('strong', {}, fmt(last, line.unit || unit)),
        h('span', { class: 'muted' }, ` max ${fmt(max, line.unit || unit)}`),
      );
    }),
  );
  return h('figure', { class: 'chart-box', id }, h('figcaption', {}, title), svg, legend);
}
