// The local deny cache against the real server: it denies locally only what
// the server would deny too, until the server's retry; by cost, definition
// and lockout; bounded; and a reply that crossed this process's own refund is
// not remembered.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { DenyCache, RateLimitClient } from '../dist/esm/index.js';
import { connect, mulberry32, uniq } from './helpers.mjs';

/** A connection that counts the commands sent through it (to the real server). */
function counting(conn) {
  const counted = { calls: 0, call: (...args) => { counted.calls++; return conn.call(...args); } };
  return counted;
}

class FakeClock {
  now = 1_000_000;
  read = () => this.now;
}

describe('DenyCache', () => {
  let conn, raw;
  before(async () => {
    conn = await connect();
    raw = new RateLimitClient(conn, { timeoutMs: 5000 });
  });
  after(() => conn.quit());

  const cached = (cache) => {
    const wire = counting(conn);
    return { rl: new RateLimitClient(wire, { timeoutMs: 5000, denyCache: cache }), wire };
  };

  test('a denied request is denied locally, without a server call, until its retry', async () => {
    const clock = new FakeClock();
    const cache = new DenyCache({ clock: clock.read });
    const { rl, wire } = cached(cache);
    const k = uniq('dc');
    assert.equal((await rl.tokenBucket(k, 2, 1, '1h', { cost: 2 })).allowed, true);
    const denied = await rl.tokenBucket(k, 2, 1, '1h');
    assert.equal(denied.allowed, false);
    assert.equal(denied.local, false);
    const calls = wire.calls;
    const local = await rl.tokenBucket(k, 2, 1, '1h');
    assert.equal(wire.calls, calls, 'no call was sent');
    assert.deepEqual([local.allowed, local.local, local.limit, local.granted], [false, true, 2, 0]);
    assert.equal(local.retryAfterMs, denied.retryAfterMs, 'the fake clock stood still');
    assert.equal(local.headers()['Retry-After'], denied.headers()['Retry-After']);
    assert.equal(local.toJSON().local, true);
    assert.equal(cache.localDenials, 1);
    // The same definition written another way is the same entry.
    assert.equal((await rl.check(k, { algorithm: 'tokenbucket', capacity: 2, refillAmount: 1, refillPeriod: 3_600_000 })).local, true);
    clock.now += denied.retryAfterMs; // the retry has come: ask the server again
    assert.equal((await rl.tokenBucket(k, 2, 1, '1h')).local, false);
  });

  test('a denial says nothing about a smaller cost; partial needs one unit', async () => {
    const { rl } = cached(new DenyCache());
    const k = uniq('cost');
    const tb = (options) => rl.tokenBucket(k, 5, 1, '1h', options);
    assert.equal((await tb({ cost: 3 })).allowed, true);
    assert.equal((await tb({ cost: 3 })).allowed, false); // 2 left
    assert.equal((await tb({ cost: 4 })).local, true, 'more than the denied cost: local');
    const smaller = await tb({ cost: 2 });
    assert.deepEqual([smaller.allowed, smaller.local], [true, false]);
    // A denial of cost 3 does not prove that one unit is missing; a partial denial does.
    const partial = await tb({ cost: 3, partial: true });
    assert.deepEqual([partial.allowed, partial.local], [false, false]);
    assert.equal((await tb({ cost: 1 })).local, true);
    assert.equal((await tb({ cost: 1, partial: true })).local, true);
  });

  test('the definition and the lockout are part of the entry; a dry run cannot stand for a lockout', async () => {
    const { rl } = cached(new DenyCache());
    const k = uniq('def');
    assert.equal((await rl.window(k, 1, '1h')).allowed, true);
    assert.equal((await rl.window(k, 1, '1h')).local, false);
    assert.equal((await rl.window(k, 1, '1h')).local, true);
    assert.equal((await rl.window(k, 1, '1h', { lockout: '10m', dryRun: true })).local, false);
    assert.equal((await rl.window(k, 1, '1h', { lockout: '10m', dryRun: true })).local, false, 'not remembered');
    assert.equal((await rl.window(k, 1, '1h', { lockout: '10m' })).local, false, 'must lock on the server');
    assert.equal((await rl.window(k, 1, '1h', { lockout: 600_000 })).local, true);
    assert.equal((await rl.window(k, 2, '1h')).local, false);
  });

  test('not cached: countDenied logs, block calls, never-passing requests', async () => {
    const { rl } = cached(new DenyCache());
    const log = uniq('log');
    await rl.slidingLog(log, 1, '1h', { countDenied: true });
    for (let i = 0; i < 2; i++) assert.equal((await rl.slidingLog(log, 1, '1h', { countDenied: true })).local, false);
    const w = uniq('block');
    await rl.window(w, 1, '1h');
    await rl.window(w, 1, '1h');
    assert.equal((await rl.window(w, 1, '1h', { block: 1 })).local, false);
    const never = uniq('never');
    for (let i = 0; i < 2; i++) {
      const r = await rl.window(never, 1, '1h', { cost: 2 });
      assert.deepEqual([r.retryAfterMs, r.local], [-1, false]);
    }
  });

  test('bounded: at most maxKeys entries, the least recently used evicted first', async () => {
    const cache = new DenyCache({ maxKeys: 3 });
    const { rl } = cached(cache);
    const keys = ['a', 'b', 'c', 'd', 'e'].map(uniq);
    for (const k of keys.slice(0, 3)) { await rl.window(k, 1, '1h'); await rl.window(k, 1, '1h'); }
    assert.equal(cache.size, 3);
    assert.equal((await rl.window(keys[0], 1, '1h')).local, true); // a is now the most recent
    for (const k of keys.slice(3)) { await rl.window(k, 1, '1h'); await rl.window(k, 1, '1h'); }
    assert.equal(cache.size, 3);
    assert.equal((await rl.window(keys[0], 1, '1h')).local, true, 'kept: used recently');
    assert.equal((await rl.window(keys[1], 1, '1h')).local, false, 'evicted');
    assert.equal((await rl.window(keys[4], 1, '1h')).local, true);
    assert.throws(() => new DenyCache({ maxKeys: 0 }), RangeError);
  });

  test('this process\'s own refund, unlock and reset forget the key', async () => {
    const { rl } = cached(new DenyCache());
    const k = uniq('own');
    await rl.window(k, 1, '1h');
    assert.equal((await rl.window(k, 1, '1h')).allowed, false);
    await rl.refund(k, 1);
    assert.equal((await rl.window(k, 1, '1h')).allowed, true);
    assert.equal((await rl.window(k, 1, '1h', { lockout: '1h' })).allowed, false);
    await rl.unlock(k);
    await rl.reset(k);
    assert.equal((await rl.window(k, 1, '1h', { lockout: '1h' })).allowed, true);
  });

  test('a denial whose reply arrives after this process\'s refund is not remembered', async () => {
    const { rl } = cached(new DenyCache());
    const k = uniq('race');
    await rl.window(k, 1, '1h');
    // Sent before the refund, answered after it was sent: the refund may have made it pass.
    const [denied] = await Promise.all([rl.window(k, 1, '1h'), rl.refund(k, 1)]);
    assert.equal(denied.allowed, false);
    const next = await rl.window(k, 1, '1h');
    assert.deepEqual([next.allowed, next.local], [true, false]);
  });

  test('random concurrent traffic: every local denial is one the server makes too (DRYRUN)', async () => {
    const random = mulberry32(23);
    const cache = new DenyCache();
    const { rl } = cached(cache);
    // Slow limiters (retries of minutes): the server's answer cannot change between the two questions.
    const limiters = [
      { algorithm: 'tokenbucket', capacity: 10, refillAmount: 1, refillPeriod: '10m' },
      { algorithm: 'window', limit: 10, period: '1h' },
      { algorithm: 'window', limit: 10, period: '1h', sliding: true },
      { algorithm: 'slidinglog', limit: 10, period: '1h' },
    ];
    const keys = limiters.map((_, i) => uniq(`rand${i}`));
    let local = 0;
    for (let round = 0; round < 50; round++) {
      // Eight requests at once: their replies and the cache's answers interleave.
      const requests = Array.from({ length: 8 }, () => {
        const i = Math.floor(random() * keys.length);
        return { i, options: { cost: 1 + Math.floor(random() * 6), partial: random() < 0.3 } };
      });
      const results = await Promise.all(requests.map(({ i, options }) => rl.check(keys[i], limiters[i], options)));
      for (const [n, result] of results.entries()) {
        if (!result.local) continue;
        local++;
        const { i, options } = requests[n];
        const server = await raw.check(keys[i], limiters[i], { ...options, dryRun: true });
        assert.equal(server.allowed, false, `round ${round}: ${keys[i]} ${JSON.stringify(options)} was denied locally, the server admits it`);
      }
      if (random() < 0.3) await rl.refund(keys[Math.floor(random() * keys.length)], 1 + Math.floor(random() * 5));
    }
    assert.ok(local > 50, `${local} local denials`);
  });
});
