// The fencer console: the shell every page runs in. It asks the server what
// it is (/ui/api/session), shows that server's pages (coordinator.js or
// proxy.js), and is the one place requests are made: same origin only,
// the bearer token from this tab's session storage, the page token on
// every action.

import { h, fill } from './ui.js';
import * as coordinator from './coordinator.js';
import * as proxy from './proxy.js';

const TOKEN_KEY = 'fencer.bearer';
const pageToken = document.querySelector('meta[name="fencer-page-token"]').content;

/** A refusal from the server, with its reason (PERMISSION_DENIED, …). */
export class ApiError extends Error {
  constructor(status, reason, message) {
    super(message);
    this.status = status;
    this.reason = reason;
  }
}

/** One request to the console's own server. `body` makes it a POST action. */
async function api(path, body) {
  const headers = { accept: 'application/json' };
  const bearer = sessionStorage.getItem(TOKEN_KEY);
  if (bearer) headers.authorization = `Bearer ${bearer}`;
  const init = { headers, credentials: 'same-origin', cache: 'no-store' };
  if (body !== undefined) {
    init.method = 'POST';
    headers['content-type'] = 'application/json';
    headers['x-fencer-page-token'] = pageToken;
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(`/ui/api/${path}`, init);
  } catch (e) {
    throw new ApiError(0, 'UNREACHABLE', `the server did not answer (${e.message})`);
  }
  const text = await resp.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!resp.ok) {
    const err = (json && json.error) || {};
    throw new ApiError(resp.status, err.reason || `HTTP_${resp.status}`, err.message || text || resp.statusText);
  }
  return json;
}

const main = document.getElementById('main');
const banner = document.getElementById('banner');
let session = null;
let kind = null;
let current = null; // { timers: [], stopped }

function showBanner(text, level) {
  if (!text) {
    banner.hidden = true;
    return;
  }
  banner.className = `banner ${level || 'error'}`;
  fill(banner, text);
  banner.hidden = false;
}

/** What every page gets: the session, requests, repeating tasks, navigation. */
function context() {
  const page = { timers: [], stopped: false };
  current = page;
  return {
    session,
    api,
    /** Runs `fn` now and every `ms` until the page is left; errors go to the banner. */
    every(ms, fn) {
      let busy = false;
      const tick = async () => {
        if (page.stopped || busy) return;
        busy = true;
        try {
          await fn();
          if (!page.stopped) showBanner(null);
        } catch (e) {
          if (!page.stopped) showBanner(describe(e));
        } finally {
          busy = false;
        }
      };
      tick();
      page.timers.push(setInterval(tick, ms));
    },
    /** Runs `fn` every `ms` without requests (countdowns). */
    tick(ms, fn) {
      page.timers.push(setInterval(() => page.stopped || fn(), ms));
    },
    go(hash) {
      window.location.hash = hash;
    },
    error: (e) => showBanner(describe(e)),
  };
}

function describe(e) {
  if (e instanceof ApiError) {
    if (e.reason === 'UNAUTHENTICATED') return `${e.message} — enter a bearer token (button at the top right).`;
    return `${e.reason}: ${e.message}`;
  }
  return String(e && e.message ? e.message : e);
}

function stopPage() {
  if (!current) return;
  current.stopped = true;
  current.timers.forEach(clearInterval);
  current = null;
}

function parseHash() {
  const raw = window.location.hash.replace(/^#\/?/, '');
  const [path, query] = raw.split('?');
  return { path: decodeURIComponent(path || ''), params: new URLSearchParams(query || '') };
}

async function route() {
  stopPage();
  if (!kind) return;
  const { path, params } = parseHash();
  const pages = kind.pages;
  let name = path.split('/')[0] || kind.home;
  let rest = path.slice(name.length + 1);
  if (!pages[name]) {
    name = kind.home;
    rest = '';
  }
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', a.dataset.page === name);
  }
  document.title = `${pages[name].title} · fencer console`;
  const ctx = context();
  fill(main, h('p', { class: 'muted' }, 'Loading…'));
  try {
    await pages[name].mount(main, ctx, { rest, params });
  } catch (e) {
    ctx.error(e);
  }
}

function renderChrome() {
  fill(document.getElementById('server'), kind.label(session));
  fill(
    document.getElementById('nav'),
    Object.entries(kind.pages)
      .filter(([, p]) => p.nav)
      .map(([name, p]) => h('a', { href: `#/${name}`, dataset: { page: name } }, p.title)),
  );
  // A proxy whose admin API has no token needs no sign-in.
  document.getElementById('auth-button').hidden = session.kind === 'proxy' && !session.auth_required;
  const who = document.getElementById('who');
  fill(who, kind.who(session));
  fill(document.getElementById('footer'), `fencer ${session.version} · ${session.kind} · page token held in this page only`);
}

async function start() {
  try {
    session = await api('session');
  } catch (e) {
    kind = null;
    fill(document.getElementById('nav'));
    fill(main, h('section', { class: 'card' }, h('h1', {}, 'Sign in'), h('p', {}, describe(e))));
    if (e instanceof ApiError && e.status === 401) openAuth();
    return;
  }
  kind = session.kind === 'proxy' ? proxy : coordinator;
  renderChrome();
  await route();
}

// The bearer token dialog.
const authDialog = document.getElementById('auth-dialog');
function openAuth() {
  document.getElementById('auth-token').value = '';
  authDialog.showModal();
  document.getElementById('auth-token').focus();
}
document.getElementById('auth-button').addEventListener('click', openAuth);
document.getElementById('auth-cancel').addEventListener('click', () => authDialog.close());
document.getElementById('auth-forget').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  authDialog.close();
  start();
});
document.getElementById('auth-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const token = document.getElementById('auth-token').value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  authDialog.close();
  start();
});

window.addEventListener('hashchange', route);
start();
