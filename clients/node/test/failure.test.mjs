// The failure paths, within the timeout: nothing listening, and a server that
// accepts connections and never answers. Fail closed (typed errors), fail
// open (allowed, marked, no headers), and the adapters' own failure options.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { RateLimiterMemory } from 'rate-limiter-flexible';
import {
  RateLimitClient, RateLimitTimeoutError, RateLimitUnavailableError, RateLimiterValkey, recommendedOptions, ValkeyStore,
} from '../dist/esm/index.js';
import { libraries } from './helpers.mjs';

const TIMEOUT = 150;
const SLACK = 100; // timers on a loaded machine

/** A port nothing listens on. */
async function closedPort() {
  const s = net.createServer().listen(0, '127.0.0.1');
  await once(s, 'listening');
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

/** A server that accepts connections and never answers. */
async function silentServer() {
  const sockets = new Set();
  const s = net.createServer((sock) => { sockets.add(sock); sock.on('error', () => {}); }).listen(0, '127.0.0.1');
  await once(s, 'listening');
  return { port: s.address().port, close: () => { for (const k of sockets) k.destroy(); s.close(); } };
}

async function timed(fn) {
  const start = performance.now();
  const out = await fn().then((value) => ({ value }), (error) => ({ error }));
  return { ...out, ms: performance.now() - start };
}

for (const [libName, Lib] of libraries) {
  describe(`failure paths over ${libName}`, () => {
    let dead, silent;
    const conns = [];
    const open = (port, options) => {
      const c = new Lib({ host: '127.0.0.1', port, ...options });
      c.on('error', () => {});
      conns.push(c);
      return c;
    };
    before(async () => { dead = await closedPort(); silent = await silentServer(); });
    after(() => { for (const c of conns) c.disconnect(); silent.close(); });

    // With the recommended options the connection is up before the call: a
    // client without a ready check sends it, never answered; ioredis's RESP3
    // handshake (HELLO) is never answered either, so it refuses at once.
    const connected = async (c) => {
      if (!['connect', 'ready'].includes(c.status)) await new Promise((r) => c.once('connect', r));
      return c;
    };
    for (const [what, port, options, ready] of [
      ['nothing listening, recommended options', () => dead, recommendedOptions(TIMEOUT), (c) => c],
      ['nothing listening, the library\'s defaults', () => dead, {}, (c) => c],
      ['a server that never answers, recommended options', () => silent.port, recommendedOptions(TIMEOUT), connected],
      ['a server that never answers, the library\'s defaults', () => silent.port, {}, (c) => c],
    ]) {
      test(`${what}: fail closed rejects with a typed error within the timeout`, async () => {
        const rl = new RateLimitClient(await ready(open(port(), options)), { timeoutMs: TIMEOUT });
        const { error, ms } = await timed(() => rl.window('k', 10, '1m'));
        assert.ok(error instanceof RateLimitUnavailableError, `got ${error}`);
        assert.ok(ms < TIMEOUT + SLACK, `took ${ms} ms`);
        if (what.includes('never answers') && libName === 'iovalkey') assert.ok(error instanceof RateLimitTimeoutError || /timed out/i.test(error.message), error.message);
      });

      test(`${what}: fail open allows, marked, without headers, and reports the error`, async () => {
        const errors = [];
        const rl = new RateLimitClient(await ready(open(port(), options)), { timeoutMs: TIMEOUT, failMode: 'open', onError: (e) => errors.push(e) });
        const { value, ms } = await timed(() => rl.tokenBucket('k', 10, 1, '1s'));
        assert.ok(ms < TIMEOUT + SLACK, `took ${ms} ms`);
        assert.deepEqual([value.allowed, value.failedOpen, value.limit, value.remaining], [true, true, 10, 10]);
        assert.deepEqual(value.headers(), {});
        const all = await rl.all([{ key: 'a', limiter: { algorithm: 'window', limit: 3, period: '1m' } }]);
        assert.deepEqual([all.allowed, all.failedOpen], [true, true]);
        assert.equal(errors.length, 2);
        assert.ok(errors[0] instanceof RateLimitUnavailableError);
      });
    }

    test('express-rate-limit: passOnStoreError decides, within the timeout', async () => {
      for (const pass of [true, false]) {
        const app = express();
        app.use(rateLimit({ windowMs: 60_000, limit: 5, passOnStoreError: pass, store: new ValkeyStore({ client: open(silent.port, {}), timeoutMs: TIMEOUT }) }));
        app.get('/', (req, res) => res.send('ok'));
        app.use((err, req, res, next) => res.status(500).send('store failed')); // eslint-disable-line no-unused-vars
        const server = app.listen(0, '127.0.0.1');
        await once(server, 'listening');
        try {
          const start = performance.now();
          const res = await fetch(`http://127.0.0.1:${server.address().port}/`);
          const ms = performance.now() - start;
          assert.equal(res.status, pass ? 200 : 500);
          assert.ok(ms < TIMEOUT + SLACK, `took ${ms} ms`);
        } finally {
          server.close();
        }
      }
    });

    test('rate-limiter-flexible: rejects with the Error, or uses the insuranceLimiter', async () => {
      const bare = new RateLimiterValkey({ storeClient: open(dead, recommendedOptions(TIMEOUT)), points: 2, duration: 1, timeoutMs: TIMEOUT });
      await assert.rejects(bare.consume('k'), (err) => err instanceof RateLimitUnavailableError);
      const insured = new RateLimiterValkey({
        storeClient: open(silent.port, {}), points: 2, duration: 1, timeoutMs: TIMEOUT,
        insuranceLimiter: new RateLimiterMemory({ points: 1, duration: 1 }),
      });
      const res = await insured.consume('k');
      assert.equal(res.remainingPoints, 0, 'the insurance limiter (1 point) answered');
      await assert.rejects(insured.consume('k'), (rej) => rej.msBeforeNext > 0 && !(rej instanceof Error));
    });
  });
}
