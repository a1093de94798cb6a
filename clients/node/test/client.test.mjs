// RateLimitClient against the real server, once per client library
// (iovalkey, ioredis): every command, typed results, headers, typed errors.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  AllResult, LeaseDeniedError, RateLimitClient, RateLimitResult, RateLimitServerError, sameSlot,
} from '../dist/esm/index.js';
import { connect, libraries, sleep, uniq } from './helpers.mjs';

for (const [libName, Lib] of libraries) {
  describe(`RateLimitClient over ${libName}`, () => {
    let conn, rl;
    before(async () => {
      conn = await connect(Lib);
      rl = new RateLimitClient(conn, { timeoutMs: 2000 });
    });
    after(() => conn.quit());

    test('token bucket: typed result, cost, never-passing cost', async () => {
      const k = uniq('tb');
      const r = await rl.tokenBucket(k, 10, 5, '1s');
      assert.ok(r instanceof RateLimitResult);
      assert.deepEqual(r.toJSON(), { allowed: true, limit: 10, remaining: 9, retryAfterMs: 0, resetAfterMs: 200, granted: 1 });
      const big = await rl.tokenBucket(k, 10, 5, 1000, { cost: 20 });
      assert.equal(big.allowed, false);
      assert.equal(big.retryAfterMs, -1);
      assert.equal(big.granted, 0);
      assert.equal(big.retryAfterSeconds, null);
      assert.equal(big.headers()['Retry-After'], undefined, 'no Retry-After when it can never pass');
    });

    test('fixed window: exactly the limit passes, then the denial says when', async () => {
      const k = uniq('win');
      const results = [];
      for (let i = 0; i < 4; i++) results.push(await rl.window(k, 3, '1d'));
      assert.deepEqual(results.map((r) => r.allowed), [true, true, true, false]);
      assert.deepEqual(results.map((r) => r.remaining), [2, 1, 0, 0]);
      const denied = results[3];
      assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 86_400_000);
      assert.equal(denied.retryAfterSeconds, Math.ceil(denied.retryAfterMs / 1000));
    });

    test('sliding window and a number period in milliseconds', async () => {
      const k = uniq('slide');
      assert.equal((await rl.window(k, 2, 60_000, { sliding: true })).remaining, 1);
      assert.equal((await rl.window(k, 2, 60_000, { sliding: true })).remaining, 0);
      assert.equal((await rl.window(k, 2, 60_000, { sliding: true })).allowed, false);
      // the same key as a fixed window is another algorithm: the server's WRONGTYPE, typed
      await assert.rejects(rl.window(k, 2, 60_000), (err) => err instanceof RateLimitServerError && err.code === 'WRONGTYPE'
        && /sliding window/.test(err.message));
    });

    test('sliding log with COUNTDENIED logs denied attempts', async () => {
      const k = uniq('log');
      await rl.slidingLog(k, 2, '1h', { countDenied: true });
      await rl.slidingLog(k, 2, '1h', { countDenied: true });
      const d = await rl.slidingLog(k, 2, '1h', { countDenied: true });
      assert.equal(d.allowed, false);
      assert.equal(d.limit, 2);
    });

    test('GCRA, RL.THROTTLE and CL.THROTTLE on one stored limiter', async () => {
      const k = uniq('gcra');
      const r = await rl.gcra(k, 10, 5, '1s');
      assert.deepEqual([r.allowed, r.limit, r.remaining, r.resetAfterMs], [true, 10, 9, 200]);
      assert.equal(r.windowMs, 2000, 'the time to earn a whole burst back');
      const t = await rl.throttle(uniq('thr'), 15, 30, 60);
      assert.deepEqual([t.allowed, t.limit, t.remaining], [true, 16, 15]);
      const c = await rl.clThrottle(uniq('cell'), 15, 30, 60);
      assert.deepEqual({ ...c, resetAfterSeconds: 0 }, { limited: false, limit: 16, remaining: 15, retryAfterSeconds: -1, resetAfterSeconds: 0 });
      assert.ok(c.resetAfterSeconds >= 1 && c.resetAfterSeconds <= 2);
    });

    test('peek: null for no limiter, the state otherwise, nothing taken', async () => {
      const k = uniq('peek');
      assert.equal(await rl.peek(k), null);
      await rl.window(k, 5, '1d');
      const p = await rl.peek(k);
      assert.equal(p.remaining, 4);
      assert.equal((await rl.peek(k)).remaining, 4);
    });

    test('refund gives units back; null on a key with no limiter', async () => {
      const k = uniq('refund');
      assert.equal(await rl.refund(k, 1), null);
      await rl.tokenBucket(k, 10, 1, '1h', { cost: 5 });
      const r = await rl.refund(k, 3);
      assert.equal(r.refunded, 3);
      assert.equal(r.remaining, 8);
    });

    test('partial takes what is there', async () => {
      const k = uniq('partial');
      const a = await rl.tokenBucket(k, 10, 1, '1h', { cost: 7, partial: true });
      const b = await rl.tokenBucket(k, 10, 1, '1h', { cost: 7, partial: true });
      assert.deepEqual([a.granted, b.granted, b.remaining], [7, 3, 0]);
    });

    test('lockout locks on a denial; unlock lifts it', async () => {
      const k = uniq('lock');
      await rl.window(k, 1, '1s', { lockout: '1h' });
      const d = await rl.window(k, 1, '1s', { lockout: '1h' });
      assert.equal(d.allowed, false);
      assert.ok(d.retryAfterMs > 3_000_000, 'the lock, not the window, says when');
      assert.equal(await rl.unlock(k), true);
      assert.equal(await rl.unlock(k), false);
    });

    test('leases: acquire, deny, release, extend, withLease releases in finally', async () => {
      const k = uniq('lease');
      const a = await rl.lease(k, 1, '30s');
      assert.equal(a.allowed, true);
      assert.match(a.leaseId, /^[0-9a-f]{16}$/);
      assert.equal(a.leaseTtlMs, 30_000);
      const b = await rl.lease(k, 1, '30s');
      assert.deepEqual([b.allowed, b.leaseId], [false, null]);
      assert.equal(await rl.extend(k, a.leaseId, '1m'), true);
      assert.equal(await rl.release(k, a.leaseId), true);
      assert.equal(await rl.release(k, a.leaseId), false);
      await assert.rejects(rl.withLease(k, 1, '30s', async () => {
        assert.equal((await rl.peek(k)).remaining, 0, 'held during the work');
        throw new Error('work failed');
      }), /work failed/);
      assert.equal((await rl.peek(k))?.remaining ?? 1, 1, 'released although the work threw (a lease key with no lease may be gone)');
      const held = await rl.lease(k, 1, '30s');
      await assert.rejects(rl.withLease(k, 1, '30s', () => 'never'), (err) => err instanceof LeaseDeniedError && err.result.allowed === false);
      assert.equal(await rl.withLease(k, 2, '30s', (l) => l.leaseId.length), 16);
      await rl.release(k, held.leaseId);
    });

    test('BLOCK waits in the server for the permit; the client timeout is above the wait', async () => {
      const waiter = await connect(Lib);
      try {
        const quick = new RateLimitClient(conn, { timeoutMs: 100, blockingConnection: waiter });
        const k = uniq('block');
        await quick.gcra(k, 1, 4, '1s'); // one per 250 ms
        const start = performance.now();
        const r = await quick.gcra(k, 1, 4, '1s', { block: '2s' });
        const waited = performance.now() - start;
        assert.equal(r.allowed, true);
        assert.ok(waited > 150 && waited < 1000, `waited ${waited} ms`);
        // a lease waiter is woken by the release
        const l = uniq('blocklease');
        const held = await quick.lease(l, 1, '30s');
        setTimeout(() => quick.release(l, held.leaseId), 200);
        const next = await quick.lease(l, 1, '30s', { block: 2000 });
        assert.equal(next.allowed, true);
      } finally {
        waiter.disconnect();
      }
    });

    test('stored policies and RL.LIMIT', async () => {
      const name = uniq('policy');
      await rl.policySet(name, { algorithm: 'window', limit: 2, period: '1m' });
      assert.deepEqual(await rl.policyGet(name), { algorithm: 'window', limit: 2, period: '1m', sliding: false });
      assert.ok((await rl.policyList()).includes(name));
      const k = uniq('limited');
      assert.equal((await rl.limit(k, name)).remaining, 1);
      assert.equal((await rl.limit(k, name, { dryRun: true, cost: 5 })).allowed, false);
      assert.equal(await rl.policyDel(name, uniq('none')), 1);
      assert.equal(await rl.policyGet(name), null);
      await assert.rejects(rl.limit(k, name), (err) => err instanceof RateLimitServerError && err.message.startsWith(`ERR no policy named '${name}'`));
    });

    test('RL.ALL: all or nothing, one header item per limiter', async () => {
      const [burst, daily] = sameSlot(uniq('user'), 'rl:burst', 'rl:daily');
      const entries = [
        { key: burst, limiter: { algorithm: 'tokenbucket', capacity: 2, refillAmount: 1, refillPeriod: '1h' }, name: 'burst' },
        { key: daily, limiter: { algorithm: 'window', limit: 100, period: '1d' }, name: 'daily' },
      ];
      const a = await rl.all(entries);
      assert.ok(a instanceof AllResult);
      assert.equal(a.allowed, true);
      await rl.all(entries);
      const denied = await rl.all(entries);
      assert.equal(denied.allowed, false);
      assert.deepEqual(denied.limiters.map((l) => l.allowed), [false, true]);
      assert.equal(denied.limiters[1].remaining, 98, 'the denied call took nothing from the daily window');
      const h = denied.headers();
      assert.match(h['RateLimit-Policy'], /^"burst";q=2;w=7200, "daily";q=100;w=86400$/);
      assert.match(h.RateLimit, /^"burst";r=0;t=\d+, "daily";r=98;t=\d+$/);
      assert.equal(h['X-RateLimit-Limit'], '2', 'X-RateLimit-* from the binding limiter');
      assert.equal(h['Retry-After'], String(Math.ceil(denied.retryAfterMs / 1000)));
      const partial = await rl.all(entries.map((e, i) => ({ ...e, key: sameSlot(uniq('p'), `rl:x${i}`)[0] })), { cost: 5, partial: true });
      assert.equal(partial.granted, 2);
    });

    test('headers: exact values, Retry-After rounded up', async () => {
      const k = uniq('hdr');
      const r = await rl.window(k, 1, '1h');
      const ok = r.headers({ name: 'api' });
      const reset = String(Math.ceil(r.resetAfterMs / 1000));
      assert.deepEqual(ok, {
        'RateLimit-Policy': '"api";q=1;w=3600',
        RateLimit: `"api";r=0;t=${reset}`,
        'X-RateLimit-Limit': '1',
        'X-RateLimit-Remaining': '0',
        'X-RateLimit-Reset': reset,
      });
      const denied = new RateLimitResult({ allowed: false, limit: 5, remaining: 0, retryAfterMs: 1001, resetAfterMs: 5000 });
      assert.equal(denied.headers()['Retry-After'], '2');
      assert.equal(new RateLimitResult({ allowed: false, limit: 5, remaining: 0, retryAfterMs: 1, resetAfterMs: 1 }).headers()['Retry-After'], '1');
      assert.deepEqual(Object.keys(r.headers({ legacy: false })), ['RateLimit-Policy', 'RateLimit']);
    });

    test('server errors are typed and keep the message; the key is untouched', async () => {
      await assert.rejects(rl.window(uniq('bad'), 0, '1m'), (err) => {
        assert.ok(err instanceof RateLimitServerError);
        assert.equal(err.message, 'ERR limit must be an integer from 1 to 1000000000000000');
        assert.equal(err.code, 'ERR');
        assert.equal(err.command, 'RL.WINDOW');
        assert.equal(err.transient, false);
        return true;
      });
      const s = uniq('string');
      await conn.set(s, 'x');
      await assert.rejects(rl.gcra(s, 1, 1, '1s'), (err) => err.code === 'WRONGTYPE');
      assert.equal(await conn.get(s), 'x');
    });

    test('a bad failMode is refused at construction', () => {
      assert.throws(() => new RateLimitClient(conn, { failMode: 'sometimes' }), /failMode/);
      assert.throws(() => new RateLimitClient({}), /iovalkey or ioredis/);
    });

    test('a waited request is exactly what the server answered, after sleeping retryAfterMs', async () => {
      const k = uniq('recover');
      await rl.window(k, 1, '1s');
      const d = await rl.window(k, 1, '1s');
      assert.equal(d.allowed, false);
      await sleep(d.retryAfterMs);
      assert.equal((await rl.window(k, 1, '1s')).allowed, true);
    });
  });
}
