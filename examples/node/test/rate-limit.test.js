// The recipe's HTTP behaviour against a real valkey-server with the module
// (started by test.sh; see examples/README.md), over real HTTP on a free port.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import Valkey from 'iovalkey';
import { createApp, waitReady } from '../app.js';
import {
  DEFAULTS, clientIp, configFromEnv, createClient, rateHeaders, retryAfterSeconds, trustedList,
} from '../rate-limit.js';

const ADDR = process.env.RL_TEST_VALKEY_ADDR;
if (!ADDR) {
  console.error('RL_TEST_VALKEY_ADDR is not set: run ./test.sh, which starts valkey-server with the module');
  process.exit(2);
}
const KEY = { 'X-API-Key': 'key-a' };
// The failure tests' timeout, and the bound on every answer while Valkey
// fails: 2 * timeout at most; the margin is for a loaded machine.
const TIMEOUT_MS = 50;
const BOUND_MS = 2 * TIMEOUT_MS + 150;

let store; // a plain client for looking at keys from the tests
before(async () => {
  const [host, port] = ADDR.split(':');
  store = new Valkey({ host, port: Number(port) });
});
after(() => store.disconnect());

/**
 * A fresh app on a free loopback port with its own key prefix (so one server
 * serves the whole run). The limits start from a slow refill (burst 5, 5 per
 * 60 s: one token per 12 s), so no token comes back however loaded the machine.
 * The timeout is generous here (a loaded machine must not turn a slow answer
 * into a failure); the failure tests use the real 50 ms.
 */
async function startApp(t, overrides = {}) {
  const warnings = [];
  const config = {
    ...DEFAULTS, valkeyAddr: ADDR, prefix: `rl:test:${randomBytes(6).toString('hex')}:api`,
    keyBurst: 5, keyRate: 5, keyPeriod: 60, ipLimit: 20, ipPeriod: 60, timeoutMs: 1000,
    logger: { warn: (m) => warnings.push(m) }, ...overrides,
  };
  const client = createClient(config);
  if (config.valkeyAddr === ADDR) assert.ok(await waitReady(client, 10_000), 'valkey not ready');
  const server = createApp(config, client).listen(0, '127.0.0.1');
  await once(server, 'listening');
  const base = `http://127.0.0.1:${server.address().port}`;
  t.after(() => {
    server.closeAllConnections();
    server.close();
    client.disconnect();
  });
  return { config, warnings, base, get: (headers = KEY, path = '/api/hello') => fetch(base + path, { headers }) };
}

test('allows exactly the burst', async (t) => {
  const app = await startApp(t);
  const statuses = [];
  for (let i = 0; i < 7; i++) statuses.push((await app.get()).status);
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429, 429]);
});

test('headers on 200', async (t) => {
  const app = await startApp(t);
  const r = await app.get();
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), { message: 'hello' });
  // burst 5 at 5 per 60 s: the GCRA's window is the 60 s it takes to earn 5 back
  assert.equal(r.headers.get('RateLimit-Policy'), '"key";q=5;w=60, "ip";q=20;w=60');
  // the key (4 left) is more restrictive than the IP (19 left); one token takes 12 s
  assert.equal(r.headers.get('RateLimit'), '"key";r=4;t=12');
  assert.equal(r.headers.get('X-RateLimit-Limit'), '5');
  assert.equal(r.headers.get('X-RateLimit-Remaining'), '4');
  assert.equal(r.headers.get('X-RateLimit-Reset'), '12');
  assert.equal(r.headers.get('Retry-After'), null);
});

test('headers on 429', async (t) => {
  const app = await startApp(t);
  const start = performance.now();
  for (let i = 0; i < 5; i++) assert.equal((await app.get()).status, 200);
  const r = await app.get();
  const slack = Math.ceil((performance.now() - start) / 1000); // the server's clock moved at most this much
  assert.equal(r.status, 429);
  assert.match(r.headers.get('Content-Type'), /^application\/json/);
  const retry = Number(r.headers.get('Retry-After'));
  assert.ok(retry >= 12 - slack && retry <= 12, `Retry-After ${retry}`); // the next token, 12 s after the first request
  assert.deepEqual(await r.json(), { error: 'rate limited', retry_after: retry });
  assert.equal(r.headers.get('RateLimit-Policy'), '"key";q=5;w=60, "ip";q=20;w=60');
  const m = /^"key";r=0;t=(\d+)$/.exec(r.headers.get('RateLimit'));
  assert.ok(m, r.headers.get('RateLimit'));
  const t60 = Number(m[1]);
  assert.ok(t60 >= 60 - slack && t60 <= 60, `t=${t60}`); // all 5 back 60 s after the first
  assert.equal(r.headers.get('X-RateLimit-Remaining'), '0');
  assert.equal(r.headers.get('X-RateLimit-Limit'), '5');
  assert.equal(r.headers.get('X-RateLimit-Reset'), m[1]);
});

test('the IP limit is shared across keys', async (t) => {
  const app = await startApp(t, { ipLimit: 3 });
  for (let i = 0; i < 3; i++) assert.equal((await app.get({ 'X-API-Key': `k${i}` })).status, 200);
  const r = await app.get({ 'X-API-Key': 'k3' });
  assert.equal(r.status, 429);
  assert.match(r.headers.get('RateLimit'), /^"ip";r=0;t=\d+$/);
  assert.equal(r.headers.get('X-RateLimit-Limit'), '3');
  assert.equal(r.headers.get('RateLimit-Policy'), '"key";q=5;w=60, "ip";q=3;w=60');
  // All or nothing: the IP denied it, so the key's limiter was not charged.
  assert.equal(await store.exists(`${app.config.prefix}:key:k3`), 0);
});

test('recovers after Retry-After', async (t) => {
  const app = await startApp(t, { keyBurst: 2, keyRate: 2, keyPeriod: 1 }); // one token every 500 ms
  let r;
  for (let i = 0; i < 20; i++) { // on a loaded machine a token may come back meanwhile: go on until denied
    r = await app.get();
    if (r.status === 429) break;
  }
  assert.equal(r.status, 429);
  const retry = Number(r.headers.get('Retry-After'));
  assert.equal(retry, 1); // 500 ms at most, rounded up
  await sleep(retry * 1000);
  assert.equal((await app.get()).status, 200);
});

test('a different API key is limited separately', async (t) => {
  const app = await startApp(t);
  for (let i = 0; i < 5; i++) assert.equal((await app.get()).status, 200);
  assert.equal((await app.get()).status, 429);
  const r = await app.get({ 'X-API-Key': 'key-b' });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('X-RateLimit-Remaining'), '4');
});

test('an API key longer than 256 bytes is 401', async (t) => {
  const app = await startApp(t);
  assert.equal((await app.get({ 'X-API-Key': 'k'.repeat(256) })).status, 200);
  const r = await app.get({ 'X-API-Key': 'k'.repeat(257) });
  assert.equal(r.status, 401);
  assert.deepEqual(await r.json(), { error: 'API key too long' });
  assert.equal(r.headers.get('RateLimit'), null);
  assert.equal(await store.exists(`${app.config.prefix}:key:${'k'.repeat(256)}`), 1);
  assert.equal(await store.exists(`${app.config.prefix}:key:${'k'.repeat(257)}`), 0);
});

test('a repeated X-API-Key header: the first is used', async (t) => {
  const app = await startApp(t);
  // fetch would join the two into one "k1, k2" line: node:http sends two lines.
  const res = await new Promise((resolve, reject) => {
    http.get(`${app.base}/api/hello`, { headers: { 'X-API-Key': ['k1', 'k2'] } }, resolve).on('error', reject);
  });
  res.resume();
  assert.equal(res.statusCode, 200);
  assert.equal(await store.exists(`${app.config.prefix}:key:k1`), 1);
  assert.deepEqual(await store.keys(`${app.config.prefix}:key:k1?*`), []); // not "k1, k2"
});

test('a missing API key is 401', async (t) => {
  const app = await startApp(t);
  for (const headers of [{}, { 'X-API-Key': '' }]) {
    const r = await app.get(headers);
    assert.equal(r.status, 401);
    assert.deepEqual(await r.json(), { error: 'missing API key' });
    assert.equal(r.headers.get('RateLimit'), null);
  }
});

test('X-Forwarded-For from an untrusted peer is ignored', async (t) => {
  const app = await startApp(t, { ipLimit: 2 }); // no trusted proxies: 127.0.0.1 is a client like any other
  let r;
  for (const [i, forged] of ['198.51.100.1', '198.51.100.2', '198.51.100.3'].entries()) {
    r = await app.get({ 'X-API-Key': `k${i}`, 'X-Forwarded-For': forged });
  }
  assert.equal(r.status, 429); // the three share the peer's IP limit
  assert.equal(await store.exists(`${app.config.prefix}:ip:127.0.0.1`), 1);
  assert.equal(await store.exists(`${app.config.prefix}:ip:198.51.100.1`), 0);
});

test('X-Forwarded-For from a trusted peer is used, right to left', async (t) => {
  const app = await startApp(t, { ipLimit: 2, trustedProxies: ['127.0.0.0/8'] });
  // The client wrote the left entry itself; our proxy appended the address it saw.
  const chain = { 'X-API-Key': 'k1', 'X-Forwarded-For': '198.51.100.9, 203.0.113.7' };
  assert.equal((await app.get(chain)).status, 200);
  assert.equal((await app.get(chain)).status, 200);
  assert.equal((await app.get(chain)).status, 429);
  assert.equal((await app.get({ 'X-API-Key': 'k1', 'X-Forwarded-For': '203.0.113.8' })).status, 200);
  const p = app.config.prefix;
  assert.equal(await store.exists(`${p}:ip:203.0.113.7`), 1);
  assert.equal(await store.exists(`${p}:ip:198.51.100.9`), 0);
  assert.equal(await store.exists(`${p}:ip:127.0.0.1`), 0);
});

test('client IP rules', () => {
  const trusted = trustedList(['10.0.0.0/8', '::1']);
  assert.equal(clientIp('192.0.2.1', '203.0.113.7', trusted), '192.0.2.1'); // untrusted peer
  assert.equal(clientIp('10.1.1.1', undefined, trusted), '10.1.1.1'); // trusted, no header
  assert.equal(clientIp('10.1.1.1', '203.0.113.7, 10.2.2.2', trusted), '203.0.113.7'); // skips our proxies
  assert.equal(clientIp('10.1.1.1', '10.3.3.3, 10.2.2.2', trusted), '10.3.3.3'); // all trusted: leftmost
  assert.equal(clientIp('10.1.1.1', '203.0.113.7, junk', trusted), '10.1.1.1'); // garbage stops the walk
  assert.equal(clientIp('::ffff:192.0.2.1', undefined, trusted), '192.0.2.1'); // IPv4-mapped
  assert.equal(clientIp('::1', '2001:DB8:0:0::1', trusted), '2001:db8::1'); // canonical IPv6
});

// ---- the header values of made-up replies (no server)

const POLICY = '"key";q=5;w=60, "ip";q=20;w=60';
const limiter = (name, allowed, limit, remaining, retryAfterMs, resetAfterMs) => ({
  name, allowed, limit, remaining, retryAfterMs, resetAfterMs,
});
/** A 429 decided by the key's limiter (0 left), the IP's with room. */
const denied = (retryAfterMs, resetAfterMs = 60_000) => ({
  allowed: false,
  retryAfterMs,
  limiters: [limiter('key', false, 5, 0, retryAfterMs, resetAfterMs), limiter('ip', true, 20, 10, 0, 30_000)],
});

test('Retry-After is rounded up', () => {
  for (const [ms, want] of [[1, '1'], [999, '1'], [1000, '1'], [1001, '2'], [11950, '12']]) {
    assert.equal(rateHeaders(denied(ms), POLICY)['Retry-After'], want, `${ms} ms`);
    assert.equal(String(retryAfterSeconds(denied(ms))), want, `${ms} ms: the 429 body's retry_after`);
  }
});

test('the reset (t, X-RateLimit-Reset) is rounded up', () => {
  for (const [ms, want] of [[0, '0'], [1, '1'], [1000, '1'], [59001, '60']]) {
    const h = rateHeaders(denied(1000, ms), POLICY);
    assert.equal(h.RateLimit, `"key";r=0;t=${want}`, `${ms} ms`);
    assert.equal(h['X-RateLimit-Reset'], want, `${ms} ms`);
  }
});

test('the headers of a decision', () => {
  const ok = { allowed: true, retryAfterMs: 0, limiters: [limiter('key', true, 5, 3, 0, 24_000), limiter('ip', true, 20, 3, 0, 59_001)] };
  assert.deepEqual(rateHeaders(ok, POLICY), { // tie on remaining and wait: the longer reset, the IP's, is reported
    'RateLimit-Policy': POLICY, RateLimit: '"ip";r=3;t=60', 'X-RateLimit-Limit': '20',
    'X-RateLimit-Remaining': '3', 'X-RateLimit-Reset': '60',
  });
  const never = {
    allowed: false, retryAfterMs: -1, limiters: [limiter('key', false, 5, 0, 5000, 60_000), limiter('ip', false, 20, 0, -1, 0)],
  };
  const h = rateHeaders(never, POLICY);
  assert.equal(h.RateLimit, '"ip";r=0;t=0'); // -1 (never) is the longest wait
  assert.equal(h['Retry-After'], undefined);
  assert.equal(retryAfterSeconds(never), null);
});

test('empty environment variables are unset', () => {
  const names = ['VALKEY_ADDR', 'RL_PREFIX', 'RL_KEY_BURST', 'RL_KEY_RATE', 'RL_KEY_PERIOD', 'RL_IP_LIMIT',
    'RL_IP_PERIOD', 'RL_TRUSTED_PROXIES', 'RL_FAILURE_MODE', 'RL_TIMEOUT_MS'];
  for (const blank of ['', '  ']) {
    const config = configFromEnv(Object.fromEntries(names.map((n) => [n, blank])));
    assert.deepEqual({ ...config, logger: null }, { ...DEFAULTS, logger: null });
  }
  assert.equal(configFromEnv({ RL_KEY_BURST: ' 7 ' }).keyBurst, 7);
});

// ---- failure policy

/** A loopback port nothing listens on. */
async function deadAddr() {
  const s = net.createServer().listen(0, '127.0.0.1');
  await once(s, 'listening');
  const { port } = s.address();
  await new Promise((resolve) => s.close(resolve));
  return { addr: `127.0.0.1:${port}`, close() {} };
}

/** A port that accepts connections and never answers: a Valkey that hangs. */
async function hungAddr() {
  const sockets = new Set();
  const s = net.createServer((sock) => sockets.add(sock)).listen(0, '127.0.0.1');
  await once(s, 'listening');
  return {
    addr: `127.0.0.1:${s.address().port}`,
    close() { for (const sock of sockets) sock.destroy(); s.close(); },
  };
}

/**
 * A server that answers the connection handshake (INFO, CLIENT ...) and then
 * never answers RL.ALL: a Valkey that stops responding mid-connection, where
 * only the command timeout helps.
 */
async function stalledAddr() {
  const sockets = new Set();
  const s = net.createServer((sock) => {
    sockets.add(sock);
    sock.on('data', (data) => {
      for (const cmd of data.toString('latin1').split(/(?=\*\d+\r\n\$)/)) {
        if (!cmd || /RL\.ALL/i.test(cmd)) continue;
        sock.write(/\r\nINFO\r\n/i.test(cmd) ? '$11\r\nloading:0\r\n\r\n' : '+OK\r\n');
      }
    });
  }).listen(0, '127.0.0.1');
  await once(s, 'listening');
  return {
    addr: `127.0.0.1:${s.address().port}`,
    close() { for (const sock of sockets) sock.destroy(); s.close(); },
  };
}

/**
 * A TCP proxy in front of the real Valkey, to play one that stalls. New
 * connections are forwarded to the real server (mode 'forward') or accepted
 * and never answered (mode 'hang'); blackhole() makes every connection open
 * so far stop forwarding, both ways, without closing it: a Valkey gone behind
 * a dead route, or a connection a failover left behind.
 */
async function proxy(target, mode = 'hang') {
  const [host, port] = target.split(':');
  const conns = [];
  const s = net.createServer((client) => {
    const conn = { socks: [client], live: true };
    conns.push(conn);
    client.on('error', () => {});
    if (p.mode !== 'forward') return;
    const upstream = net.connect(Number(port), host);
    upstream.on('error', () => {});
    conn.socks.push(upstream);
    client.on('data', (d) => { if (conn.live) upstream.write(d); }); // else swallowed: black-holed
    upstream.on('data', (d) => { if (conn.live) client.write(d); });
  }).listen(0, '127.0.0.1');
  await once(s, 'listening');
  const p = {
    mode,
    addr: `127.0.0.1:${s.address().port}`,
    blackhole() { for (const conn of conns) conn.live = false; },
    close() { for (const conn of conns) for (const sock of conn.socks) sock.destroy(); s.close(); },
  };
  return p;
}

/** GET /api/hello, asserting the answer comes within the failure bound. */
async function timedGet(app) {
  const start = performance.now();
  const r = await app.get();
  const elapsed = performance.now() - start;
  assert.ok(elapsed < BOUND_MS, `answered in ${elapsed.toFixed(0)} ms, bound ${BOUND_MS} ms`);
  await r.arrayBuffer();
  return r;
}

const targets = [['nothing listens', deadAddr], ['the server hangs', hungAddr], ['the server stops answering', stalledAddr]];
for (const mode of ['open', 'closed']) {
  for (const [what, target] of targets) {
    test(`fail ${mode} when ${what}`, async (t) => {
      const valkey = await target();
      t.after(() => valkey.close());
      const app = await startApp(t, { valkeyAddr: valkey.addr, failureMode: mode, timeoutMs: TIMEOUT_MS });
      await sleep(100); // let the client's first connection attempt get under way, or fail
      for (let i = 0; i < 2; i++) { // the second shows a failed connection is not left hanging
        const start = performance.now();
        const r = await app.get();
        const elapsed = performance.now() - start;
        assert.ok(elapsed < BOUND_MS, `answered in ${elapsed.toFixed(0)} ms, bound ${BOUND_MS} ms`);
        assert.equal(r.headers.get('RateLimit'), null);
        assert.equal(r.headers.get('X-RateLimit-Remaining'), null);
        if (mode === 'open') {
          assert.equal(r.status, 200);
          assert.deepEqual(await r.json(), { message: 'hello' });
        } else {
          assert.equal(r.status, 503);
          assert.equal(r.headers.get('Retry-After'), '1');
          assert.deepEqual(await r.json(), { error: 'rate limiter unavailable' });
        }
      }
      assert.equal(app.warnings.length, 1, 'one warning, then throttled'); // logged, not silent
      assert.match(app.warnings[0], new RegExp(`failing ${mode}`));
    });
  }
}

test('a stalled connection is replaced', async (t) => {
  // A Valkey that accepts and never answers, then answers (a new connection
  // reaches it); then the connection in use goes dead without being closed:
  // each time, after a failure within the bound, a later request is decided.
  const valkey = await proxy(ADDR);
  t.after(() => valkey.close());
  const app = await startApp(t, { valkeyAddr: valkey.addr, timeoutMs: TIMEOUT_MS }); // fails open
  const untilDecided = async () => {
    const deadline = performance.now() + 3000;
    while ((await timedGet(app)).headers.get('RateLimit') === null) {
      assert.ok(performance.now() < deadline, 'no decision 3 s after Valkey came back');
      await sleep(50);
    }
  };
  await sleep(100); // the first connection is under way, its ready check unanswered
  let r = await timedGet(app);
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('RateLimit'), null);
  valkey.mode = 'forward';
  await untilDecided();
  valkey.blackhole();
  r = await timedGet(app);
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('RateLimit'), null);
  await untilDecided();
});

test('app.js as deployed: configured from the environment', async (t) => {
  const port = (await deadAddr()).addr.split(':')[1];
  const prefix = `rl:test:${randomBytes(6).toString('hex')}:api`;
  const child = spawn(process.execPath, [fileURLToPath(new URL('../app.js', import.meta.url))], {
    env: { ...process.env, VALKEY_ADDR: ADDR, PORT: port, RL_PREFIX: prefix, RL_KEY_BURST: '3', RL_KEY_RATE: '3', RL_KEY_PERIOD: '60' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.after(() => child.kill());
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  const deadline = Date.now() + 30_000;
  while (!out.includes('listening')) {
    assert.equal(child.exitCode, null, 'app.js exited');
    assert.ok(Date.now() < deadline, 'app.js did not start within 30 s');
    await sleep(50);
  }
  const base = `http://127.0.0.1:${port}`;
  const r = await fetch(`${base}/api/hello`, { headers: KEY });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('RateLimit'), '"key";r=2;t=20');
  assert.equal(r.headers.get('RateLimit-Policy'), '"key";q=3;w=60, "ip";q=20;w=60');
  assert.equal(await store.exists(`${prefix}:ip:127.0.0.1`), 1); // the real peer address
  assert.equal((await fetch(`${base}/healthz`)).headers.get('RateLimit'), null); // not limited
});
