// Server calls per admitted request with and without each client-side
// mechanism (docs/scale.md): client processes of several connections and
// concurrent callers against one fixed-window limit on one server, through
// the test suite's worker (test/fixtures/scale-worker.mjs). Run by bench.sh:
//
//   clients/node/bench.sh scale [--seconds 4] [--limit 200] [--period-ms 1000]
//
// Server calls are the server's own count of RL commands (INFO commandstats,
// refunds included); utilisation is admitted per whole window over the limit.
import { parseArgs } from 'node:util';
import { runScale } from '../test/scale.mjs';

const { values: opt } = parseArgs({
  options: {
    seconds: { type: 'string', default: '4' }, limit: { type: 'string', default: '200' },
    'period-ms': { type: 'string', default: '1000' }, processes: { type: 'string', default: '3' },
    clients: { type: 'string', default: '2' }, callers: { type: 'string', default: '4' },
  },
});
const [, port] = (process.env.RL_TEST_VALKEY_ADDR ?? '127.0.0.1:6379').split(':');
const base = {
  cluster: false, seconds: Number(opt.seconds), limit: Number(opt.limit), periodMs: Number(opt['period-ms']),
  processes: Number(opt.processes), clients: Number(opt.clients), callers: Number(opt.callers), shards: 3,
};
const senders = base.processes * base.clients;
const rateFor = (demand) => (demand * base.limit * 1000) / base.periodMs / senders;

console.log(`${base.processes} processes x ${base.clients} connections x ${base.callers} callers, limit ${base.limit} per ${base.periodMs} ms window, ${base.seconds} s per run, one server\n`);
console.log('| demand | mechanism | utilisation | server calls per admitted | busiest window | requests |');
console.log('|---:|---|---:|---:|---:|---:|');
for (const demand of [1.2, 3]) {
  for (const mechanism of ['direct', 'deny-cache', 'batching', 'split', 'split+deny-cache']) {
    const r = await runScale([Number(port)], { ...base, mechanism, rate: rateFor(demand), key: `bench:scale:${Date.now()}:${mechanism}` }, { countCalls: true });
    const full = r.fullWindows.reduce((n, w) => n + (r.admittedByWindow[w] ?? 0), 0);
    const utilisation = full / (r.fullWindows.length * base.limit);
    const busiest = Math.max(...Object.values(r.admittedByWindow));
    console.log(`| ${demand}x | ${mechanism} | ${utilisation.toFixed(3)} | ${(r.serverCalls / Math.max(1, r.admitted)).toFixed(3)} | ${busiest} | ${r.requests} |`);
  }
}
