// Split budgets: shares that sum exactly to the limit, keys spread over the
// slot ranges (the same keys as the Python package), two choices, and never
// more admitted than the limit, against the real server.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { DenyCache, RateLimitClient, SplitLimit, keySlot, shardKeys, shares, splitLimit } from '../dist/esm/index.js';
import { connect, mulberry32, uniq } from './helpers.mjs';

test('shares sum exactly to the total and differ by at most one', () => {
  const random = mulberry32(7);
  for (let i = 0; i < 500; i++) {
    const n = 1 + Math.floor(random() * 50);
    const total = n + Math.floor(random() * 10_000);
    const parts = shares(total, n);
    assert.equal(parts.length, n);
    assert.equal(parts.reduce((a, b) => a + b, 0), total);
    assert.ok(Math.max(...parts) - Math.min(...parts) <= 1);
  }
  assert.deepEqual(shares(10, 3), [4, 3, 3]);
  assert.throws(() => shares(2, 3), RangeError);
});

test('every algorithm splits into limits that sum to its own', () => {
  const sum = (list, field) => list.reduce((a, l) => a + l[field], 0);
  const bucket = splitLimit({ algorithm: 'tokenbucket', capacity: 100, refillAmount: 7, refillPeriod: '1s' }, 3);
  assert.deepEqual(bucket.map((b) => [b.capacity, b.refillAmount, b.refillPeriod]), [[34, 3, '1s'], [33, 2, '1s'], [33, 2, '1s']]);
  const gcra = splitLimit({ algorithm: 'gcra', burst: 10, rate: 100, period: '1s' }, 4);
  assert.deepEqual([sum(gcra, 'burst'), sum(gcra, 'rate')], [10, 100]);
  const windows = splitLimit({ algorithm: 'window', limit: 1001, period: '1m', sliding: true }, 10);
  assert.equal(sum(windows, 'limit'), 1001);
  assert.ok(windows.every((w) => w.sliding && w.period === '1m'));
  const logs = splitLimit({ algorithm: 'slidinglog', limit: 5, period: '1h', countDenied: true }, 5);
  assert.ok(logs.every((l) => l.limit === 1 && l.countDenied));
  assert.throws(() => splitLimit({ algorithm: 'policy', name: 'p' }, 2), TypeError);
});

test('shard keys fall in distinct slot ranges, and are the Python package\'s keys', () => {
  for (const n of [2, 3, 10]) {
    const keys = shardKeys('rl:api:global', n);
    assert.deepEqual(keys.map((k) => Math.floor((keySlot(k) * n) / 16384)), Array.from({ length: n }, (_, i) => i));
  }
  // valkey_ratelimit.split.shard_keys('rl:api:global', 3) and ('ключ', 4), and valkey-py's key_slot
  assert.deepEqual(shardKeys('rl:api:global', 3), ['rl:api:global:{66b77a6b.0.3}', 'rl:api:global:{66b77a6b.1.1}', 'rl:api:global:{66b77a6b.2.2}']);
  assert.deepEqual(shardKeys('ключ', 4), ['ключ:{0caf961a.0.3}', 'ключ:{0caf961a.1.11}', 'ключ:{0caf961a.2.3}', 'ключ:{0caf961a.3.11}']);
  assert.deepEqual(['foo', '{user1000}.following', 'foo{}{bar}', 'foo{{bar}}zap'].map(keySlot), [12182, 3443, 8363, 4015]);
  assert.notDeepEqual(shardKeys('a', 3), shardKeys('b', 3));
  assert.throws(() => shardKeys('rl:{user}:x', 3), TypeError);
});

describe('SplitLimit against the server', () => {
  let conn, rl;
  before(async () => {
    conn = await connect();
    rl = new RateLimitClient(conn, { timeoutMs: 5000 });
  });
  after(() => conn.quit());

  test('a denied first pick is served by the second, and only two are tried', async () => {
    // Always shard 0 first, then shard 1.
    const picks = [0, 0];
    let i = 0;
    const split = new SplitLimit(rl, uniq('two'), { algorithm: 'window', limit: 7, period: '1h' }, 3, { random: () => picks[i++ % 2] });
    assert.deepEqual(split.limits.map((l) => l.limit), [3, 2, 2]);
    for (let n = 0; n < 3; n++) assert.equal((await split.hit()).allowed, true);
    assert.equal((await rl.check(split.keys[0], split.limits[0], { dryRun: true })).allowed, false, 'shard 0 is out');
    const second = await split.hit();
    assert.deepEqual([second.allowed, second.limit], [true, 7]);
    assert.equal((await split.hit()).allowed, true);
    const denied = await split.hit(); // shards 0 and 1 are out; shard 2 still has 2, but only two are tried
    assert.equal(denied.allowed, false);
    assert.ok(denied.retryAfterMs > 0);
  });

  test('concurrent requests never admit more than the limit; the shards\' counts add up to it', async () => {
    const split = new SplitLimit(rl, uniq('s'), { algorithm: 'window', limit: 10, period: '1h' }, 3, { random: mulberry32(1) });
    const results = await Promise.all(Array.from({ length: 60 }, () => split.hit()));
    const admitted = results.filter((r) => r.allowed).length;
    assert.ok(admitted <= 10 && admitted > 0, `${admitted} admitted`);
    const peeks = await Promise.all(split.keys.map((k) => rl.peek(k)));
    assert.equal(peeks.reduce((n, p, i) => n + (p === null ? 0 : split.limits[i].limit - p.remaining), 0), admitted);
    // Spent out: every request is denied, whichever shards it picks.
    for (let n = 0; n < 20; n++) await split.hit();
    assert.equal((await Promise.all(Array.from({ length: 30 }, () => split.hit()))).filter((r) => r.allowed).length, 0);
  });

  test('with a deny cache, a spent split is denied without calls', async () => {
    const split = new SplitLimit(new RateLimitClient(conn, { denyCache: new DenyCache() }), uniq('sc'),
      { algorithm: 'window', limit: 6, period: '1h' }, 3, { random: mulberry32(2) });
    for (let n = 0; n < 30; n++) await split.hit();
    const results = await Promise.all(Array.from({ length: 20 }, () => split.hit()));
    assert.ok(results.every((r) => !r.allowed && r.local && r.limit === 6));
  });
});
