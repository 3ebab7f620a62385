// The coordinator's pages: cluster, locks, one lock, hot resources, the
// audit trail and the live charts. Lock data is this node's applied state;
// remaining lease time is known on the leader only (it keeps lease time).

import { h, fill, table, facts, duration, clock, num, badge, link, confirmAction, freshness } from './ui.js';
import { lineChart } from './charts.js';

export const home = 'cluster';

export function label(session) {
  return `coordinator · node ${session.node_id}${session.actions ? '' : ' · status port (read only)'}`;
}

export function who(session) {
  const c = session.caller;
  const cert = session.auth.client_certificate ? `certificate ${session.auth.client_certificate}` : null;
  if (!session.auth.tenants) return cert || 'no authentication';
  return [`tenant ${c.tenant}`, c.cluster_admin ? ' · cluster admin' : '', cert ? ` · ${cert}` : ''];
}

function lockLink(resource) {
  return link(`#/lock/${encodeURIComponent(resource)}`, resource);
}

/** Remaining ttl, counted down in the page between refreshes. */
function countdown(remaining, fetchedAt) {
  if (remaining === null || remaining === undefined) {
    return h('span', { class: 'muted', title: 'only the leader keeps lease time' }, 'on the leader');
  }
  return h('span', { class: 'countdown', dataset: { remaining, fetched: fetchedAt } }, duration(remaining));
}

function tickCountdowns(root) {
  const now = performance.now();
  for (const el of root.querySelectorAll('.countdown')) {
    const left = Number(el.dataset.remaining) - (now - Number(el.dataset.fetched));
    el.textContent = duration(left);
    el.classList.toggle('low', left < 5000);
  }
}

function waitersList(waiters, total) {
  if (!total) return h('span', { class: 'muted' }, 'none');
  return h(
    'ol',
    { class: 'waiters' },
    waiters.map((w) =>
      h(
        'li',
        { dataset: { holder: w.holder } },
        h('span', { class: 'holder' }, w.holder),
        ' ',
        h('span', { class: 'muted' }, `waiting ${duration(w.waited_ms)}`),
      ),
    ),
    total > waiters.length ? h('li', { class: 'muted more' }, `… ${total - waiters.length} more`) : null,
  );
}

/** The force-release button, when this caller may and this port serves actions. */
function forceReleaseButton(ctx, lock, after) {
  if (!ctx.session.actions || !lock.may_force_release || !lock.held) return null;
  return h(
    'button',
    {
      type: 'button',
      class: 'danger small',
      dataset: { action: 'force-release', resource: lock.resource },
      onclick: async () => {
        const done = await confirmAction({
          title: `Force-release ${lock.resource}?`,
          text: `${lock.holder} holds it with token ${lock.fencing_token}. It loses the lock at once; the next waiter, if any, is granted it with a larger token. Recorded in the audit log with your name and reason, like fencer force-release.`,
          ok: 'Force-release',
          fields: [
            { name: 'caller', label: 'Your name', value: sessionStorage.getItem('fencer.caller') || '' },
            { name: 'reason', label: 'Reason', value: '' },
          ],
          run: (v) => ctx.api('force-release', { resource: lock.resource, caller: v.caller, reason: v.reason }),
        });
        if (done) {
          sessionStorage.setItem('fencer.caller', done.values.caller);
          after();
        }
      },
    },
    'Force-release',
  );
}

async function cluster(el, ctx) {
  const body = h('div');
  fill(el, h('h1', {}, 'Cluster'), body);
  ctx.every(2000, async () => {
    const s = await ctx.api('status');
    const leader = s.leader_id ? `${s.leader_id} (${s.leader_addr || '?'})` : 'none known';
    fill(
      body,
      h(
        'section',
        { class: 'card', id: 'cluster-facts' },
        facts([
          ['cluster', s.cluster_id || '(looking for its cluster)'],
          ['this node', `${s.node_id} · ${s.state}`],
          ['leader', leader],
          ['term', num(s.term)],
          ['last / commit / applied index', `${num(s.last_log_index)} / ${num(s.commit_index)} / ${num(s.applied_index)}`],
          ['snapshot / purged index', `${num(s.snapshot_index)} / ${num(s.purged_index)}`],
          ['locks held / waiters', `${num(s.locks_held)} / ${num(s.waiters)}`],
          ['live', s.live ? badge('live', 'ok') : badge(`not live: ${s.live_reason}`, 'bad')],
          ['ready', s.ready ? badge('ready', 'ok') : badge(`not ready: ${s.ready_reason}`, 'bad'), { id: 'ready' }],
          [
            'quorum acknowledged',
            s.millis_since_quorum_ack === null || s.millis_since_quorum_ack === undefined
              ? '—'
              : `${duration(s.millis_since_quorum_ack)} ago`,
          ],
          ['version', s.version],
        ]),
      ),
      h('h2', {}, 'Members'),
      table(
        [
          { label: 'node', cell: (m) => String(m.id), class: 'num' },
          { label: 'address', cell: (m) => m.addr },
          { label: 'role', cell: (m) => m.role },
          { label: 'leader', cell: (m) => (m.id === s.leader_id ? badge('leader', 'ok') : '') },
          { label: 'health', cell: (m) => badge(m.health, m.health === 'ok' || m.health === 'self' ? 'ok' : 'bad') },
          { label: 'matched index', cell: (m) => num(m.matched_index), class: 'num' },
          { label: 'last ack', cell: (m) => (m.last_ack_ms < 0 ? '—' : `${duration(m.last_ack_ms)} ago`), class: 'num' },
        ],
        s.members,
        'no members known',
        { id: 'members' },
      ),
      freshness(s.now_unix_ms),
    );
  });
}

async function locks(el, ctx, { params }) {
  const prefix = params.get('prefix') || '';
  const pageSize = params.get('page_size') || '50';
  const pageToken = params.get('page_token') || '';
  let back = [];
  try {
    back = JSON.parse(params.get('back') || '[]').map(String);
  } catch {
    back = [];
  }
  const input = h('input', { name: 'prefix', type: 'search', value: prefix, placeholder: 'orders/', id: 'prefix' });
  const size = h(
    'select',
    { name: 'page_size', id: 'page-size' },
    ['20', '50', '100', '500'].map((n) => h('option', { value: n, selected: n === pageSize }, n)),
  );
  const form = h(
    'form',
    {
      class: 'filters',
      id: 'locks-search',
      onsubmit: (ev) => {
        ev.preventDefault();
        const q = new URLSearchParams({ prefix: input.value.trim(), page_size: size.value });
        ctx.go(`#/locks?${q}`);
      },
    },
    h('label', {}, 'Prefix ', input),
    h('label', {}, 'Per page ', size),
    h('button', { type: 'submit' }, 'Search'),
  );
  const body = h('div');
  fill(el, h('h1', {}, 'Locks'), form, body);
  let refresh;
  refresh = async () => {
    const q = new URLSearchParams({ prefix, page_size: pageSize, page_token: pageToken });
    const page = await ctx.api(`locks?${q}`);
    const fetched = performance.now();
    // Earlier pages' tokens travel in the address, so "previous" works too.
    const pageAt = (token, trail) =>
      `#/locks?${new URLSearchParams({ prefix, page_size: pageSize, page_token: token, back: JSON.stringify(trail) })}`;
    const pager = h(
      'div',
      { class: 'pager' },
      pageToken ? link(pageAt(back[back.length - 1] || '', back.slice(0, -1)), '← previous page') : null,
      page.next_page_token ? link(pageAt(page.next_page_token, [...back, pageToken]), 'next page →') : null,
    );
    fill(
      body,
      table(
        [
          { label: 'resource', cell: (l) => lockLink(l.resource) },
          { label: 'holder', cell: (l) => (l.held ? l.holder : h('span', { class: 'muted' }, 'free')) },
          { label: 'token', cell: (l) => (l.held ? h('span', { class: 'token' }, String(l.fencing_token)) : '—'), class: 'num' },
          { label: 'remaining', cell: (l) => (l.held ? countdown(l.remaining_ttl_ms, fetched) : '—'), class: 'num' },
          { label: 'ttl', cell: (l) => (l.held ? duration(l.ttl_ms) : '—'), class: 'num' },
          { label: 'waiters (FIFO)', cell: (l) => waitersList(l.waiters, l.waiters_total) },
          { label: '', cell: (l) => forceReleaseButton(ctx, l, refresh) },
        ],
        page.locks.map((l) => ({ ...l, __attrs: { dataset: { resource: l.resource } } })),
        prefix ? `no lock under ${prefix} that you may read` : 'no lock held that you may read',
        { id: 'locks' },
      ),
      pager,
      freshness(page.now_unix_ms),
    );
  };
  ctx.every(1000, refresh);
  ctx.tick(200, () => tickCountdowns(body));
}

async function lockDetail(el, ctx, { rest }) {
  const resource = rest;
  const body = h('div');
  fill(el, h('h1', {}, 'Lock ', h('code', {}, resource)), body);
  let refresh;
  refresh = async () => {
    const d = await ctx.api(`lock?${new URLSearchParams({ resource })}`);
    const fetched = performance.now();
    const l = d.lock;
    fill(
      body,
      h(
        'section',
        { class: 'card', id: 'lease' },
        h('h2', {}, 'Current lease'),
        l.held
          ? facts([
              ['holder', l.holder, { id: 'lease-holder' }],
              ['fencing token', h('span', { class: 'token' }, String(l.fencing_token)), { id: 'lease-token' }],
              ['remaining', countdown(l.remaining_ttl_ms, fetched)],
              ['ttl', duration(l.ttl_ms)],
              ['granted', clock(l.granted_at_unix_ms)],
              ['lease id', `${l.lease_id_prefix}…`],
              ['request id', l.request_id],
            ])
          : h('p', { class: 'muted' }, 'free: nobody holds it'),
        h('div', { class: 'buttons' }, forceReleaseButton(ctx, l, refresh)),
      ),
      h('h2', {}, `Queue (${l.waiters_total})`),
      table(
        [
          { label: '#', cell: (w) => String(w.position), class: 'num' },
          { label: 'holder', cell: (w) => w.holder },
          { label: 'waiting for', cell: (w) => duration(w.waited_ms), class: 'num' },
          { label: 'queued at', cell: (w) => clock(w.queued_at_unix_ms) },
          { label: 'ttl once granted', cell: (w) => duration(w.ttl_ms), class: 'num' },
        ],
        l.waiters,
        'nobody waits',
        { id: 'queue' },
      ),
      h('h2', {}, 'Recent audit lines'),
      auditTable(d.audit.lines, 'no audit line for it in the newest part of the audit log', 'lock-audit'),
      freshness(d.now_unix_ms),
    );
  };
  ctx.every(1000, refresh);
  ctx.tick(200, () => tickCountdowns(body));
}

function auditTable(lines, empty, id) {
  return table(
    [
      { label: 'time', cell: (a) => a.time },
      { label: 'index', cell: (a) => `${a.log_index}.${a.part}`, class: 'num' },
      { label: 'op', cell: (a) => a.op },
      { label: 'outcome', cell: (a) => a.outcome },
      { label: 'resource', cell: (a) => (a.resource ? lockLink(a.resource) : '') },
      { label: 'holder', cell: (a) => a.holder || '' },
      { label: 'token', cell: (a) => (a.token === undefined || a.token === null ? '' : String(a.token)), class: 'num' },
      { label: 'lease', cell: (a) => (a.lease_id ? `${a.lease_id}…` : '') },
      {
        label: 'details',
        cell: (a) =>
          [
            a.queue_position ? `queue #${a.queue_position}` : '',
            a.held_ms !== undefined && a.held_ms !== null ? `held ${duration(a.held_ms)}` : '',
            a.caller ? `by ${a.caller}` : '',
            a.reason ? `“${a.reason}”` : '',
            a.voters ? `voters ${a.voters.join(',')}` : '',
            a.key_id ? `key ${a.key_id}` : '',
          ]
            .filter(Boolean)
            .join(' · '),
      },
    ],
    lines.map((a) => ({ ...a, __attrs: { dataset: { op: a.op, resource: a.resource || '' } } })),
    empty,
    { id },
  );
}

async function hot(el, ctx, { params }) {
  const by = params.get('by') || 'acquires';
  const select = h(
    'select',
    { id: 'hot-by', onchange: () => ctx.go(`#/hot?by=${select.value}`) },
    ['acquires', 'waiters', 'hold'].map((b) => h('option', { value: b, selected: b === by }, b)),
  );
  const body = h('div');
  fill(el, h('h1', {}, 'Hot resources'), h('div', { class: 'filters' }, h('label', {}, 'Order by ', select)), body);
  ctx.every(2000, async () => {
    const r = await ctx.api(`hot?${new URLSearchParams({ by, limit: '50' })}`);
    fill(
      body,
      h(
        'p',
        { class: 'muted' },
        `node ${r.node_id} tracks ${r.tracked} of ${r.capacity} resources; rates decay with a ${r.half_life_secs}s half-life; only resources you may read are listed.`,
      ),
      table(
        [
          { label: 'resource', cell: (x) => lockLink(x.resource) },
          { label: 'acquires/s', cell: (x) => x.acquires_per_sec.toFixed(2), class: 'num' },
          { label: '±', cell: (x) => x.error_per_sec.toFixed(2), class: 'num' },
          { label: 'waiters', cell: (x) => String(x.waiters), class: 'num' },
          { label: 'holder', cell: (x) => x.holder || '' },
          { label: 'token', cell: (x) => (x.token ? String(x.token) : ''), class: 'num' },
          { label: 'held for', cell: (x) => (x.held_for_secs ? duration(x.held_for_secs * 1000) : ''), class: 'num' },
          { label: 'mean hold', cell: (x) => (x.mean_hold_secs ? duration(x.mean_hold_secs * 1000) : ''), class: 'num' },
        ],
        r.resources,
        'nothing tracked yet',
        { id: 'hot' },
      ),
    );
  });
}

const OPS = ['', 'acquire', 'renew', 'release', 'expire', 'force_release', 'promote', 'cancel_wait', 'membership', 'snapshot_installed', 'signing_key_register', 'signing_key_retire'];

function toLocalInput(ms) {
  if (!ms) return '';
  const d = new Date(Number(ms));
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

async function audit(el, ctx, { params }) {
  const fields = {
    resource: h('input', { id: 'audit-resource', type: 'search', value: params.get('resource') || '', placeholder: 'orders/42' }),
    prefix: h('input', { id: 'audit-prefix', type: 'search', value: params.get('prefix') || '', placeholder: 'orders/' }),
    holder: h('input', { id: 'audit-holder', type: 'search', value: params.get('holder') || '' }),
    op: h('select', { id: 'audit-op' }, OPS.map((o) => h('option', { value: o, selected: o === (params.get('op') || '') }, o || 'any'))),
    since: h('input', { id: 'audit-since', type: 'datetime-local', value: toLocalInput(params.get('since_unix_ms')) }),
    until: h('input', { id: 'audit-until', type: 'datetime-local', value: toLocalInput(params.get('until_unix_ms')) }),
  };
  const form = h(
    'form',
    {
      class: 'filters',
      id: 'audit-filters',
      onsubmit: (ev) => {
        ev.preventDefault();
        const q = new URLSearchParams();
        for (const k of ['resource', 'prefix', 'holder', 'op']) if (fields[k].value.trim()) q.set(k, fields[k].value.trim());
        if (fields.since.value) q.set('since_unix_ms', String(new Date(fields.since.value).getTime()));
        if (fields.until.value) q.set('until_unix_ms', String(new Date(fields.until.value).getTime()));
        ctx.go(`#/audit?${q}`);
      },
    },
    h('label', {}, 'Resource ', fields.resource),
    h('label', {}, 'Prefix ', fields.prefix),
    h('label', {}, 'Holder ', fields.holder),
    h('label', {}, 'Operation ', fields.op),
    h('label', {}, 'Since ', fields.since),
    h('label', {}, 'Until ', fields.until),
    h('button', { type: 'submit' }, 'Filter'),
  );
  const body = h('div');
  fill(el, h('h1', {}, 'Audit trail'), form, body);
  const q = new URLSearchParams(params);
  q.set('limit', '200');
  ctx.every(5000, async () => {
    const r = await ctx.api(`audit?${q}`);
    if (!r.enabled) {
      fill(body, h('p', { class: 'muted' }, 'This node writes no audit log.'));
      return;
    }
    fill(
      body,
      h(
        'p',
        { class: 'muted' },
        `newest ${r.lines.length} matching lines of this node's audit log (searched the newest ${num(Math.round(r.scanned_bytes / 1024))} KiB${r.complete ? ', the whole log' : `, at most ${num(r.scan_limit_bytes / 1048576)} MiB per search: fencer audit reads the rest`}); lease ids are shortened.`,
      ),
      auditTable(r.lines, 'no matching line', 'audit'),
    );
  });
}

async function charts(el, ctx) {
  const body = h('div');
  fill(
    el,
    h('h1', {}, 'Live charts'),
    h('p', { class: 'muted' }, "Sampled every second from this node's own counters and histograms (the node that answers the calls: the leader). Last 15 minutes; the history starts when the node starts."),
    body,
  );
  ctx.every(2000, async () => {
    const r = await ctx.api('rates');
    const now = r.t.length ? r.t[r.t.length - 1] : Date.now();
    const w = 15 * 60 * 1000;
    fill(
      body,
      lineChart({
        id: 'chart-rates',
        title: 'Lock operations per second',
        t: r.t,
        now,
        windowMs: w,
        unit: '/s',
        lines: [
          { key: 'grants', label: 'grants', values: r.values.grants },
          { key: 'renewals', label: 'renewals', values: r.values.renewals },
          { key: 'releases', label: 'releases', values: r.values.releases },
          { key: 'expirations', label: 'expirations', values: r.values.expirations },
        ],
      }),
      lineChart({
        id: 'chart-latency',
        title: 'Acquire latency (no wait), per second',
        t: r.t,
        now,
        windowMs: w,
        unit: 'ms',
        lines: [
          { key: 'acquire_p50_ms', label: 'p50', values: r.values.acquire_p50_ms },
          { key: 'acquire_p99_ms', label: 'p99', values: r.values.acquire_p99_ms },
        ],
      }),
    );
  });
}

export const pages = {
  cluster: { title: 'Cluster', nav: true, mount: cluster },
  locks: { title: 'Locks', nav: true, mount: locks },
  lock: { title: 'Lock', nav: false, mount: lockDetail },
  hot: { title: 'Hot', nav: true, mount: hot },
  audit: { title: 'Audit', nav: true, mount: audit },
  charts: { title: 'Charts', nav: true, mount: charts },
};
