// Proof on a real cluster: three primaries, three client processes of two
// connections and four concurrent callers each, one global limit of 100 per
// 500 ms fixed window, reached directly, through a deny cache, token batching
// and a split limit. Demand is three times the limit; for batching also a
// demand that alternates between a tenth of that and all of it, window by
// window, so batches are still held when a quiet window ends and the next
// window's demand would spend them. Whatever the mechanism, no window may
// admit more than the limit; batching and the deny cache must save calls.
// (Utilisation is not asserted: it depends on how fast this machine lets the
// processes send.)
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis as Valkey } from 'iovalkey';
import { keySlot, shardKeys } from '../dist/esm/index.js';
import { skipCluster, startCluster } from './cluster.mjs';
import { uniq } from './helpers.mjs';
import { runScale } from './scale.mjs';

const LIMIT = 100;
const common = { processes: 3, clients: 2, callers: 4, rate: 100, seconds: 2, limit: LIMIT, periodMs: 500, shards: 3, maxBatch: 30 };
const SCENARIOS = {
  'direct': { mechanism: 'direct' },
  'deny-cache': { mechanism: 'deny-cache' },
  'batching': { mechanism: 'batching' },
  'batching, alternating demand': { mechanism: 'batching', pattern: 'alternate', lowFactor: 0.1 },
  'split': { mechanism: 'split' },
  'split+deny-cache': { mechanism: 'split+deny-cache' },
};

describe('one global limit on a 3-primary cluster, many processes', { skip: skipCluster }, () => {
  let servers;
  const reports = {};

  before(async () => {
    servers = await startCluster(3);
    for (const [name, scenario] of Object.entries(SCENARIOS)) {
      reports[name] = await runScale(servers.ports, { ...common, ...scenario, key: uniq(scenario.mechanism) }, { countCalls: true });
    }
  });

  after(() => servers?.stop());

  test('the split keys live on three primaries (the server agrees on their slots)', async () => {
    const keys = shardKeys(uniq('split'), 3);
    const admin = new Valkey({ host: '127.0.0.1', port: servers.ports[0] });
    try {
      const ranges = await admin.call('CLUSTER', 'SLOTS');
      const owners = new Set();
      for (const key of keys) {
        const slot = Number(await admin.call('CLUSTER', 'KEYSLOT', key));
        assert.equal(slot, keySlot(key));
        const [, , [, port]] = ranges.find(([first, last]) => first <= slot && slot <= last);
        owners.add(port);
      }
      assert.equal(owners.size, 3);
    } finally {
      admin.disconnect();
    }
  });

  for (const name of Object.keys(SCENARIOS)) {
    test(`${name}: no window admits more than the limit`, () => {
      const report = reports[name];
      assert.ok(report.fullWindows.length >= 2, 'the run covers whole windows');
      assert.deepEqual(report.over, {}, `windows over the limit of ${LIMIT}: ${JSON.stringify(report.admittedByWindow)}`);
      assert.ok(report.admitted > 0);
    });
  }

  test('batching and the deny cache save server calls', (t) => {
    const calls = (name) => reports[name].serverCalls / Math.max(1, reports[name].admitted);
    const shown = Object.keys(SCENARIOS).map((n) => `${n}: ${calls(n).toFixed(2)}`).join(', ');
    for (const [name, r] of Object.entries(reports)) {
      const busiest = Math.max(...Object.values(r.admittedByWindow));
      t.diagnostic(`${name}: ${r.requests} requests, ${r.admitted} admitted, busiest window ${busiest}, ${calls(name).toFixed(3)} server calls per admitted`);
    }
    // Three times the limit: without help every request is a call, admitted or not.
    assert.ok(calls('direct') > 1.5, shown);
    assert.ok(calls('deny-cache') < calls('direct') / 1.5, shown);
    assert.ok(calls('split+deny-cache') < calls('split') / 1.5, shown);
    assert.ok(calls('batching') < 0.5, shown);
    for (const name of ['batching', 'batching, alternating demand']) {
      const { stats, admitted } = reports[name];
      assert.equal(stats.taken, admitted + stats.refunded + stats.dropped, `${name}: every unit taken was spent once, given back, or dropped`);
    }
  });
});
