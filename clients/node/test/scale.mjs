// Many client processes against one global fixed-window limit (used by
// batching.test.mjs on the single test server and scale.test.mjs on a
// cluster): fixtures/scale-worker.mjs in `processes` processes, started
// together, their admissions added up per window.
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Redis as Valkey } from 'iovalkey';

const run = promisify(execFile);
const WORKER = fileURLToPath(new URL('./fixtures/scale-worker.mjs', import.meta.url));

export const defaults = {
  mechanism: 'direct', processes: 3, clients: 2, callers: 4,
  // requests per second per client (the demand is processes * clients * rate)
  rate: 100, seconds: 2, limit: 200, periodMs: 1000, shards: 3, key: 'rl:scale', cluster: true,
  // 'steady', or 'alternate': every other window at lowFactor of the rate
  pattern: 'steady', lowFactor: 0.25,
};

/**
 * Runs the scenario against the servers at `ports`. The report: requests
 * sent, admissions per window (window number: epoch ms / periodMs), the
 * windows wholly inside the run, the batchers' own counts, and (with
 * `countCalls`) the servers' count of RL commands (INFO commandstats,
 * reset first: only for servers no other test uses at the same time).
 */
export async function runScale(ports, scenario, { countCalls = false } = {}) {
  const s = { ...defaults, ...scenario, ports };
  if (countCalls) await eachNode(ports, (c) => c.call('CONFIG', 'RESETSTAT'));
  s.start = Date.now() + 1000; // the processes start, connect, then wait for this moment
  const outcomes = await Promise.all(Array.from({ length: s.processes }, (_, seed) =>
    run(process.execPath, [WORKER, JSON.stringify({ ...s, seed })], { timeout: (s.seconds + 60) * 1000 })
      .then(({ stdout }) => JSON.parse(stdout))));
  const report = { scenario: s, requests: 0, admittedByWindow: {}, stats: { serverCalls: 0, taken: 0, refunded: 0, dropped: 0 } };
  for (const o of outcomes) {
    report.requests += o.requests;
    for (const [w, n] of Object.entries(o.admitted)) report.admittedByWindow[w] = (report.admittedByWindow[w] ?? 0) + n;
    for (const k of Object.keys(report.stats)) report.stats[k] += o.stats[k];
  }
  const first = Math.floor(s.start / s.periodMs) + 1;
  const last = Math.floor((s.start + s.seconds * 1000) / s.periodMs) - 1;
  report.fullWindows = Array.from({ length: Math.max(0, last - first + 1) }, (_, i) => String(first + i));
  report.admitted = Object.values(report.admittedByWindow).reduce((a, b) => a + b, 0);
  report.over = Object.fromEntries(Object.entries(report.admittedByWindow).filter(([, n]) => n > s.limit));
  if (countCalls) {
    const stats = await eachNode(ports, (c) => c.call('INFO', 'commandstats'));
    report.serverCalls = stats.reduce((sum, text) => sum
      + [...text.matchAll(/^cmdstat_rl\.[a-z.]+:calls=(\d+)/gm)].reduce((a, m) => a + Number(m[1]), 0), 0);
  }
  return report;
}

async function eachNode(ports, f) {
  return Promise.all(ports.map(async (port) => {
    const c = new Valkey({ host: '127.0.0.1', port });
    try { return await f(c); } finally { c.disconnect(); }
  }));
}
