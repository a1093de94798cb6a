// Token batching against the real server: never more than the limit (one
// process with several connections and concurrent callers, and several
// processes over short windows), concurrent callers share one batch request,
// units given back on close and when idle, deadlines of fixed windows, the
// adaptive size, and the limits that cannot be batched refused.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { RateLimitClient, TokenBatcher } from '../dist/esm/index.js';
import { connect, mulberry32, server, sleep, uniq } from './helpers.mjs';
import { runScale } from './scale.mjs';

/** Starts at the real monotonic clock (the server's windows are real) and moves only when told. */
class FakeClock {
  now = performance.now();
  read = () => this.now;
}

const window = (limit, period) => ({ algorithm: 'window', limit, period });
const bucket = (capacity, refillAmount, refillPeriod) => ({ algorithm: 'tokenbucket', capacity, refillAmount, refillPeriod });

describe('TokenBatcher', () => {
  const conns = [];
  let rl;
  before(async () => {
    for (let i = 0; i < 3; i++) conns.push(await connect());
    rl = new RateLimitClient(conns[0], { timeoutMs: 5000 });
  });
  after(() => Promise.all(conns.map((c) => c.quit())));

  /** Units taken from the limiter on `key` (its limit less what the server says remains). */
  const used = async (key, limit) => {
    const p = await rl.peek(key);
    return p === null ? 0 : limit - p.remaining;
  };

  test('three connections, four concurrent callers each, spend until denied: exactly the limit', async () => {
    const key = uniq('w');
    const limit = window(300, '1h');
    const batchers = conns.map((c) => new TokenBatcher(new RateLimitClient(c, { timeoutMs: 5000 }), key, limit, { maxBatch: 40, background: false }));
    let admitted = 0;
    await Promise.all(batchers.flatMap((b) => Array.from({ length: 4 }, async () => {
      while ((await b.acquire()).allowed) admitted++;
    })));
    await Promise.all(batchers.map((b) => b.close()));
    assert.equal(admitted, 300);
    assert.equal(await used(key, 300), 300, 'the server counted exactly what was admitted: no unit spent twice');
    assert.equal(batchers.reduce((n, b) => n + b.stats.admitted, 0), 300);
    const calls = batchers.reduce((n, b) => n + b.stats.serverCalls, 0);
    assert.ok(calls < 300 / 2, `${calls} server calls`);
  });

  test('mixed costs from concurrent callers, exact top-ups among them: the server counted exactly what was admitted', async () => {
    const random = mulberry32(5);
    let topUps = 0; // calls for the rest of a cost, not partial: they come as a budget runs out
    const wire = (c) => ({ call: (...args) => { if (args[0] === 'RL.WINDOW' && !args.includes('PARTIAL')) topUps++; return c.call(...args); } });
    for (let round = 0; round < 10; round++) {
      const key = uniq('mixed');
      const limit = window(200, '1h');
      const batchers = conns.map((c) => new TokenBatcher(new RateLimitClient(wire(c), { timeoutMs: 5000 }), key, limit, { maxBatch: 12, background: false }));
      let admitted = 0;
      await Promise.all(batchers.flatMap((b) => Array.from({ length: 4 }, async () => {
        for (let i = 0; i < 40; i++) {
          const cost = 1 + Math.floor(random() * 7);
          if ((await b.acquire(cost)).allowed) admitted += cost;
        }
      })));
      await Promise.all(batchers.map((b) => b.close()));
      assert.ok(admitted <= 200 && admitted > 100, `round ${round}: ${admitted} admitted`);
      assert.equal(await used(key, 200), admitted, `round ${round}: no unit spent twice, none lost`);
    }
    assert.ok(topUps > 0, 'the runs made exact top-ups');
  });

  test('concurrent callers that run short wait for one batch request, not one each', async () => {
    const key = uniq('share');
    const batcher = new TokenBatcher(rl, key, window(20, '1h'), { background: false });
    const results = await Promise.all(Array.from({ length: 50 }, () => batcher.acquire()));
    assert.equal(results.filter((r) => r.allowed).length, 20);
    assert.equal(await used(key, 20), 20);
    // The first caller's batch (one unit, no rate known yet), then one for all the others; then a denial
    // for everyone still waiting.
    assert.ok(batcher.stats.takes <= 3, `${batcher.stats.takes} batch requests for 50 callers`);
    assert.equal(results.filter((r) => !r.allowed && r.retryAfterMs > 0).length, 30);
    await batcher.close();
  });

  test('close gives back what was not used; acquire after close rejects', async () => {
    const key = uniq('close');
    const batcher = new TokenBatcher(rl, key, window(100, '1h'), { minBatch: 20, background: false });
    assert.equal((await batcher.acquire()).allowed, true);
    const local = await batcher.acquire(3);
    assert.deepEqual([local.allowed, local.local, local.remaining], [true, true, 96]);
    assert.equal(batcher.held, 16);
    assert.equal(await used(key, 100), 20);
    await batcher.close();
    assert.equal(await used(key, 100), 4, 'the server\'s remaining went back up');
    assert.equal(batcher.stats.refunded, 16);
    await assert.rejects(batcher.acquire(), /closed/);
    await batcher.close(); // idempotent
  });

  test('close waits for a batch on its way, serves its callers, then gives back the rest', async () => {
    const key = uniq('closing');
    const batcher = new TokenBatcher(rl, key, window(100, '1h'), { minBatch: 10, background: false });
    const pending = batcher.acquire();
    const closing = batcher.close();
    assert.equal((await pending).allowed, true);
    await closing;
    assert.equal(batcher.held, 0);
    assert.equal(await used(key, 100), 1);
  });

  test('idle units go back (maintain with a fake clock)', async () => {
    const clock = new FakeClock();
    const key = uniq('idle');
    const batcher = new TokenBatcher(rl, key, bucket(100, 1, '1h'), { minBatch: 10, background: false, clock: clock.read });
    await batcher.acquire();
    await batcher.maintain();
    assert.equal(batcher.held, 9, 'not idle yet');
    clock.now += batcher.idleAfterMs;
    await batcher.maintain();
    assert.equal(batcher.held, 0);
    assert.equal(batcher.stats.refunded, 9);
    assert.equal((await rl.peek(key)).remaining, 99);
  });

  test('the background timer gives idle units back', async () => {
    const key = uniq('timer');
    const batcher = new TokenBatcher(rl, key, bucket(100, 1, '1h'), { minBatch: 10, targetMs: 50 });
    await batcher.acquire();
    for (let t = 0; batcher.held > 0 && t < 1000; t++) await sleep(10);
    assert.equal(batcher.held, 0);
    assert.equal(batcher.stats.refunded, 9);
    await batcher.close();
  });

  test('the timer never keeps a process alive', async () => {
    // A process that leaves its batcher open and closes its connection must exit on its own.
    const script = `
      import { Redis } from 'iovalkey';
      import { RateLimitClient, TokenBatcher } from ${JSON.stringify(new URL('../dist/esm/index.js', import.meta.url).href)};
      const conn = new Redis({ host: ${JSON.stringify(server.host)}, port: ${server.port} });
      const batcher = new TokenBatcher(new RateLimitClient(conn), ${JSON.stringify(uniq('unref'))}, { algorithm: 'window', limit: 100, period: '1h' }, { minBatch: 10 });
      await batcher.acquire();
      conn.disconnect();
      console.log('held', batcher.held);
    `;
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], { timeout: 30_000 });
    assert.equal(stdout.trim(), 'held 9');
  });

  test('fixed-window units expire with their window and are not refunded late', async () => {
    const clock = new FakeClock();
    const batcher = new TokenBatcher(rl, uniq('f'), window(100, '1h'), { minBatch: 10, background: false, clock: clock.read });
    const first = await batcher.acquire();
    const windowEnds = clock.now + first.resetAfterMs;
    // Inside the last refundMarginMs: a refund could land in the next window, so none is sent.
    clock.now = windowEnds - batcher.refundMarginMs / 2;
    await batcher.flush();
    await batcher.maintain();
    assert.equal(batcher.held, 9);
    assert.equal(batcher.stats.refunds, 0);
    // Past the window: the units may not be spent; they are dropped, and a new batch is taken.
    clock.now = windowEnds;
    const takes = batcher.stats.takes;
    await batcher.acquire();
    assert.equal(batcher.stats.dropped, 9);
    assert.equal(batcher.stats.takes, takes + 1);
    await batcher.close();
  });

  test('in a window\'s last stretch a batch is only what is needed', async () => {
    const clock = new FakeClock();
    const key = uniq('l');
    const batcher = new TokenBatcher(rl, key, window(100, '1h'), { minBatch: 10, background: false, clock: clock.read });
    const first = await batcher.acquire();
    clock.now += first.resetAfterMs - batcher.refundMarginMs / 2;
    for (let i = 0; i < 9; i++) assert.equal((await batcher.acquire()).local, true);
    await batcher.acquire(2);
    assert.equal(batcher.held, 0);
    assert.equal(await used(key, 100), 12);
  });

  test('the batch follows the recent rate, within its bounds', async () => {
    const clock = new FakeClock();
    const batcher = new TokenBatcher(rl, uniq('a'), window(100_000, '1h'), { targetMs: 200, maxBatch: 500, background: false, clock: clock.read });
    assert.equal(batcher.batchSize(), 1);
    for (let i = 0; i < 2000; i++) { clock.now += 1; await batcher.acquire(); } // 1000 per second for 2 s
    assert.ok(batcher.batchSize() >= 150 && batcher.batchSize() <= 200, `${batcher.batchSize()}: about 0.2 s of 1000/s`);
    for (let i = 0; i < 3000; i++) { clock.now += 0.1; await batcher.acquire(); } // 10,000 per second: capped
    assert.equal(batcher.batchSize(), 500);
    assert.ok(batcher.stats.takes < 100, `${batcher.stats.takes} batch requests`);
    await batcher.close();
  });

  test('a server denial is kept locally for recheckMs; units given back elsewhere are found then', async () => {
    const clock = new FakeClock();
    const key = uniq('d');
    const batcher = new TokenBatcher(rl, key, window(3, '1h'), { background: false, clock: clock.read });
    for (let i = 0; i < 3; i++) assert.equal((await batcher.acquire()).allowed, true);
    const denied = await batcher.acquire();
    assert.deepEqual([denied.allowed, denied.local], [false, false]);
    const again = await batcher.acquire();
    assert.deepEqual([again.allowed, again.local], [false, true]);
    assert.ok(again.retryAfterMs > 0);
    await rl.refund(key, 2);
    clock.now += batcher.recheckMs;
    assert.equal((await batcher.acquire()).allowed, true);
    assert.equal(batcher.stats.deniedLocally, 1);
  });

  test('a cost larger than what is there: one exact top-up, denied with its retry; the units stay', async () => {
    const key = uniq('t');
    const limit = bucket(10, 1, '1h');
    const batcher = new TokenBatcher(rl, key, limit, { background: false });
    await rl.check(key, limit, { cost: 7 });
    const denied = await batcher.acquire(5); // 3 there: taken, then the top-up of 2 is denied with its retry
    assert.equal(denied.allowed, false);
    assert.ok(denied.retryAfterMs > 0);
    assert.equal(batcher.held, 3);
    assert.equal((await batcher.acquire(3)).allowed, true);
    assert.equal(await used(key, 10), 10);
  });

  test('sliding windows, sliding logs and policies are refused with a clear error', async () => {
    for (const limit of [
      { algorithm: 'window', limit: 10, period: '1m', sliding: true },
      { algorithm: 'slidinglog', limit: 10, period: '1m' },
      { algorithm: 'policy', name: 'p' },
    ]) {
      assert.throws(() => new TokenBatcher(rl, 'x', limit, { background: false }),
        (err) => err instanceof TypeError && /cannot be batched exactly|cannot batch/.test(err.message), JSON.stringify(limit));
    }
    await assert.rejects(new TokenBatcher(rl, 'x', window(10, '1m'), { background: false }).acquire(0), RangeError);
  });

  test('two processes, two connections each, 500 ms windows: no window admits more than its limit', async () => {
    // 100 per 500 ms. Demand alternates by window between 0.3 and 3 times the limit: a quiet window
    // ends with batches (of up to 30) still held, which the busy window after it must not spend.
    const report = await runScale([server.port], {
      mechanism: 'batching', cluster: false, processes: 2, clients: 2, callers: 3, rate: 150, pattern: 'alternate', lowFactor: 0.1,
      seconds: 2, limit: 100, periodMs: 500, maxBatch: 30, key: uniq('procs'),
    });
    assert.ok(report.fullWindows.length >= 2, 'the run covers whole windows');
    assert.deepEqual(report.over, {}, `windows over the limit of 100: ${JSON.stringify(report.admittedByWindow)}`);
    assert.ok(report.admitted > 0);
    assert.equal(report.stats.taken, report.admitted + report.stats.refunded + report.stats.dropped,
      'every unit taken was spent once, given back, or dropped');
  });
});
