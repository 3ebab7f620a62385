// The proxy's pages (HTTP proxy and PostgreSQL sidecar alike): resources
// with their epochs, the rejection log, live charts. Actions: raise an
// epoch, clear an indeterminate resource.

import { h, fill, table, duration, num, badge, link, confirmAction, freshness } from './ui.js';
import { lineChart } from './charts.js';

export const home = 'resources';

export function label(session) {
  const fe = session.front_end === 'postgres' ? 'PostgreSQL sidecar' : 'HTTP proxy';
  return `${fe} · ${session.listen} → ${session.upstream}`;
}

export function who(session) {
  return session.auth || 'admin port';
}

function quarantine(ind, fetchedAt) {
  if (!ind) return badge('determinate', 'ok');
  const parts = [badge('indeterminate', 'bad'), ' ', h('span', { class: 'muted' }, `since ${ind.since}: ${ind.reason}`)];
  if (ind.open_connections > 0) {
    parts.push(h('div', {}, `${ind.open_connections} upstream connection(s) still open; the quarantine starts once they close`));
  } else if (ind.quarantine_remaining_secs !== null && ind.quarantine_remaining_secs !== undefined) {
    parts.push(
      h(
        'div',
        {},
        'quarantine ends in ',
        h('span', { class: 'countdown', dataset: { remaining: ind.quarantine_remaining_secs * 1000, fetched: fetchedAt } }, duration(ind.quarantine_remaining_secs * 1000)),
      ),
    );
  }
  return h('div', { class: 'indeterminate' }, parts);
}

function tickCountdowns(root) {
  const now = performance.now();
  for (const el of root.querySelectorAll('.countdown')) {
    el.textContent = duration(Number(el.dataset.remaining) - (now - Number(el.dataset.fetched)));
  }
}

function actions(ctx, r, after) {
  const raise = h(
    'button',
    {
      type: 'button',
      class: 'small',
      dataset: { action: 'raise-epoch', resource: r.resource },
      onclick: async () => {
        const done = await confirmAction({
          title: `Raise the epoch of ${r.resource}?`,
          text: `Its epoch is ${r.epoch}. Every write with a lower token is refused from then on, for good: the epoch never goes down (P8). The proxy waits for writes in flight first. Recorded in the proxy's audit log, like POST /v1/raise-epoch.`,
          ok: 'Raise the epoch',
          fields: [
            { name: 'epoch', label: 'New epoch', type: 'number', value: String(r.epoch + 1), min: String(r.epoch) },
            { name: 'reason', label: 'Reason', value: '' },
          ],
          run: (v) => ctx.api('raise-epoch', { resource: r.resource, epoch: Number(v.epoch), reason: v.reason }),
        });
        if (done) after();
      },
    },
    'Raise epoch',
  );
  const clear = r.indeterminate
    ? h(
        'button',
        {
          type: 'button',
          class: 'danger small',
          dataset: { action: 'clear-indeterminate', resource: r.resource },
          onclick: async () => {
            const done = await confirmAction({
              title: `Clear ${r.resource}?`,
              text: 'A write whose outcome is unknown may still land upstream. Clear only when you know it will not (P4): higher tokens are then admitted at once. Recorded in the proxy\'s audit log, like POST /v1/clear-indeterminate.',
              ok: 'Clear indeterminate',
              fields: [{ name: 'reason', label: 'Reason', value: '' }],
              run: (v) => ctx.api('clear-indeterminate', { resource: r.resource, reason: v.reason }),
            });
            if (done) after();
          },
        },
        'Clear indeterminate',
      )
    : null;
  return h('div', { class: 'buttons' }, raise, clear);
}

async function resources(el, ctx, { params }) {
  const prefix = params.get('prefix') || '';
  const after = params.get('after') || '';
  const input = h('input', { id: 'prefix', type: 'search', value: prefix, placeholder: 'influx/' });
  const form = h(
    'form',
    {
      class: 'filters',
      onsubmit: (ev) => {
        ev.preventDefault();
        ctx.go(`#/resources?${new URLSearchParams({ prefix: input.value.trim() })}`);
      },
    },
    h('label', {}, 'Prefix ', input),
    h('button', { type: 'submit' }, 'Search'),
  );
  const body = h('div');
  fill(el, h('h1', {}, 'Resources'), form, body);
  let refresh;
  refresh = async () => {
    const page = await ctx.api(`resources?${new URLSearchParams({ prefix, after, limit: '100' })}`);
    const fetched = performance.now();
    fill(
      body,
      h('p', { class: 'muted' }, `floor ${num(page.floor)}: the epoch of every resource this proxy has not seen a write for (P10).`),
      table(
        [
          { label: 'resource', cell: (r) => h('code', {}, r.resource) },
          { label: 'epoch', cell: (r) => h('span', { class: 'token' }, String(r.epoch)), class: 'num' },
          { label: 'in flight', cell: (r) => num(r.in_flight), class: 'num' },
          { label: 'higher tokens waiting', cell: (r) => num(r.waiting), class: 'num' },
          { label: 'state', cell: (r) => quarantine(r.indeterminate, fetched) },
          { label: '', cell: (r) => (ctx.session.actions ? actions(ctx, r, refresh) : null) },
        ],
        page.resources.map((r) => ({ ...r, __attrs: { dataset: { resource: r.resource } } })),
        'no resource written through this proxy yet',
        { id: 'resources' },
      ),
      page.next_after ? h('div', { class: 'pager' }, link(`#/resources?${new URLSearchParams({ prefix, after: page.next_after })}`, 'next page →')) : null,
      freshness(page.now_unix_ms),
    );
  };
  ctx.every(1000, refresh);
  ctx.tick(250, () => tickCountdowns(body));
}

async function rejections(el, ctx, { params }) {
  const f = {
    resource: h('input', { id: 'rej-resource', type: 'search', value: params.get('resource') || '' }),
    reason: h(
      'select',
      { id: 'rej-reason' },
      ['', ...ctx.session.reasons].map((r) => h('option', { value: r, selected: r === (params.get('reason') || '') }, r || 'any')),
    ),
    caller: h('input', { id: 'rej-caller', type: 'search', value: params.get('caller') || '' }),
  };
  const form = h(
    'form',
    {
      class: 'filters',
      id: 'rejection-filters',
      onsubmit: (ev) => {
        ev.preventDefault();
        const q = new URLSearchParams();
        for (const [k, i] of Object.entries(f)) if (i.value.trim()) q.set(k, i.value.trim());
        ctx.go(`#/rejections?${q}`);
      },
    },
    h('label', {}, 'Resource ', f.resource),
    h('label', {}, 'Reason ', f.reason),
    h('label', {}, 'Caller ', f.caller),
    h('button', { type: 'submit' }, 'Filter'),
  );
  const body = h('div');
  fill(el, h('h1', {}, 'Rejection log'), form, body);
  const pg = ctx.session.front_end === 'postgres';
  ctx.every(1000, async () => {
    const q = new URLSearchParams(params);
    q.set('limit', '100');
    const page = await ctx.api(`rejections?${q}`);
    fill(
      body,
      h('p', { class: 'muted' }, `newest first, live; the proxy keeps the newest ${num(page.table_max)} (all of them in rejections.jsonl).`),
      table(
        [
          { label: 'time', cell: (r) => r.time },
          { label: 'seq', cell: (r) => String(r.seq), class: 'num' },
          { label: 'resource', cell: (r) => r.resource || '' },
          { label: 'reason', cell: (r) => badge(r.reason, 'bad') },
          { label: 'token', cell: (r) => (r.presented_token === null || r.presented_token === undefined ? '' : String(r.presented_token)), class: 'num' },
          { label: 'epoch', cell: (r) => (r.current_epoch === null || r.current_epoch === undefined ? '' : String(r.current_epoch)), class: 'num' },
          { label: pg ? 'SQLSTATE' : 'status', cell: (r) => (pg && r.sqlstate ? r.sqlstate : String(r.status)) },
          { label: 'caller', cell: (r) => r.caller },
          { label: pg ? 'statement' : 'route', cell: (r) => [r.method, ' ', r.route || ''] },
          { label: 'request id', cell: (r) => h('code', {}, r.request_id) },
        ],
        page.rejections.map((r) => ({ ...r, __attrs: { dataset: { reason: r.reason, resource: r.resource || '' } } })),
        'no rejection matches',
        { id: 'rejections' },
      ),
      page.scan_complete ? null : h('p', { class: 'muted' }, `searched the newest ${num(page.scanned)} records; narrow the filters or use fencer rejections --before for older ones.`),
    );
  });
}

async function charts(el, ctx) {
  const body = h('div');
  fill(el, h('h1', {}, 'Live charts'), h('p', { class: 'muted' }, "Sampled every second from this proxy's own counters. Last 15 minutes; the history starts when the proxy starts."), body);
  ctx.every(2000, async () => {
    const r = await ctx.api('rates');
    const now = r.t.length ? r.t[r.t.length - 1] : Date.now();
    fill(
      body,
      lineChart({
        id: 'chart-traffic',
        title: 'Requests per second',
        t: r.t,
        now,
        windowMs: 15 * 60 * 1000,
        unit: '/s',
        lines: [
          { key: 'accepted', label: 'accepted', values: r.values.accepted },
          { key: 'rejected', label: 'rejected', values: r.values.rejected },
        ],
      }),
    );
  });
}

export const pages = {
  resources: { title: 'Resources', nav: true, mount: resources },
  rejections: { title: 'Rejections', nav: true, mount: rejections },
  charts: { title: 'Charts', nav: true, mount: charts },
};
