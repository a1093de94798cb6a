// RateLimiterValkey: rate-limiter-flexible's RateLimiterRedis contract, case
// by case (the cases its own tests cover, in our words, with the documented
// differences asserted as such); RateLimiterUnion on RL.ALL (atomic);
// RateLimiterQueue on BLOCK. Once per client library.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  RateLimiterQueue, RateLimiterQueueError, RateLimiterRes, RateLimiterUnion, RateLimiterValkey,
} from '../dist/esm/index.js';
import { connect, libraries, sleep, uniq } from './helpers.mjs';

const YEAR_MS = 365 * 86_400_000;

for (const [libName, Lib] of libraries) {
  describe(`RateLimiterValkey over ${libName}`, () => {
    let conn;
    before(async () => { conn = await connect(Lib); });
    after(() => conn.quit());
    const limiter = (options) => new RateLimiterValkey({ storeClient: conn, keyPrefix: uniq('rlflx'), ...options });

    test('consume 1 point', async () => {
      const res = await limiter({ points: 2, duration: 5 }).consume('k');
      assert.ok(res instanceof RateLimiterRes);
      assert.deepEqual([res.consumedPoints, res.remainingPoints, res.isFirstInDuration], [1, 1, true]);
      assert.ok(res.msBeforeNext > 0 && res.msBeforeNext <= 5000);
      assert.deepEqual(Object.keys(res.toJSON()), ['remainingPoints', 'msBeforeNext', 'consumedPoints', 'isFirstInDuration']);
    });

    test('rejects with a RateLimiterRes when consuming more than the points', async () => {
      const rl = limiter({ points: 1, duration: 5 });
      await assert.rejects(rl.consume('k', 2), (rej) => {
        assert.ok(rej instanceof RateLimiterRes && !(rej instanceof Error));
        assert.equal(rej.remainingPoints, 0);
        assert.equal(rej.consumedPoints, 2, 'what rate-limiter-flexible would have counted');
        return true;
      });
      assert.equal((await rl.consume('k')).consumedPoints, 1, 'the denied call took nothing (a difference: documented)');
      await assert.rejects(rl.consume('k'), (rej) => rej.msBeforeNext > 0 && rej.msBeforeNext <= 5000);
    });

    test('points 0 allows nothing', async () => {
      await assert.rejects(limiter({ points: 0, duration: 5 }).consume('k', 1), (rej) => rej.msBeforeNext >= 0);
    });

    test('penalty adds points; reward gives them back', async () => {
      const rl = limiter({ points: 3, duration: 5 });
      await rl.consume('k');
      const p = await rl.penalty('k');
      assert.equal(p.consumedPoints, 2);
      assert.equal((await rl.get('k')).consumedPoints, 2);
      await rl.reward('k');
      assert.equal((await rl.get('k')).consumedPoints, 1);
      await rl.reward('k', 5);
      assert.equal((await rl.get('k'))?.consumedPoints ?? 0, 0, 'never below zero (a difference: documented)');
      assert.equal((await rl.consume('k')).consumedPoints, 1);
      assert.equal((await rl.reward('fresh')).remainingPoints, 3);
    });

    test('blockDuration blocks the key once it asks for too much, and the block ends', async () => {
      const rl = limiter({ points: 1, duration: 1, blockDuration: 2 });
      await assert.rejects(rl.consume('k', 2), (rej) => rej.msBeforeNext > 1000);
      await sleep(1100);
      await assert.rejects(rl.consume('k'), (rej) => rej.msBeforeNext > 0, 'still blocked after the window ended');
      await sleep(1000);
      assert.equal((await rl.consume('k')).consumedPoints, 1);
    });

    test('block a key explicitly; 0 blocks "forever" (3650 days)', async () => {
      const rl = limiter({ points: 1, duration: 1 });
      const b = await rl.block('k', 2);
      assert.equal(b.consumedPoints, 2);
      assert.ok(b.msBeforeNext > 1000 && b.msBeforeNext <= 2000);
      await assert.rejects(rl.consume('k'), (rej) => rej.msBeforeNext > 1000);
      await rl.block('forever', 0);
      await sleep(1100);
      await assert.rejects(rl.consume('forever'), (rej) => rej.msBeforeNext > YEAR_MS);
      const again = await rl.block('k', 5);
      assert.ok(again.msBeforeNext > 4000, 'blocking a blocked key sets the new duration');
    });

    test('get: the state, or null for a key never used', async () => {
      const rl = limiter({ points: 2, duration: 5 });
      assert.equal(await rl.get('k'), null);
      await rl.consume('k');
      const res = await rl.get('k');
      assert.deepEqual([res.consumedPoints, res.remainingPoints], [1, 1]);
    });

    test('delete: true when there was a key, false otherwise', async () => {
      const rl = limiter({ points: 2, duration: 5 });
      await rl.consume('k');
      assert.equal(await rl.delete('k'), true);
      assert.equal(await rl.delete('k'), false);
      assert.equal(await rl.get('k'), null);
    });

    test('duration 0 keeps the count for the longest the module allows', async () => {
      const rl = limiter({ points: 2, duration: 0 });
      await rl.consume('k');
      await rl.consume('k');
      const res = await rl.get('k');
      assert.equal(res.consumedPoints, 2);
      assert.ok(res.msBeforeNext > YEAR_MS, 'not -1 (a difference: documented)');
    });

    test('set: points within the limit are the count; beyond it the key is blocked', async () => {
      const rl = limiter({ points: 5, duration: 60 });
      await rl.consume('k');
      await rl.set('k', 3);
      assert.equal((await rl.get('k')).consumedPoints, 3);
      await rl.set('k', 12, 2);
      assert.equal((await rl.get('k')).consumedPoints, 5, 'capped at points (a difference: documented)');
      await assert.rejects(rl.consume('k'), (rej) => rej.msBeforeNext > 1000 && rej.msBeforeNext <= 60_000);
    });

    test('keyPrefix, getKey, hashTag; unsupported options are refused', async () => {
      assert.equal(new RateLimiterValkey({ storeClient: conn, keyPrefix: 'login' }).getKey('u1'), 'login:u1');
      assert.equal(new RateLimiterValkey({ storeClient: conn }).getKey('u1'), 'rlflx:u1');
      assert.equal(new RateLimiterValkey({ storeClient: conn, keyPrefix: 'a', hashTag: true }).getKey('u1'), 'a:{u1}');
      const rl = limiter({ points: 3, duration: 5 });
      await rl.consume('k');
      assert.equal(await conn.type(rl.getKey('k')), 'ratelimit');
      assert.throws(() => limiter({ execEvenly: true }), /execEvenly/);
      assert.throws(() => limiter({ inMemoryBlockOnConsumed: 3 }), /inMemoryBlockOnConsumed/);
      await assert.rejects(rl.consume('k', 1, { customDuration: 3 }), /customDuration/);
    });

    test('RateLimiterUnion is atomic: a call denied by one limiter takes from none', async () => {
      const perSecond = limiter({ keyPrefix: uniq('sec'), points: 1, duration: 1, hashTag: true });
      const perMinute = limiter({ keyPrefix: uniq('min'), points: 5, duration: 60, hashTag: true });
      const union = new RateLimiterUnion(perSecond, perMinute);
      const ok = await union.consume('u');
      assert.deepEqual(Object.keys(ok).sort(), [perMinute.keyPrefix, perSecond.keyPrefix].sort());
      assert.equal(ok[perMinute.keyPrefix].remainingPoints, 4);
      await assert.rejects(union.consume('u'), (rej) => {
        assert.deepEqual(Object.keys(rej), [perSecond.keyPrefix], 'only the limiters that denied it');
        assert.ok(rej[perSecond.keyPrefix].msBeforeNext > 0);
        return true;
      });
      assert.equal((await perMinute.get('u')).remainingPoints, 4, 'the per-minute limiter was not charged');
      assert.throws(() => new RateLimiterUnion(), /at least one/);
      assert.throws(() => new RateLimiterUnion(perSecond, {}), /RateLimiterValkey/);
    });

    test('RateLimiterQueue: tokens now, FIFO waits in the server, a full queue and too many tokens rejected', async () => {
      const rl = limiter({ points: 2, duration: 1 });
      const queue = new RateLimiterQueue(rl, { maxQueueSize: 2 });
      try {
        assert.equal(await queue.getTokensRemaining(), 2);
        assert.equal(await queue.removeTokens(1), 1);
        assert.equal(await queue.removeTokens(1), 0);
        await assert.rejects(queue.removeTokens(3), (err) => err instanceof RateLimiterQueueError);
        const order = [];
        const start = performance.now();
        const waits = [1, 2].map((i) => queue.removeTokens(1).then(() => order.push(i)));
        await assert.rejects(queue.removeTokens(1), (err) => err instanceof RateLimiterQueueError && /maximum/.test(err.message));
        await Promise.all(waits);
        assert.deepEqual(order, [1, 2]);
        assert.ok(performance.now() - start <= 1300, 'served when the next window began');
        const other = new RateLimiterQueue(rl, { maxWaitMs: 50 });
        try {
          await other.removeTokens(2, 'busy');
          await assert.rejects(other.removeTokens(1, 'busy'), (err) => err instanceof RateLimiterQueueError);
        } finally {
          await other.close();
        }
      } finally {
        await queue.close();
      }
    });
  });
}
