// Valkey Cluster: three primaries with the module (started and stopped
// here), reached through iovalkey's Cluster: the client routes each call,
// RL.ALL with keys of one slot (sameSlot), the express-rate-limit store
// (resetAll on every primary) and an atomic RateLimiterUnion (hashTag).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Cluster, Redis as Valkey } from 'iovalkey';
import { RateLimitClient, RateLimitServerError, RateLimiterUnion, RateLimiterValkey, ValkeyStore, sameSlot } from '../dist/esm/index.js';
import { sleep, uniq } from './helpers.mjs';

const SERVER = process.env.VALKEY_SERVER;
const MODULE = process.env.RL_MODULE;

async function freePort() {
  const s = net.createServer().listen(0, '127.0.0.1');
  await new Promise((r) => s.once('listening', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

const listening = (port) => new Promise((resolve) => {
  const sock = net.connect(port, '127.0.0.1', () => { sock.destroy(); resolve(true); });
  sock.on('error', () => resolve(false));
});

describe('Valkey Cluster (3 primaries)', { skip: !SERVER || !MODULE ? 'VALKEY_SERVER and RL_MODULE are not set' : false }, () => {
  const nodes = [];
  let dir, cluster, rl;

  before(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'rl-node-cluster-'));
    for (let i = 0; i < 3; i++) {
      const port = await freePort();
      const proc = spawn(SERVER, ['--bind', '127.0.0.1', '--port', String(port), '--cluster-enabled', 'yes',
        '--cluster-config-file', path.join(dir, `nodes-${port}.conf`), '--save', '', '--appendonly', 'no',
        '--dir', dir, '--loadmodule', MODULE], { stdio: 'ignore' });
      nodes.push({ port, proc });
    }
    const admin = [];
    for (const { port, proc } of nodes) {
      for (let t = 0; !(await listening(port)); t++) {
        if (t > 100 || proc.exitCode !== null) throw new Error(`valkey-server on ${port} did not start`);
        await sleep(100);
      }
      admin.push(new Valkey({ host: '127.0.0.1', port }));
    }
    const ranges = [[0, 5460], [5461, 10922], [10923, 16383]];
    for (let i = 0; i < 3; i++) await admin[i].call('CLUSTER', 'ADDSLOTSRANGE', ranges[i][0], ranges[i][1]);
    for (let i = 1; i < 3; i++) await admin[0].call('CLUSTER', 'MEET', '127.0.0.1', nodes[i].port);
    for (let t = 0; ; t++) {
      const states = await Promise.all(admin.map((c) => c.call('CLUSTER', 'INFO')));
      if (states.every((s) => /cluster_state:ok/.test(s) && /cluster_known_nodes:3/.test(s))) break;
      if (t > 200) throw new Error('the cluster did not come up');
      await sleep(100);
    }
    for (const c of admin) c.disconnect();
    cluster = new Cluster([{ host: '127.0.0.1', port: nodes[0].port }]);
    rl = new RateLimitClient(cluster, { timeoutMs: 3000 });
  });

  after(async () => {
    cluster?.disconnect();
    for (const { proc } of nodes) proc.kill();
    await Promise.all(nodes.map(({ proc }) => (proc.exitCode === null ? new Promise((r) => proc.once('exit', r)) : null)));
    await rm(dir, { recursive: true, force: true });
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
