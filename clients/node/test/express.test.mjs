// ValkeyStore: express-rate-limit's store contract, case by case (the cases
// its own stores are tested for, in our words), the decisions where the
// module's semantics differ, and real Express apps over HTTP: headers,
// recovery after Retry-After, and exactly the limit passing for concurrent
// clients in several processes against apps in several processes.
import assert from 'node:assert/strict';
import { execFile, fork } from 'node:child_process';
import { once } from 'node:events';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { RateLimitClient, ValkeyStore } from '../dist/esm/index.js';
import { connect, sleep, uniq } from './helpers.mjs';

const DAY = 86_400_000; // a window that does not end during a test (they are aligned to midnight UTC)

/** An Express app on a free port; `fetch` against it; closed by the caller. */
async function serve(limiterOptions, routes = (app) => app.get('/', (req, res) => res.send('ok'))) {
  const app = express();
  app.use(rateLimit(limiterOptions));
  routes(app);
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const base = `http://127.0.0.1:${server.address().port}`;
  return { get: (path = '/') => fetch(base + path), close: () => new Promise((r) => server.close(r)) };
}

describe('ValkeyStore: the store contract', () => {
  let conn;
  before(async () => { conn = await connect(); });
  after(() => conn.quit());
  const store = (options = {}, init = { windowMs: DAY, limit: 5 }) => {
    const s = new ValkeyStore({ client: conn, prefix: `${uniq('erl')}:`, ...options });
    s.init(init);
    return s;
  };

  test('the first increment counts 1 and the window ends within windowMs', async () => {
    const s = store({}, { windowMs: 60_000, limit: 5 });
    const { totalHits, resetTime } = await s.increment('a');
    assert.equal(totalHits, 1);
    assert.ok(resetTime instanceof Date);
    const left = resetTime.getTime() - Date.now();
    assert.ok(left > 0 && left <= 60_000, `${left} ms`);
  });

  test('increments count up; get reads without counting', async () => {
    const s = store();
    await s.increment('a');
    assert.equal((await s.increment('a')).totalHits, 2);
    assert.equal((await s.get('a')).totalHits, 2);
    assert.equal((await s.get('a')).totalHits, 2);
    assert.equal(await s.get('unknown'), undefined);
  });

  test('decrement gives one back, never below zero', async () => {
    const s = store();
    await s.increment('a');
    await s.increment('a');
    await s.decrement('a');
    assert.equal((await s.get('a')).totalHits, 1);
    await s.decrement('a');
    await s.decrement('a');
    await s.decrement('never');
    assert.equal((await s.get('a'))?.totalHits ?? 0, 0);
    assert.equal((await s.increment('a')).totalHits, 1);
  });

  test('resetKey forgets one key; resetAll every key under the prefix, and only those', async () => {
    const s = store();
    const other = store();
    for (const k of ['a', 'b', 'c']) await s.increment(k);
    await other.increment('a');
    await s.resetKey('a');
    assert.equal(await s.get('a'), undefined);
    assert.equal((await s.get('b')).totalHits, 1);
    await s.resetAll();
    assert.equal(await s.get('b'), undefined);
    assert.equal(await s.get('c'), undefined);
    assert.equal((await other.get('a')).totalHits, 1, 'another prefix is untouched');
  });

  test('keys are stored under the prefix', async () => {
    const prefix = `${uniq('custom')}:`;
    const s = new ValkeyStore({ client: conn, prefix });
    s.init({ windowMs: DAY, limit: 5 });
    await s.increment('1.2.3.4');
    assert.equal(await conn.exists(`${prefix}1.2.3.4`), 1);
    assert.equal(await conn.type(`${prefix}1.2.3.4`), 'ratelimit');
    assert.equal(s.prefix, prefix);
    assert.equal(s.localKeys, false);
  });

  test('a new window starts from zero once the old one ends', async () => {
    const s = store({}, { windowMs: 300, limit: 5 });
    const first = await s.increment('a');
    await sleep(first.resetTime.getTime() - Date.now() + 20);
    assert.equal((await s.increment('a')).totalHits, 1);
  });

  test('a denied hit reports limit + 1 and when to retry, and takes nothing', async () => {
    const s = store({}, { windowMs: DAY, limit: 2 });
    await s.increment('a');
    await s.increment('a');
    const denied = await s.increment('a');
    assert.equal(denied.totalHits, 3);
    assert.ok(denied.resetTime.getTime() > Date.now());
    assert.equal((await s.increment('a')).totalHits, 3, 'denied hits are not counted: still limit + 1');
    assert.equal((await s.get('a')).totalHits, 2);
  });

  test('a limit function counts every hit (the middleware decides)', async () => {
    const s = store({}, { windowMs: DAY, limit: () => 2 });
    const hits = [];
    for (let i = 0; i < 4; i++) hits.push((await s.increment('a')).totalHits);
    assert.deepEqual(hits, [1, 2, 3, 4]);
    await s.decrement('a');
    assert.equal((await s.get('a')).totalHits, 3);
  });

  test('sliding and log algorithms; bad options are refused', async () => {
    for (const algorithm of ['sliding', 'log']) {
      const s = store({ algorithm }, { windowMs: 60_000, limit: 2 });
      const hits = [];
      for (let i = 0; i < 3; i++) hits.push((await s.increment('a')).totalHits);
      assert.deepEqual(hits, [1, 2, 3], algorithm);
    }
    assert.throws(() => new ValkeyStore({ client: conn, algorithm: 'leaky' }), /algorithm/);
    assert.throws(() => new ValkeyStore({}), /client/);
    assert.throws(() => store({}, { windowMs: 0, limit: 5 }), /windowMs/);
    assert.throws(() => store({ algorithm: 'log' }, { windowMs: 1000, limit: () => 5 }), /limit function/);
  });

  test('a RateLimitClient can be passed instead of a connection', async () => {
    const s = new ValkeyStore({ client: new RateLimitClient(conn, { timeoutMs: 1000 }), prefix: `${uniq('rlc')}:` });
    s.init({ windowMs: DAY, limit: 1 });
    assert.equal((await s.increment('a')).totalHits, 1);
  });
});

describe('ValkeyStore in an Express app', () => {
  let conn;
  before(async () => { conn = await connect(); });
  after(() => conn.quit());

  test('headers: draft-8 RateLimit-Policy and RateLimit, X-RateLimit-*, Retry-After on the 429', async () => {
    const app = await serve({ windowMs: 60_000, limit: 2, standardHeaders: 'draft-8', legacyHeaders: true,
      store: new ValkeyStore({ client: conn, prefix: `${uniq('hdr')}:` }) });
    try {
      const a = await app.get();
      assert.equal(a.status, 200);
      // draft-8 adds a partition key (pk=) naming the client
      assert.match(a.headers.get('ratelimit-policy'), /^"2-in-1min"; q=2; w=60(; pk=:[\w+/=]+:)?$/);
      assert.match(a.headers.get('ratelimit'), /^"2-in-1min"; r=1; t=([1-9]|[1-5]\d|60)(;|$)/);
      assert.equal(a.headers.get('x-ratelimit-limit'), '2');
      assert.equal(a.headers.get('x-ratelimit-remaining'), '1');
      await app.get();
      const denied = await app.get();
      assert.equal(denied.status, 429);
      assert.equal(denied.headers.get('x-ratelimit-remaining'), '0');
      const retry = Number(denied.headers.get('retry-after'));
      assert.ok(retry >= 1 && retry <= 60, `Retry-After ${retry}`);
      const t = Number(/t=(\d+)/.exec(denied.headers.get('ratelimit'))[1]);
      assert.equal(t, retry, 'RateLimit t= and Retry-After agree');
    } finally {
      await app.close();
    }
  });

  test('recovery: after Retry-After seconds the client passes again', async () => {
    const app = await serve({ windowMs: 1000, limit: 2, standardHeaders: 'draft-7',
      store: new ValkeyStore({ client: conn, prefix: `${uniq('recover')}:` }) });
    try {
      let res;
      do res = await app.get(); while (res.status === 200);
      assert.equal(res.status, 429);
      const retry = Number(res.headers.get('retry-after'));
      assert.ok(retry >= 1, `Retry-After ${retry}`);
      await sleep(retry * 1000);
      assert.equal((await app.get()).status, 200);
    } finally {
      await app.close();
    }
  });

  test('skipFailedRequests: failed requests are given back, a 429 gives nothing back', async () => {
    const app = await serve({ windowMs: DAY, limit: 2, skipFailedRequests: true,
      store: new ValkeyStore({ client: conn, prefix: `${uniq('skip')}:` }) }, (a) => {
      a.get('/', (req, res) => res.send('ok'));
      a.get('/fail', (req, res) => res.status(500).send('failed'));
    });
    try {
      for (let i = 0; i < 3; i++) assert.equal((await app.get('/fail')).status, 500, 'failures do not count');
      await sleep(50);
      assert.equal((await app.get()).status, 200);
      assert.equal((await app.get()).status, 200);
      assert.equal((await app.get()).status, 429);
      await sleep(50); // the 429's decrement runs on 'finish'
      assert.equal((await app.get()).status, 429, 'the denied hit took nothing, so its decrement gave nothing back');
    } finally {
      await app.close();
    }
  });

  test('a per-request limit function', async () => {
    const app = await serve({ windowMs: DAY, limit: (req) => (req.query.vip ? 3 : 1),
      store: new ValkeyStore({ client: conn, prefix: `${uniq('fn')}:` }) });
    try {
      assert.equal((await app.get('/')).status, 200);
      assert.equal((await app.get('/')).status, 429);
      assert.equal((await app.get('/?vip=1')).status, 200, 'hit 3 of 3 for this request\'s limit');
      assert.equal((await app.get('/?vip=1')).status, 429);
    } finally {
      await app.close();
    }
  });

  test('concurrent clients in 4 processes against apps in 2 processes: exactly the limit passes', async () => {
    const LIMIT = 37;
    const prefix = `${uniq('procs')}:`;
    const apps = [];
    try {
      for (let i = 0; i < 2; i++) {
        const child = fork(new URL('./fixtures/app.mjs', import.meta.url), {
          env: { ...process.env, LIMIT: String(LIMIT), WINDOW_MS: String(DAY), PREFIX: prefix }, stdio: 'inherit',
        });
        apps.push(child);
      }
      const ports = await Promise.all(apps.map(async (c) => (await once(c, 'message'))[0].port));
      const urls = ports.map((p) => `http://127.0.0.1:${p}/`);
      const run = promisify(execFile);
      const outs = await Promise.all([0, 1, 2, 3].map(() => run(process.execPath, [new URL('./fixtures/hammer.mjs', import.meta.url).pathname, '40', ...urls])));
      const total = {};
      for (const { stdout } of outs) for (const [s, n] of Object.entries(JSON.parse(stdout))) total[s] = (total[s] ?? 0) + n;
      assert.deepEqual(total, { 200: LIMIT, 429: 160 - LIMIT });
      const key = (await conn.keys(`${prefix}*`))[0];
      assert.equal((await new RateLimitClient(conn).peek(key)).remaining, 0);
    } finally {
      for (const c of apps) { c.send('stop'); }
      await Promise.all(apps.map((c) => (c.exitCode === null ? once(c, 'exit') : null)));
    }
  });
});
