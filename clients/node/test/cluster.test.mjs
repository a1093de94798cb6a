// Valkey Cluster: three primaries with the module (started and stopped
// here), reached through iovalkey's Cluster: the client routes each call,
// RL.ALL with keys of one slot (sameSlot), the express-rate-limit store
// (resetAll on every primary) and an atomic RateLimiterUnion (hashTag).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Cluster } from 'iovalkey';
import { RateLimitClient, RateLimitServerError, RateLimiterUnion, RateLimiterValkey, ValkeyStore, sameSlot } from '../dist/esm/index.js';
import { skipCluster, startCluster } from './cluster.mjs';
import { uniq } from './helpers.mjs';

describe('Valkey Cluster (3 primaries)', { skip: skipCluster }, () => {
  let servers, cluster, rl;

  before(async () => {
    servers = await startCluster(3);
    cluster = new Cluster([{ host: '127.0.0.1', port: servers.ports[0] }]);
    rl = new RateLimitClient(cluster, { timeoutMs: 3000 });
  });

  after(async () => {
    cluster?.disconnect();
    await servers?.stop();
  });

  test('calls are routed to the key\'s node', async () => {
    for (let i = 0; i < 20; i++) {
      const r = await rl.window(`cluster:${i}`, 2, '1d');
      assert.equal(r.allowed, true);
    }
    const masters = cluster.nodes('master');
    const counts = await Promise.all(masters.map((n) => n.dbsize()));
    assert.equal(counts.filter((n) => n > 0).length, 3, `keys on every primary: ${counts}`);
  });

  test('RL.ALL: keys of one slot work; keys of several slots are the server\'s CROSSSLOT', async () => {
    const keys = sameSlot(uniq('user'), 'rl:burst', 'rl:daily');
    const a = await rl.all(keys.map((key) => ({ key, limiter: { algorithm: 'window', limit: 5, period: '1m' } })));
    assert.equal(a.allowed, true);
    await assert.rejects(
      rl.all(['a1', 'b2', 'c3'].map((key) => ({ key, limiter: { algorithm: 'window', limit: 5, period: '1m' } }))),
      (err) => err instanceof RateLimitServerError && err.code === 'CROSSSLOT',
    );
  });

  test('ValkeyStore: increment, get, resetAll on every primary', async () => {
    const store = new ValkeyStore({ client: cluster, prefix: `${uniq('erl')}:` });
    store.init({ windowMs: 86_400_000, limit: 3 });
    for (let i = 0; i < 30; i++) await store.increment(`ip${i}`);
    assert.equal((await store.increment('ip0')).totalHits, 2);
    await store.resetAll();
    for (let i = 0; i < 30; i++) assert.equal(await store.get(`ip${i}`), undefined);
  });

  test('RateLimiterUnion with hashTag is atomic in Cluster', async () => {
    const a = new RateLimiterValkey({ storeClient: cluster, keyPrefix: uniq('a'), points: 1, duration: 60, hashTag: true });
    const b = new RateLimiterValkey({ storeClient: a.client, keyPrefix: uniq('b'), points: 5, duration: 60, hashTag: true });
    const union = new RateLimiterUnion(a, b);
    await union.consume('user');
    await assert.rejects(union.consume('user'), (rej) => Object.keys(rej).length === 1 && rej[a.keyPrefix] instanceof Object);
    assert.equal((await b.get('user')).consumedPoints, 1);
  });
});
